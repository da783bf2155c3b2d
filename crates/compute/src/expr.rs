//! The small expression language of `--where` filters and field specs,
//! parsed into the plan types a scan carries (shared by the CLI and the
//! Python client, so both accept exactly the same text).
//!
//! Fields name a little-endian number at a byte offset of a raw value:
//! `i32@4`, `i64@0`, `f64@8`, `u8@16` (a byte); or a value inside a JSON
//! document by its path (`$.age`, `$.address.city`, `$.tags[0]`,
//! `$["first name"]`; see `json.rs`). Expressions:
//!
//! ```text
//! expr  := and ("or" and)*
//! and   := unary ("and" unary)*
//! unary := "not" unary | "(" expr ")" | field cmp number
//!        | field "between" number "and" number
//!        | path cmp (number | string | "true" | "false")
//!        | path "between" number "and" number
//! cmp   := "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
//! string := "'" (any character, '' for a quote)* "'"
//! ```
//! e.g. `i64@0 > 5 and (f64@8 between 1.5 and 2 or not i32@16 = 3)`, or
//! `$.age > 30 and $.name <> 'bob'`. A path without a value of the
//! literal's kind makes its comparison unknown (SQL's NULL; `not` keeps it
//! unknown, see `predicate.rs`); `between` on a path is `>= lo and <= hi`.
//! Errors are messages naming what was wrong (and the column, for `--where`).

use insitu_protocol::Number;
use insitu_protocol::plan::{CmpOp, Field, JsonLit, JsonPath, PredOp};

use crate::json::parse_path_prefix;
use crate::predicate::MAX_PRED_DEPTH;

/// Parse a field like `i64@0`.
pub fn parse_field(s: &str) -> Result<Field, String> {
    let s = s.trim();
    let Some((kind, off)) = s.split_once('@') else {
        return Err(format!(
            "bad field {s:?}: write TYPE@OFFSET, e.g. i64@0 (types: i32, i64, f64, u8)"
        ));
    };
    let off: u32 = off
        .parse()
        .map_err(|_| format!("bad field {s:?}: offset {off:?} is not a byte offset"))?;
    Ok(match kind {
        "i32" => Field::I32(off),
        "i64" => Field::I64(off),
        "f64" => Field::F64(off),
        "u8" => Field::U8(off),
        other => {
            return Err(format!(
                "bad field {s:?}: unknown type {other:?} (types: i32, i64, f64, u8)"
            ));
        }
    })
}

/// Parse a number: an integer stays an integer, anything else is an f64.
pub fn parse_number(s: &str) -> Result<Number, String> {
    if let Ok(i) = s.parse::<i64>() {
        return Ok(Number::I64(i));
    }
    if s.bytes()
        .all(|b| b.is_ascii_digit() || b == b'-' || b == b'+')
        && s.parse::<i128>().is_ok()
    {
        return Err(format!(
            "{s:?} is out of range: integers must be in {}..={}",
            i64::MIN,
            i64::MAX
        ));
    }
    match s.parse::<f64>() {
        // `1e400` parses as infinity: a number, but not one a field can hold.
        Ok(f) if f.is_finite() => Ok(Number::F64(f)),
        Ok(_) => Err(format!("{s:?} is not a finite number")),
        _ => Err(format!("{s:?} is not a number")),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Word(String),
    Num(String),
    Op(&'static str),
    LParen,
    RParen,
    /// `$...`: a JSON path.
    Path(JsonPath),
    /// `'...'` with `''` read as one quote.
    Str(String),
}

fn tokenize(src: &str) -> Result<Vec<(usize, Tok)>, String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'@') {
                i += 1;
            }
            out.push((start, Tok::Word(src[start..i].to_string())));
            continue;
        }
        if c.is_ascii_digit() || c == b'-' || c == b'+' || c == b'.' {
            i += 1;
            while i < b.len()
                && (b[i].is_ascii_alphanumeric()
                    || b[i] == b'.'
                    || ((b[i] == b'-' || b[i] == b'+') && matches!(b[i - 1], b'e' | b'E')))
            {
                i += 1;
            }
            out.push((start, Tok::Num(src[start..i].to_string())));
            continue;
        }
        if c == b'$' {
            let (path, used) = parse_path_prefix(&src[i..])
                .map_err(|(at, e)| format!("at column {}: bad JSON path: {e}", i + at + 1))?;
            out.push((start, Tok::Path(path)));
            i += used;
            continue;
        }
        if c == b'\'' {
            let (text, used) = quoted(&src[i..])
                .ok_or_else(|| format!("at column {}: the string has no closing '", i + 1))?;
            out.push((start, Tok::Str(text)));
            i += used;
            continue;
        }
        let two = src.get(i..i + 2).unwrap_or("");
        let op = match two {
            "==" => Some("="),
            "!=" | "<>" => Some("!="),
            "<=" => Some("<="),
            ">=" => Some(">="),
            _ => None,
        };
        if let Some(op) = op {
            out.push((start, Tok::Op(op)));
            i += 2;
            continue;
        }
        let tok = match c {
            b'=' => Tok::Op("="),
            b'<' => Tok::Op("<"),
            b'>' => Tok::Op(">"),
            b'(' => Tok::LParen,
            b')' => Tok::RParen,
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(format!("at column {}: unexpected character {ch:?}", i + 1));
            }
        };
        out.push((start, tok));
        i += 1;
    }
    Ok(out)
}

