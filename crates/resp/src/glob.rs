//! Redis's glob patterns (`SCAN MATCH`, `CONFIG GET`): `*`, `?`, `[abc]`,
//! `[^a-z]`, and `\` to escape, matched byte by byte as `stringmatchlen` does.

/// Whether `text` matches `pattern` (case-sensitive unless `nocase`).
pub fn matches(pattern: &[u8], text: &[u8], nocase: bool) -> bool {
    // Iterative with one back-track point for the last `*`: linear in
    // practice and never recursive, so a hostile pattern cannot blow the stack.
    let eq = |a: u8, b: u8| {
        if nocase {
            a.eq_ignore_ascii_case(&b)
        } else {
            a == b
        }
    };
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    while p < pattern.len() && pattern[p] == b'*' {
                        p += 1;
                    }
                    if p == pattern.len() {
                        return true;
                    }
                    star = Some((p, t));
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    let (hit, next) = class(pattern, p, text[t], nocase);
                    if hit {
                        p = next;
                        t += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pattern.len() => {
                    if eq(pattern[p + 1], text[t]) {
                        p += 2;
                        t += 1;
                        continue;
                    }
                }
                c => {
                    if eq(c, text[t]) {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
            }
        }
        // Mismatch: let the last `*` swallow one more byte, or fail.
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Match `c` against the class starting at `pattern[p] == '['`: whether it
/// matched and where the pattern continues. An unclosed class runs to the
/// end of the pattern (as in Redis).
fn class(pattern: &[u8], p: usize, c: u8, nocase: bool) -> (bool, usize) {
    let mut i = p + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let fold = |b: u8| if nocase { b.to_ascii_lowercase() } else { b };
    let c = fold(c);
    let mut hit = false;
    while i < pattern.len() && pattern[i] != b']' {
        if pattern[i] == b'\\' && i + 1 < pattern.len() {
            hit |= fold(pattern[i + 1]) == c;
            i += 2;
        } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' && pattern[i + 2] != b']' {
            let (mut lo, mut hi) = (fold(pattern[i]), fold(pattern[i + 2]));
            if lo > hi {
                std::mem::swap(&mut lo, &mut hi);
            }
            hit |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            hit |= fold(pattern[i]) == c;
            i += 1;
        }
    }
    let next = (i + 1).min(pattern.len());
    (hit != negate, next)
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn redis_glob_cases() {
        let yes =
            |p: &str, t: &str| assert!(matches(p.as_bytes(), t.as_bytes(), false), "{p} ~ {t}");
        let no =
            |p: &str, t: &str| assert!(!matches(p.as_bytes(), t.as_bytes(), false), "{p} !~ {t}");
        yes("*", "");
        yes("*", "anything");
        yes("h?llo", "hello");
        yes("h*llo", "heeeello");
        yes("h[ae]llo", "hallo");
        no("h[ae]llo", "hillo");
        yes("h[^e]llo", "hallo");
        no("h[^e]llo", "hello");
        yes("h[a-b]llo", "hbllo");
        yes("user:*:name", "user:42:name");
        no("user:*:name", "user:42:mail");
        yes("a\\*b", "a*b");
        no("a\\*b", "axb");
        yes("*a*b*c*", "xxaxxbxxcxx");
        no("*a*b*c*", "xxaxxcxxbxx");
        assert!(matches(b"SAVE", b"save", true));
    }
}
