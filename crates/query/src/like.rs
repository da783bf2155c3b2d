//! LIKE patterns as regular expressions (anchored unless the pattern starts
//! or ends with `%`), and every regular
//! expression of a plan built with the same size limits.

use insitu_protocol::query::MAX_PATTERN_BYTES;

/// Bytes a compiled regex (and its lazy DFA) may take. Why 1 MiB: enough for
/// any reasonable pattern, and a hostile one (`a{1000}{1000}`) is refused
/// when compiled instead of taking a server's memory.
pub const REGEX_SIZE_LIMIT_BYTES: usize = 1 << 20;

/// A LIKE pattern's pieces.
#[derive(Clone, Copy, PartialEq)]
enum Tok {
    /// `%`: any run of characters.
    Any,
    /// `_`: one character.
    One,
    /// A character matched as itself (escaped or not).
    Lit(char),
}

/// The regex that matches exactly what SQL `LIKE pattern` matches: `%` any
/// run of characters, `_` one character, `\x` the character x itself;
/// anything else literally. Anchored at both ends, except that a leading
/// (trailing) run of `%` drops the start (end) anchor instead of becoming
/// `.*`; `.` also matches a newline. Why: `%word%` (which DataFusion also
/// makes of `col ~ 'word'`) is then the bare literal, searched with the
/// regex crate's substring finder; as `\A.*word.*\z` it ran the lazy DFA
/// over every byte (TPC-H-shaped regex scan: about half its time).
pub fn like_to_regex(pattern: &str) -> Result<String, String> {
    let mut toks = Vec::with_capacity(pattern.len());
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        toks.push(match c {
            '%' => Tok::Any,
            '_' => Tok::One,
            '\\' => match chars.next() {
                Some(e) => Tok::Lit(e),
                None => {
                    return Err(format!(
                        "LIKE pattern {pattern:?} ends with the escape character \\"
                    ));
                }
            },
            c => Tok::Lit(c),
        });
    }
    let lead = toks.iter().take_while(|t| **t == Tok::Any).count();
    let trail = toks[lead..]
        .iter()
        .rev()
        .take_while(|t| **t == Tok::Any)
        .count();
    let mut out = String::with_capacity(pattern.len() * 2 + 12);
    out.push_str("(?s)");
    if lead == 0 {
        out.push_str("\\A");
    }
    out.push_str("(?:");
    for t in &toks[lead..toks.len() - trail] {
        match t {
            Tok::Any => out.push_str(".*"),
            Tok::One => out.push('.'),
            Tok::Lit(c) => out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
        }
    }
    out.push(')');
    // A pattern of `%`s alone matches everything: no anchor at all.
    let only_any = lead > 0 && lead == toks.len();
    if trail == 0 && !only_any {
        out.push_str("\\z");
    }
    Ok(out)
}

/// A regex over bytes (text columns are read as bytes: no UTF-8 re-check per
/// row), with the size limits above. `what` names the pattern in errors.
pub fn build(
    regex_text: &str,
    case_insensitive: bool,
    what: &str,
) -> Result<regex::bytes::Regex, String> {
    regex::bytes::RegexBuilder::new(regex_text)
        .case_insensitive(case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT_BYTES)
        .dfa_size_limit(REGEX_SIZE_LIMIT_BYTES)
        .nest_limit(100)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(limit) => {
                format!("{what} is too complex (its compiled form exceeds {limit} bytes)")
            }
            e => format!("{what} is not a valid regular expression: {e}"),
        })
}

/// Check a pattern's length before anything is built from it.
pub fn check_length(pattern: &str, what: &str) -> Result<(), String> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!(
            "{what} has {} bytes, more than the limit of {MAX_PATTERN_BYTES}",
            pattern.len()
        ));
    }
    Ok(())
}

/// The compiled matcher of `LIKE`/`ILIKE` `pattern`.
pub fn like(pattern: &str, case_insensitive: bool) -> Result<regex::bytes::Regex, String> {
    let what = format!("LIKE pattern {pattern:?}");
    check_length(pattern, &what)?;
    build(&like_to_regex(pattern)?, case_insensitive, &what)
}

/// The compiled matcher of a `~` regex (found anywhere in the text).
pub fn regex(pattern: &str, case_insensitive: bool) -> Result<regex::bytes::Regex, String> {
    let what = format!("regular expression {pattern:?}");
    check_length(pattern, &what)?;
    build(pattern, case_insensitive, &what)
}