/// The `'...'` string at the start of `s` (`''` is one quote) and the
/// bytes it takes; `None` if it does not end.
fn quoted(s: &str) -> Option<(String, usize)> {
    let mut text = String::new();
    let mut rest = &s[1..];
    loop {
        let end = rest.find('\'')?;
        text.push_str(&rest[..end]);
        rest = &rest[end + 1..];
        if let Some(after) = rest.strip_prefix('\'') {
            text.push('\'');
            rest = after;
        } else {
            return Some((text, s.len() - rest.len()));
        }
    }
}

struct Parser {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    len: usize,
    out: Vec<PredOp>,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.1)
    }
    fn col(&self) -> usize {
        self.toks.get(self.pos).map_or(self.len, |t| t.0) + 1
    }
    fn err<T>(&self, what: &str) -> Result<T, String> {
        let found = match self.peek() {
            None => "the end".to_string(),
            Some(Tok::Word(w) | Tok::Num(w)) => format!("{w:?}"),
            Some(Tok::Op(o)) => format!("{o:?}"),
            Some(Tok::LParen) => "\"(\"".into(),
            Some(Tok::RParen) => "\")\"".into(),
            Some(Tok::Path(p)) => format!("{:?}", p.to_string()),
            Some(Tok::Str(t)) => format!("the string {:?}", t),
        };
        Err(format!(
            "at column {}: expected {what}, found {found}",
            self.col()
        ))
    }
    fn keyword(&mut self, k: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Word(w)) if w.eq_ignore_ascii_case(k)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn or(&mut self, depth: usize) -> Result<(), String> {
        self.and(depth)?;
        while self.keyword("or") {
            self.and(depth)?;
            self.out.push(PredOp::Or);
        }
        Ok(())
    }
    fn and(&mut self, depth: usize) -> Result<(), String> {
        self.unary(depth)?;
        while self.keyword("and") {
            self.unary(depth)?;
            self.out.push(PredOp::And);
        }
        Ok(())
    }
    fn unary(&mut self, depth: usize) -> Result<(), String> {
        if depth > MAX_PRED_DEPTH {
            return Err(format!(
                "at column {}: expression nested too deeply",
                self.col()
            ));
        }
        if self.keyword("not") {
            self.unary(depth + 1)?;
            self.out.push(PredOp::Not);
            return Ok(());
        }
        if self.peek() == Some(&Tok::LParen) {
            self.pos += 1;
            self.or(depth + 1)?;
            if self.peek() != Some(&Tok::RParen) {
                return self.err("\")\"");
            }
            self.pos += 1;
            return Ok(());
        }
        let field = match self.peek() {
            Some(Tok::Word(w)) if w.contains('@') => {
                let f = parse_field(w).map_err(|e| format!("at column {}: {e}", self.col()))?;
                self.pos += 1;
                f
            }
            Some(Tok::Path(p)) => {
                let path = p.clone();
                self.pos += 1;
                return self.json(path);
            }
            _ => return self.err("a field like i64@0 or $.key, \"not\" or \"(\""),
        };
        if self.keyword("between") {
            let lo = self.number()?;
            if !self.keyword("and") {
                return self.err("\"and\" of between");
            }
            let hi = self.number()?;
            self.out.push(PredOp::Between { field, lo, hi });
            return Ok(());
        }
        let op = self.cmp_op()?;
        let value = self.number()?;
        self.out.push(PredOp::Cmp { field, op, value });
        Ok(())
    }
    fn cmp_op(&mut self) -> Result<CmpOp, String> {
        let op = match self.peek() {
            Some(Tok::Op(o)) => match *o {
                "=" => CmpOp::Eq,
                "!=" => CmpOp::Ne,
                "<" => CmpOp::Lt,
                "<=" => CmpOp::Le,
                ">" => CmpOp::Gt,
                _ => CmpOp::Ge,
            },
            _ => return self.err("a comparison (=, !=, <, <=, >, >=) or \"between\""),
        };
        self.pos += 1;
        Ok(op)
    }
    /// The rest of a comparison of the JSON value at `path`.
    fn json(&mut self, path: JsonPath) -> Result<(), String> {
        if self.keyword("between") {
            let lo = self.number()?;
            if !self.keyword("and") {
                return self.err("\"and\" of between");
            }
            let hi = self.number()?;
            // lo <= v <= hi; unknown when v is no number, like the parts.
            for (op, n) in [(CmpOp::Ge, lo), (CmpOp::Le, hi)] {
                self.out.push(PredOp::JsonCmp {
                    path: path.clone(),
                    op,
                    value: JsonLit::Num(n),
                });
            }
            self.out.push(PredOp::And);
            return Ok(());
        }
        let op = self.cmp_op()?;
        let col = self.col();
        let value = match self.peek() {
            Some(Tok::Num(_)) => JsonLit::Num(self.number()?),
            Some(Tok::Str(t)) => JsonLit::Str(t.clone()),
            Some(Tok::Word(w)) if w.eq_ignore_ascii_case("true") => JsonLit::Bool(true),
            Some(Tok::Word(w)) if w.eq_ignore_ascii_case("false") => JsonLit::Bool(false),
            _ => return self.err("a number, a 'string', true or false"),
        };
        if !matches!(value, JsonLit::Num(_)) {
            self.pos += 1;
        }
        crate::json::check_cmp(&path, op, &value).map_err(|e| format!("at column {col}: {e}"))?;
        self.out.push(PredOp::JsonCmp { path, op, value });
        Ok(())
    }
    fn number(&mut self) -> Result<Number, String> {
        match self.peek() {
            Some(Tok::Num(n)) => {
                let v = parse_number(n).map_err(|e| format!("at column {}: {e}", self.col()))?;
                self.pos += 1;
                Ok(v)
            }
            _ => self.err("a number"),
        }
    }
}

