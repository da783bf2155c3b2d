//! `insitu count | agg | update | train logreg`: data operations computed on
//! the storage servers, and the small expression language of `--where`.
//!
//! Fields name a little-endian number at a byte offset of a raw value:
//! `i32@4`, `i64@0`, `f64@8`, `u8@16` (a byte). Expressions:
//!
//! ```text
//! expr  := and ("or" and)*
//! and   := unary ("and" unary)*
//! unary := "not" unary | "(" expr ")" | field cmp number
//!        | field "between" number "and" number
//! cmp   := "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
//! ```
//! e.g. `i64@0 > 5 and (f64@8 between 1.5 and 2 or not i32@16 = 3)`.

use std::time::Instant;

use anyhow::{Context, bail};
use insitu_client::{Client, Selection};
use insitu_compute::{AggExt, MAX_PRED_DEPTH};
use insitu_protocol::Number;
use insitu_protocol::plan::{CmpOp, Field, KeyRange, PointLayout, PredOp, UpdateAction};

use crate::ClusterArg;

#[derive(clap::Args)]
pub struct CountArgs {
    /// The table (see `insitu table list`).
    pub table: String,
    /// Only objects matching this expression: fields TYPE@BYTE_OFFSET of the value (i32, i64,
    /// f64 or u8, little-endian) compared with = != < <= > >= or `between A and B`, joined by
    /// and, or, not and parentheses; e.g. `i64@0 > 5 and not u8@8 = 0`.
    #[arg(long = "where")]
    pub filter: Option<String>,
    /// Only keys >= this (bytewise).
    #[arg(long)]
    pub from_key: Option<String>,
    /// Only keys < this (bytewise).
    #[arg(long)]
    pub to_key: Option<String>,
}

#[derive(clap::Args)]
pub struct AggArgs {
    /// The table (see `insitu table list`).
    pub table: String,
    /// sum, min, max, avg or count.
    pub func: String,
    /// The field, e.g. `i64@0`.
    pub field: String,
    /// Only objects matching this expression (see `insitu count --help`).
    #[arg(long = "where")]
    pub filter: Option<String>,
}

#[derive(clap::Args)]
pub struct UpdateArgs {
    /// The table (see `insitu table list`).
    pub table: String,
    /// The field to change, e.g. `i64@0`.
    pub field: String,
    /// Add this number to the field.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "set")]
    pub add: Option<String>,
    /// Set the field to this number.
    #[arg(long, allow_hyphen_values = true)]
    pub set: Option<String>,
    /// Only objects matching this expression (see `insitu count --help`).
    #[arg(long = "where")]
    pub filter: Option<String>,
}

#[derive(clap::Subcommand)]
pub enum TrainCmd {
    /// Logistic regression by batch gradient descent, each gradient computed
    /// on the servers. Points: `--dims` little-endian f32 at byte 0, then a
    /// label byte (0 or 1) at byte 4*dims (override with --label-offset).
    Logreg {
        /// The table of points (see `insitu table list`).
        table: String,
        /// Features per point (f32 each).
        #[arg(long)]
        dims: u32,
        /// Gradient-descent steps (one pass over the table each).
        #[arg(long, default_value_t = 10)]
        iterations: u32,
        /// Learning rate (step size).
        #[arg(long, default_value_t = 0.5)]
        rate: f64,
        /// Byte offset of the vector.
        #[arg(long, default_value_t = 0)]
        offset: u32,
        /// Byte offset of the label (default: right after the vector).
        #[arg(long)]
        label_offset: Option<u32>,
    },
}

/// Parse a field like `i64@0`.
pub fn parse_field(s: &str) -> anyhow::Result<Field> {
    let s = s.trim();
    let Some((kind, off)) = s.split_once('@') else {
        bail!("bad field {s:?}: write TYPE@OFFSET, e.g. i64@0 (types: i32, i64, f64, u8)");
    };
    let off: u32 = off
        .parse()
        .map_err(|_| anyhow::anyhow!("bad field {s:?}: offset {off:?} is not a byte offset"))?;
    Ok(match kind {
        "i32" => Field::I32(off),
        "i64" => Field::I64(off),
        "f64" => Field::F64(off),
        "u8" => Field::U8(off),
        other => bail!("bad field {s:?}: unknown type {other:?} (types: i32, i64, f64, u8)"),
    })
}

