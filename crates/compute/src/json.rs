//! JSON paths as text and comparisons of what they find.
//!
//! A path is `$` followed by steps: `.key` (letters, digits, `_` and `-`),
//! `["any key"]` (a JSON string: `\"`, `\\`, `\u00e9` ... escapes) or `[N]`
//! (an array element, from 0): `$.address.city`, `$.tags[0]`,
//! `$["first name"]`. At most `MAX_JSON_PATH_STEPS` steps and
//! `MAX_JSON_PATH_BYTES` bytes of text.
//!
//! A comparison of the value at a path with a literal is true or false when
//! the value is of the literal's kind (a number with a number, exactly
//! between integers; a string with a string, bytewise; a boolean with
//! `true`/`false`, `=` and `<>` only), and unknown otherwise: no JSON, no
//! such path, `null`, or another kind (SQL's NULL; see `predicate.rs`).

use insitu_protocol::json_path::{
    MAX_JSON_PATH_BYTES, MAX_JSON_PATH_STEPS, MAX_JSON_STR_BYTES, is_plain_key_char,
};
use insitu_protocol::plan::{CmpOp, JsonLit, JsonPath, JsonStep};

use crate::field::{compare, holds};
use crate::json_doc::JsonValue;

/// Parse a whole path like `$.address.city` (surrounding spaces allowed).
pub fn parse_path(text: &str) -> Result<JsonPath, String> {
    let t = text.trim();
    let (path, used) = parse_path_prefix(t).map_err(|(at, e)| bad(t, at, &e))?;
    if used < t.len() {
        let ch = t[used..].chars().next().unwrap_or('?');
        return Err(bad(t, used, &format!("unexpected {ch:?}")));
    }
    Ok(path)
}

fn bad(text: &str, at: usize, e: &str) -> String {
    format!("bad JSON path {text:?}: at byte {}: {e}", at + 1)
}

/// The path at the start of `src` and the bytes it takes; or the byte
/// offset of the problem and what it is. The path ends at the first byte
/// that cannot continue it (a space, an operator); a key character or a
/// quote right after it is an error (`$age`, `$.a'b'`).
pub fn parse_path_prefix(src: &str) -> Result<(JsonPath, usize), (usize, String)> {
    let b = src.as_bytes();
    if b.first() != Some(&b'$') {
        return Err((0, "a JSON path starts with $, e.g. $.age".into()));
    }
    let mut steps = Vec::new();
    let mut i = 1;
    loop {
        if i > MAX_JSON_PATH_BYTES {
            return Err((i, format!("longer than {MAX_JSON_PATH_BYTES} bytes")));
        }
        let step = match b.get(i) {
            Some(b'.') => {
                let key: String = src[i + 1..]
                    .chars()
                    .take_while(|&c| is_plain_key_char(c))
                    .collect();
                if key.is_empty() {
                    return Err((
                        i + 1,
                        "expected a key after \".\" (other keys go in brackets: $[\"first name\"])"
                            .into(),
                    ));
                }
                i += 1 + key.len();
                JsonStep::Key(key)
            }
            Some(b'[') => {
                let (step, used) = bracket(&src[i..]).map_err(|(at, e)| (i + at, e))?;
                i += used;
                step
            }
            _ => break,
        };
        steps.push(step);
        if steps.len() > MAX_JSON_PATH_STEPS {
            return Err((i, format!("more than {MAX_JSON_PATH_STEPS} steps")));
        }
    }
    if i > MAX_JSON_PATH_BYTES {
        return Err((i, format!("longer than {MAX_JSON_PATH_BYTES} bytes")));
    }
    match src[i..].chars().next() {
        Some(c) if is_plain_key_char(c) || c == '\'' || c == '"' => Err((
            i,
            format!("unexpected {c:?}: write $.key, $[\"key\"] or $[N]"),
        )),
        _ => Ok((JsonPath { steps }, i)),
    }
}

/// `["key"]` or `[N]` at the start of `s`, and the bytes it takes.
fn bracket(s: &str) -> Result<(JsonStep, usize), (usize, String)> {
    let b = s.as_bytes();
    let (step, end) = match b.get(1) {
        Some(b'"') => {
            // The closing quote: the first one not escaped by a backslash.
            let mut j = 2;
            loop {
                match b.get(j) {
                    None => return Err((1, "the quoted key has no closing \"".into())),
                    Some(b'\\') => j += 2,
                    Some(b'"') => break,
                    Some(_) => j += 1,
                }
            }
            // JSON's own escapes, read by the JSON reader the values use.
            let key: String =
                serde_json::from_str(&s[1..=j]).map_err(|e| (1, format!("bad quoted key: {e}")))?;
            (JsonStep::Key(key), j + 1)
        }
        Some(c) if c.is_ascii_digit() => {
            let digits = b[1..].iter().take_while(|c| c.is_ascii_digit()).count();
            let text = &s[1..1 + digits];
            let n: u32 = text.parse().map_err(|_| {
                (
                    1,
                    format!("array index {text} is too large (at most {})", u32::MAX),
                )
            })?;
            (JsonStep::Index(n), 1 + digits)
        }
        Some(b'\'') => {
            return Err((1, "keys in brackets are double-quoted: [\"key\"]".into()));
        }
        _ => {
            return Err((
                1,
                "expected a \"quoted key\" or an array index after \"[\"".into(),
            ));
        }
    };
    if b.get(end) != Some(&b']') {
        return Err((end, "expected \"]\"".into()));
    }
    Ok((step, end + 1))
}

/// A path built in code (or decoded) within the limits the wire enforces.
pub fn check_path(path: &JsonPath) -> Result<(), String> {
    if path.steps.len() > MAX_JSON_PATH_STEPS {
        return Err(format!(
            "JSON path {path} has {} steps, more than {MAX_JSON_PATH_STEPS}",
            path.steps.len()
        ));
    }
    if path.key_bytes() > MAX_JSON_PATH_BYTES {
        return Err(format!(
            "JSON path keys are {} bytes together, more than {MAX_JSON_PATH_BYTES}",
            path.key_bytes()
        ));
    }
    Ok(())
}

/// A comparison a plan may carry: booleans compare with `=` and `<>` only,
/// strings are bounded.
pub fn check_cmp(path: &JsonPath, op: CmpOp, lit: &JsonLit) -> Result<(), String> {
    check_path(path)?;
    match lit {
        JsonLit::Bool(_) if !matches!(op, CmpOp::Eq | CmpOp::Ne) => {
            Err(format!("{path}: true and false compare with = or <> only"))
        }
        JsonLit::Str(s) if s.len() > MAX_JSON_STR_BYTES => Err(format!(
            "{path}: a string of {} bytes, more than {MAX_JSON_STR_BYTES}",
            s.len()
        )),
        _ => Ok(()),
    }
}

/// `value OP lit`: `None` (unknown) unless the value is of the literal's kind.
#[inline]
pub fn compare_json(value: JsonValue<'_>, op: CmpOp, lit: &JsonLit) -> Option<bool> {
    match (value, lit) {
        (JsonValue::Num(v), JsonLit::Num(c)) => Some(compare(v, op, *c)),
        (JsonValue::Str(v), JsonLit::Str(c)) => Some(holds(v.as_bytes().cmp(c.as_bytes()), op)),
        (JsonValue::Bool(v), JsonLit::Bool(c)) => Some(holds(v.cmp(c), op)),
        _ => None,
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
