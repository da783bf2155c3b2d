//! JSON paths and literals: how a plan names a value inside the JSON
//! document an untyped object holds (`$.address.city`, `$.tags[0]`) and
//! what it compares it with. Plain data; parsing the path text and reading
//! documents is `insitu-compute`'s job (`json.rs`, `json_doc.rs`).
//!
//! Bounded at decode (`limits.rs`): at most [`MAX_JSON_PATH_STEPS`] steps,
//! each key and the keys together at most [`MAX_JSON_PATH_BYTES`] bytes, a
//! string literal at most [`MAX_JSON_STR_BYTES`], each refused before it is
//! allocated.

use serde::{Deserialize, Serialize};

use crate::message::Number;

/// Most steps a JSON path may have. Why 16: documents nest deeper, but a
/// path names a field a user reads; it also bounds the walk's recursion.
pub const MAX_JSON_PATH_STEPS: usize = 16;
/// Most bytes of a path's text (as written) and of its keys together.
pub const MAX_JSON_PATH_BYTES: usize = 256;
/// Most bytes of a string a JSON comparison carries. Why 64 KiB: the same
/// bound as a key-range bound; far above any key or name compared with.
pub const MAX_JSON_STR_BYTES: usize = 64 * 1024;

/// One step of a path: a member of an object or an element of an array.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub enum JsonStep {
    /// `.key` or `["key"]`: the member named so (the last, if repeated).
    Key(#[serde(deserialize_with = "crate::limits::json_key")] String),
    /// `[N]`: the element at index N (from 0).
    Index(u32),
}

/// `$` followed by steps; no steps = the whole document.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct JsonPath {
    /// From the document's root down; bounded at decode (see the module doc).
    #[serde(deserialize_with = "crate::limits::json_steps")]
    pub steps: Vec<JsonStep>,
}

impl JsonPath {
    /// Bytes of its keys together (the decode limit's measure).
    pub fn key_bytes(&self) -> usize {
        self.steps
            .iter()
            .map(|s| match s {
                JsonStep::Key(k) => k.len(),
                JsonStep::Index(_) => 0,
            })
            .sum()
    }
}

/// Whether `c` may appear in a key written `.key` (others need `["key"]`).
/// Shared by the rendering below and the parser in `insitu-compute`.
pub fn is_plain_key_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '-'
}

/// The canonical text: `.key` where every character allows it, else
/// `["key"]` with JSON string escapes; `[N]` for an index.
impl std::fmt::Display for JsonPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("$")?;
        for step in &self.steps {
            match step {
                JsonStep::Index(i) => write!(f, "[{i}]")?,
                JsonStep::Key(k) if !k.is_empty() && k.chars().all(is_plain_key_char) => {
                    write!(f, ".{k}")?
                }
                JsonStep::Key(k) => {
                    f.write_str("[")?;
                    write_json_string(f, k)?;
                    f.write_str("]")?;
                }
            }
        }
        Ok(())
    }
}

/// `s` as a JSON string literal (quotes, backslashes and control
/// characters escaped).
pub fn write_json_string(f: &mut impl std::fmt::Write, s: &str) -> std::fmt::Result {
    f.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\t' => f.write_str("\\t")?,
            '\r' => f.write_str("\\r")?,
            c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
            c => f.write_char(c)?,
        }
    }
    f.write_char('"')
}

/// What a JSON value is compared with. A value of another kind (or none)
/// makes the comparison unknown, like SQL's NULL.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum JsonLit {
    /// Compared with JSON numbers (exactly between integers).
    Num(Number),
    /// Compared with JSON strings, bytewise.
    Str(#[serde(deserialize_with = "crate::limits::json_str")] String),
    /// Compared with `true` / `false` (`=` and `<>` only).
    Bool(bool),
}

impl std::fmt::Display for JsonLit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JsonLit::Num(Number::I64(v)) => write!(f, "{v}"),
            JsonLit::Num(Number::F64(v)) => write!(f, "{v}"),
            JsonLit::Str(s) => {
                // The `--where` language's quoting: '' is one quote.
                write!(f, "'{}'", s.replace('\'', "''"))
            }
            JsonLit::Bool(b) => write!(f, "{b}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(steps: Vec<JsonStep>) -> JsonPath {
        JsonPath { steps }
    }

    #[test]
    fn paths_render_canonically() {
        let p = path(vec![
            JsonStep::Key("address".into()),
            JsonStep::Key("first name".into()),
            JsonStep::Index(3),
            JsonStep::Key("q\"\\\u{1}".into()),
            JsonStep::Key(String::new()),
            JsonStep::Key("é-1_x".into()),
        ]);
        assert_eq!(
            p.to_string(),
            r#"$.address["first name"][3]["q\"\\\u0001"][""].é-1_x"#
        );
        assert_eq!(JsonPath::default().to_string(), "$");
        assert_eq!(p.key_bytes(), 7 + 10 + 4 + 6);
    }

    #[test]
    fn paths_decode_within_their_limits_only() {
        use crate::plan::{CmpOp, PredOp};
        let ok = PredOp::JsonCmp {
            path: path(vec![JsonStep::Key("k".repeat(MAX_JSON_PATH_BYTES))]),
            op: CmpOp::Eq,
            value: JsonLit::Str("s".repeat(MAX_JSON_STR_BYTES)),
        };
        let bytes = postcard::to_stdvec(&ok).unwrap();
        assert_eq!(postcard::from_bytes::<PredOp>(&bytes).unwrap(), ok);
        let bad = [
            // one key too long
            path(vec![JsonStep::Key("k".repeat(MAX_JSON_PATH_BYTES + 1))]),
            // keys too long together
            path(vec![JsonStep::Key("k".repeat(200)); 2]),
            // too many steps
            path(vec![JsonStep::Index(0); MAX_JSON_PATH_STEPS + 1]),
        ];
        for p in bad {
            let bytes = postcard::to_stdvec(&p).unwrap();
            assert!(postcard::from_bytes::<JsonPath>(&bytes).is_err(), "{p}");
        }
        let long = JsonLit::Str("s".repeat(MAX_JSON_STR_BYTES + 1));
        let bytes = postcard::to_stdvec(&long).unwrap();
        assert!(postcard::from_bytes::<JsonLit>(&bytes).is_err());
    }

    #[test]
    fn an_over_long_path_is_refused_before_it_is_read() {
        // A claimed key of 4 GiB: refused by its length, nothing allocated.
        let mut bytes = vec![1u8]; // one step
        bytes.push(0); // JsonStep::Key
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(postcard::from_bytes::<JsonPath>(&bytes).is_err());
        // A claimed 2^32 steps.
        let bytes = [0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(postcard::from_bytes::<JsonPath>(&bytes).is_err());
    }
}