/// Parse a number: an integer stays an integer, anything else is an f64.
pub fn parse_number(s: &str) -> anyhow::Result<Number> {
    if let Ok(i) = s.parse::<i64>() {
        return Ok(Number::I64(i));
    }
    if s.bytes()
        .all(|b| b.is_ascii_digit() || b == b'-' || b == b'+')
        && s.parse::<i128>().is_ok()
    {
        bail!(
            "{s:?} is out of range: integers must be in {}..={}",
            i64::MIN,
            i64::MAX
        );
    }
    match s.parse::<f64>() {
        // `1e400` parses as infinity: a number, but not one a field can hold.
        Ok(f) if f.is_finite() => Ok(Number::F64(f)),
        Ok(_) => bail!("{s:?} is not a finite number"),
        _ => bail!("{s:?} is not a number"),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Word(String),
    Num(String),
    Op(&'static str),
    LParen,
    RParen,
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
            _ => return self.err("a field like i64@0, \"not\" or \"(\""),
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
        let value = self.number()?;
        self.out.push(PredOp::Cmp { field, op, value });
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
    insitu_compute::validate_predicate(&p.out)?;
    Ok(p.out)
}

fn selection(filter: &Option<String>) -> anyhow::Result<Selection> {
    Ok(match filter {
        None => Selection::all(),
        Some(f) => Selection::filter(
            parse_where(f).map_err(|e| anyhow::anyhow!("bad --where expression {f:?}: {e}"))?,
        ),
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

async fn open(cluster: &ClusterArg, table: &str) -> anyhow::Result<(Client, u64)> {
    let (client, info) = crate::data::open(cluster, table).await?;
    Ok((client, info.id))
}

fn show(n: Number) -> String {
    match n {
        Number::I64(v) => v.to_string(),
        Number::F64(v) => v.to_string(),
    }
}

pub fn count(a: CountArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let mut sel = selection(&a.filter)?;
    if a.from_key.is_some() || a.to_key.is_some() {
        sel.key_range = Some(KeyRange {
            start: a.from_key.clone().unwrap_or_default().into_bytes(),
            end: a.to_key.clone().map(String::into_bytes),
        });
    }
    runtime()?.block_on(async {
        let (client, id) = open(cluster, &a.table).await?;
        let n = client.count(id, &sel).await?;
        crate::outln!("{n}")?;
        Ok(())
    })
}

pub fn agg(a: AggArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let field = parse_field(&a.field)?;
    let func = a.func.to_ascii_lowercase();
    if !["sum", "min", "max", "avg", "count"].contains(&func.as_str()) {
        bail!(
            "unknown aggregate {:?}: use sum, min, max, avg or count",
            a.func
        );
    }
    let sel = selection(&a.filter)?;
    runtime()?.block_on(async {
        let (client, id) = open(cluster, &a.table).await?;
        let r = client.aggregate(id, field, &sel).await?;
        let float = field.is_float();
        let out = match func.as_str() {
            "sum" => r.sum(float).to_string(), // exact: i128 for integer fields
            "count" => r.count.to_string(),
            "avg" => r.avg(float).map_or("null".into(), |v| v.to_string()),
            "min" => r.min.map_or("null".into(), show),
            _ => r.max.map_or("null".into(), show),
        };
        crate::outln!("{out}")?;
        Ok(())
    })
}

pub fn update(a: UpdateArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let field = parse_field(&a.field)?;
    let action = match (&a.add, &a.set) {
        (Some(x), None) => UpdateAction::Add(parse_number(x).with_context(|| "bad --add")?),
        (None, Some(x)) => UpdateAction::Set(parse_number(x).with_context(|| "bad --set")?),
        _ => bail!("give --add X or --set X"),
    };
    // The same check the client and the servers run, before connecting.
    insitu_compute::check_action(field, action).map_err(|e| anyhow::anyhow!("bad update: {e}"))?;
    let sel = selection(&a.filter)?;
    runtime()?.block_on(async {
        let (client, id) = open(cluster, &a.table).await?;
        let n = client.update(id, field, action, &sel).await?;
        crate::outln!("updated {n} objects")?;
        Ok(())
    })
}

pub fn train(cmd: TrainCmd, cluster: &ClusterArg) -> anyhow::Result<()> {
    let TrainCmd::Logreg {
        table,
        dims,
        iterations,
        rate,
        offset,
        label_offset,
    } = cmd;
    anyhow::ensure!(
        (1..=insitu_protocol::plan::MAX_DIMS).contains(&dims),
        "--dims must be in 1..={}",
        insitu_protocol::plan::MAX_DIMS
    );
    let layout = PointLayout {
        offset,
        dims,
        label_offset: label_offset.unwrap_or(offset + 4 * dims),
    };
    runtime()?.block_on(async {
        let (client, id) = open(cluster, &table).await?;
        let started = Instant::now();
        let m = client.train_logreg(id, layout, iterations, rate).await?;
        for (i, l) in m.losses.iter().enumerate() {
            crate::outln!("iteration {:>4}  mean log-loss {l:.6}", i + 1)?;
        }
        crate::outln!("trained in {:.1} ms", started.elapsed().as_secs_f64() * 1e3)?;
        crate::outln!("bias {}", m.bias)?;
        let w: Vec<String> = m.weights.iter().map(|w| w.to_string()).collect();
        crate::outln!("weights {}", w.join(" "))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