/// Parse a `--where` expression into a postfix predicate program.
pub fn parse_where(src: &str) -> Result<Vec<PredOp>, String> {
    let toks = tokenize(src)?;
    if toks.is_empty() {
        return Err("empty expression".into());
    }
    let mut p = Parser {
        toks,
        pos: 0,
        len: src.len(),
        out: Vec::new(),
    };
    p.or(0)?;
    if p.pos < p.toks.len() {
        return p.err("\"and\", \"or\" or the end");
    }
    crate::predicate::validate_predicate(&p.out)?;
    Ok(p.out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_protocol::plan::{CmpOp, Field, PredOp};

    #[test]
    fn parses_the_example() {
        let p = parse_where("i64@0 > 5 and (f64@8 between 1.5 and 2 or not i32@16 = 3)").unwrap();
        use PredOp::*;
        assert_eq!(
            p,
            vec![
                Cmp {
                    field: Field::I64(0),
                    op: CmpOp::Gt,
                    value: Number::I64(5)
                },
                Between {
                    field: Field::F64(8),
                    lo: Number::F64(1.5),
                    hi: Number::I64(2)
                },
                Cmp {
                    field: Field::I32(16),
                    op: CmpOp::Eq,
                    value: Number::I64(3)
                },
                Not,
                Or,
                And
            ]
        );
        // or binds looser than and
        let p = parse_where("u8@0 = 1 or u8@1 = 1 and u8@2 = 1").unwrap();
        assert!(matches!(p.as_slice(), [_, _, _, And, Or]));
        assert_eq!(parse_where("f64@8 <= -1.5e3").unwrap().len(), 1);
    }

    #[test]
    fn json_paths_compare_with_numbers_strings_and_booleans() {
        use insitu_protocol::plan::{JsonLit, JsonStep};
        let key = |k: &str| JsonPath {
            steps: vec![JsonStep::Key(k.into())],
        };
        let p = parse_where("$.age > 30 and ($.name = 'it''s' or not $.ok != TRUE)").unwrap();
        use PredOp::*;
        assert_eq!(
            p,
            vec![
                JsonCmp {
                    path: key("age"),
                    op: CmpOp::Gt,
                    value: JsonLit::Num(Number::I64(30))
                },
                JsonCmp {
                    path: key("name"),
                    op: CmpOp::Eq,
                    value: JsonLit::Str("it's".into())
                },
                JsonCmp {
                    path: key("ok"),
                    op: CmpOp::Ne,
                    value: JsonLit::Bool(true)
                },
                Not,
                Or,
                And
            ]
        );
        // between: >= lo and <= hi
        let p = parse_where("$.a[0] between -1.5 and 2").unwrap();
        assert!(matches!(
            p.as_slice(),
            [
                JsonCmp {
                    op: CmpOp::Ge,
                    value: JsonLit::Num(Number::F64(_)),
                    ..
                },
                JsonCmp {
                    op: CmpOp::Le,
                    value: JsonLit::Num(Number::I64(2)),
                    ..
                },
                And
            ]
        ));
        // No spaces needed; brackets and raw fields mix.
        let p = parse_where(r#"$["first name"]='al'and i64@0>=1"#).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(parse_where("$.s = ''").unwrap().len(), 1);
    }

    #[test]
    fn json_mistakes_say_where() {
        let cases = [
            ("$.age > 'x", "column 9: the string has no closing '"),
            ("$.ok < true", "= or <> only"),
            (
                "$.name = bob",
                "column 10: expected a number, a 'string', true or false",
            ),
            ("i64@0 = 'x'", "expected a number"),
            ("$. > 1", "column 3: bad JSON path: expected a key"),
            ("$.a between 'a' and 'b'", "expected a number"),
            ("x > 1", "a field like i64@0 or $.key"),
            ("$age > 1", "column 2: bad JSON path: unexpected 'a'"),
        ];
        for (text, want) in cases {
            let e = parse_where(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn errors_say_where() {
        let e = parse_where("i64@0 > ").unwrap_err();
        assert!(e.contains("column 9") && e.contains("a number"), "{e}");
        let e = parse_where("i65@0 > 1").unwrap_err();
        assert!(e.contains("column 1") && e.contains("unknown type"), "{e}");
        let e = parse_where("i64@0 > 1 and").unwrap_err();
        assert!(e.contains("expected a field"), "{e}");
        let e = parse_where("(i64@0 > 1").unwrap_err();
        assert!(e.contains("\")\""), "{e}");
        let e = parse_where("i64@0 ~ 1").unwrap_err();
        assert!(e.contains("column 7") && e.contains('~'), "{e}");
        let e = parse_where("i64@x > 1").unwrap_err();
        assert!(e.contains("offset"), "{e}");
        let e = parse_where("i64@0 > 1 i64@0").unwrap_err();
        assert!(e.contains("column 11"), "{e}");
        assert!(parse_where(&format!("{}i64@0 = 1{}", "(".repeat(40), ")".repeat(40))).is_err());
        assert!(parse_field("i64").is_err());
        assert!(parse_number("abc").is_err());
        for bad in ["1e400", "-1e400", "inf", "nan", "9223372036854775808"] {
            assert!(parse_number(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_number("-9223372036854775808").unwrap(),
            Number::I64(i64::MIN)
        );
        assert_eq!(parse_number("1e3").unwrap(), Number::F64(1000.0));
    }
}
