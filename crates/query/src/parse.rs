//! `--where` text of the CLI on typed tables, parsed into a filter program:
//!
//! ```text
//! expr    := and (OR and)*
//! and     := not (AND not)*
//! not     := NOT not | '(' expr ')' | pred
//! pred    := col op (literal | col)
//!          | col [NOT] BETWEEN literal AND literal
//!          | col [NOT] IN '(' literal (',' literal)* ')'
//!          | col IS [NOT] NULL
//!          | col [NOT] LIKE 'pattern' | col [NOT] ILIKE 'pattern'
//!          | col (~ | ~* | !~ | !~*) 'regex'
//! op      := = | == | != | <> | < | <= | > | >=
//! literal := integer | decimal | float (1e3) | 'text' ('' is a quote)
//!          | DATE 'YYYY-MM-DD' | true | false | NULL
//! ```
//!
//! A quoted literal compared with a date column is read as a date. Nesting
//! is bounded (MAX_DEPTH) so hostile text cannot overflow the stack, and the
//! result is checked like any plan (`compile_filter`).

use insitu_protocol::plan::{CmpOp, MAX_PRED_OPS};
use insitu_protocol::query::{Pred, Scalar};
use insitu_protocol::schema::{ColumnType, Schema};

use crate::QueryError;

/// Deepest nesting of parentheses and NOTs.
pub const MAX_DEPTH: usize = 64;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// A name or keyword (keywords are matched case-insensitively).
    Word(String),
    /// A double-quoted name (never a keyword).
    Quoted(String),
    Number(String),
    Str(String),
    Sym(&'static str),
}

fn err(m: String) -> QueryError {
    QueryError::Parse(m)
}

fn tokenize(text: &str) -> Result<Vec<(usize, Tok)>, QueryError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let tok = if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] >= 0x80) {
                i += 1;
            }
            Tok::Word(text[start..i].to_string())
        } else if c.is_ascii_digit()
            || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
            || (c == b'-'
                && b.get(i + 1)
                    .is_some_and(|d| d.is_ascii_digit() || *d == b'.'))
        {
            i += 1;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                // An exponent's sign: 1e-5.
                if (b[i] == b'e' || b[i] == b'E') && matches!(b.get(i + 1), Some(b'-' | b'+')) {
                    i += 1;
                }
                i += 1;
            }
            Tok::Number(text[start..i].to_string())
        } else if c == b'\'' || c == b'"' {
            let mut s = String::new();
            i += 1;
            loop {
                let Some(rest) = text.get(i..) else {
                    return Err(err(format!("at byte {start}: unterminated quote")));
                };
                let Some(at) = rest.find(c as char) else {
                    return Err(err(format!("at byte {start}: unterminated quote")));
                };
                s.push_str(&rest[..at]);
                i += at + 1;
                if b.get(i) == Some(&c) {
                    s.push(c as char);
                    i += 1;
                } else {
                    break;
                }
            }
            if c == b'"' {
                Tok::Quoted(s)
            } else {
                Tok::Str(s)
            }
        } else {
            const SYMS: [&str; 15] = [
                "!~*", "==", "!=", "<>", "<=", ">=", "~*", "!~", "=", "<", ">", "~", "(", ")", ",",
            ];
            let Some(sym) = SYMS.iter().find(|s| text[i..].starts_with(**s)) else {
                return Err(err(format!(
                    "at byte {i}: unexpected character {:?}",
                    text[i..].chars().next().unwrap_or(' ')
                )));
            };
            i += sym.len();
            Tok::Sym(sym)
        };
        out.push((start, tok));
    }
    Ok(out)
}

struct Parser<'a> {
    /// Column names and the types literals are read as.
    schema: &'a Schema,
    /// Tokens with their byte positions (for messages).
    toks: Vec<(usize, Tok)>,
    /// The next token.
    at: usize,
    /// Where the text ends (for messages about a missing token).
    end: usize,
    /// The postfix program so far.
    out: Vec<Pred>,
    /// Current nesting (bounded by MAX_DEPTH).
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at).map(|(_, t)| t)
    }

    fn pos(&self) -> usize {
        self.toks.get(self.at).map_or(self.end, |(p, _)| *p)
    }

    fn is_kw(&self, kw: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(w)) if w.eq_ignore_ascii_case(kw))
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        let yes = self.is_kw(kw);
        if yes {
            self.at += 1;
        }
        yes
    }

    fn expect_kw(&mut self, kw: &str) -> Result<(), QueryError> {
        if self.eat_kw(kw) {
            Ok(())
        } else {
            Err(self.expected(kw))
        }
    }

    fn eat_sym(&mut self, sym: &str) -> bool {
        let yes = matches!(self.peek(), Some(Tok::Sym(s)) if *s == sym);
        if yes {
            self.at += 1;
        }
        yes
    }

    fn expected(&self, what: &str) -> QueryError {
        match self.peek() {
            Some(t) => err(format!(
                "at byte {}: expected {what}, found {t:?}",
                self.pos()
            )),
            None => err(format!("expected {what} at the end")),
        }
    }

    fn emit(&mut self, p: Pred) -> Result<(), QueryError> {
        if self.out.len() >= MAX_PRED_OPS {
            return Err(err(format!(
                "the condition has more than {MAX_PRED_OPS} steps"
            )));
        }
        self.out.push(p);
        Ok(())
    }

    fn expr(&mut self) -> Result<(), QueryError> {
        self.and()?;
        while self.eat_kw("or") {
            self.and()?;
            self.emit(Pred::Or)?;
        }
        Ok(())
    }

    fn and(&mut self) -> Result<(), QueryError> {
        self.not()?;
        while self.eat_kw("and") {
            self.not()?;
            self.emit(Pred::And)?;
        }
        Ok(())
    }

    fn not(&mut self) -> Result<(), QueryError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(err(format!("nested more than {MAX_DEPTH} deep")));
        }
        if self.eat_kw("not") {
            self.not()?;
            self.emit(Pred::Not)?;
        } else if self.eat_sym("(") {
            self.expr()?;
            if !self.eat_sym(")") {
                return Err(self.expected("')'"));
            }
        } else {
            self.pred()?;
        }
        self.depth -= 1;
        Ok(())
    }

    /// The column named by the next token.
    fn column(&mut self) -> Result<u16, QueryError> {
        let name = match self.peek() {
            Some(Tok::Word(w) | Tok::Quoted(w)) => w.clone(),
            _ => return Err(self.expected("a column name")),
        };
        let cols = &self.schema.columns;
        let found = self.schema.column_index(&name).or_else(|| {
            let mut m = cols
                .iter()
                .enumerate()
                .filter(|(_, c)| c.name.eq_ignore_ascii_case(&name));
            match (m.next(), m.next()) {
                (Some((i, _)), None) => Some(i),
                _ => None,
            }
        });
        let Some(i) = found else {
            let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
            return Err(err(format!(
                "unknown column {name:?} (the table's columns: {})",
                names.join(", ")
            )));
        };
        self.at += 1;
        Ok(i as u16)
    }

    /// A literal, read as a value for column `col`.
    fn literal(&mut self, col: u16) -> Result<Scalar, QueryError> {
        let column = &self.schema.columns[col as usize];
        let pos = self.pos();
        let Some(tok) = self.peek().cloned() else {
            return Err(self.expected("a value"));
        };
        self.at += 1;
        let bad = |what: &str, t: &str| {
            err(format!(
                "at byte {pos}: {t:?} is not {what} (column {:?} is {})",
                column.name, column.ty
            ))
        };
        Ok(match tok {
            Tok::Word(w) if w.eq_ignore_ascii_case("null") => Scalar::Null,
            Tok::Word(w) if w.eq_ignore_ascii_case("true") => Scalar::Bool(true),
            Tok::Word(w) if w.eq_ignore_ascii_case("false") => Scalar::Bool(false),
            Tok::Word(w) if w.eq_ignore_ascii_case("date") => {
                let pos = self.pos();
                let Some(Tok::Str(s)) = self.peek().cloned() else {
                    return Err(self.expected("a quoted date after DATE"));
                };
                self.at += 1;
                Scalar::Date(insitu_rows::date::parse_date(&s).ok_or_else(|| {
                    err(format!("at byte {pos}: {s:?} is not a date (YYYY-MM-DD)"))
                })?)
            }
            Tok::Str(s) if column.ty == ColumnType::Date32 => Scalar::Date(
                insitu_rows::date::parse_date(&s).ok_or_else(|| bad("a date (YYYY-MM-DD)", &s))?,
            ),
            Tok::Str(s) => Scalar::Str(s),
            Tok::Number(n) => number(&n).ok_or_else(|| bad("a number", &n))?,
            other => {
                self.at -= 1;
                return Err(self.expected(&format!("a value, not {other:?}")));
            }
        })
    }

    fn quoted(&mut self, what: &str) -> Result<String, QueryError> {
        match self.peek().cloned() {
            Some(Tok::Str(s)) => {
                self.at += 1;
                Ok(s)
            }
            _ => Err(self.expected(what)),
        }
    }

    fn pred(&mut self) -> Result<(), QueryError> {
        let col = self.column()?;
        let negate = self.eat_kw("not");
        let pos = self.pos();
        if self.eat_kw("between") {
            let lo = self.literal(col)?;
            self.expect_kw("and")?;
            let hi = self.literal(col)?;
            self.emit(Pred::Between { col, lo, hi })?;
        } else if self.eat_kw("in") {
            if !self.eat_sym("(") {
                return Err(self.expected("'(' after IN"));
            }
            let mut values = Vec::new();
            loop {
                if values.len() >= insitu_protocol::query::MAX_IN_LIST {
                    return Err(err(format!(
                        "an IN list of more than {} values",
                        insitu_protocol::query::MAX_IN_LIST
                    )));
                }
                values.push(self.literal(col)?);
                if self.eat_sym(")") {
                    break;
                }
                if !self.eat_sym(",") {
                    return Err(self.expected("',' or ')' in the IN list"));
                }
            }
            self.emit(Pred::In { col, values })?;
        } else if self.is_kw("like") || self.is_kw("ilike") {
            let case_insensitive = self.is_kw("ilike");
            self.at += 1;
            let pattern = self.quoted("a quoted pattern")?;
            self.emit(Pred::Like {
                col,
                pattern,
                case_insensitive,
            })?;
        } else if negate {
            return Err(err(format!(
                "at byte {pos}: NOT after a column must be followed by BETWEEN, IN, LIKE or ILIKE"
            )));
        } else if self.eat_kw("is") {
            let not_null = self.eat_kw("not");
            self.expect_kw("null")?;
            self.emit(Pred::IsNull { col })?;
            if not_null {
                self.emit(Pred::Not)?;
            }
        } else {
            let Some(Tok::Sym(sym)) = self.peek().cloned() else {
                return Err(self.expected("a comparison (=, <, IN, LIKE, ...)"));
            };
            self.at += 1;
            let op = match sym {
                "=" | "==" => CmpOp::Eq,
                "!=" | "<>" => CmpOp::Ne,
                "<" => CmpOp::Lt,
                "<=" => CmpOp::Le,
                ">" => CmpOp::Gt,
                ">=" => CmpOp::Ge,
                "~" | "~*" | "!~" | "!~*" => {
                    let pattern = self.quoted("a quoted regular expression")?;
                    self.emit(Pred::Regex {
                        col,
                        pattern,
                        case_insensitive: sym.ends_with('*'),
                    })?;
                    if sym.starts_with('!') {
                        self.emit(Pred::Not)?;
                    }
                    return Ok(());
                }
                _ => {
                    return Err(err(format!(
                        "at byte {pos}: expected a comparison, found {sym:?}"
                    )));
                }
            };
            // A name that is not a keyword literal is the other column.
            let right_is_column = match self.peek() {
                Some(Tok::Quoted(_)) => true,
                Some(Tok::Word(w)) => !["null", "true", "false", "date"]
                    .iter()
                    .any(|k| w.eq_ignore_ascii_case(k)),
                _ => false,
            };
            if right_is_column {
                let right = self.column()?;
                self.emit(Pred::CmpCols {
                    left: col,
                    op,
                    right,
                })?;
            } else {
                let value = self.literal(col)?;
                self.emit(Pred::Cmp { col, op, value })?;
            }
            return Ok(());
        }
        if negate {
            self.emit(Pred::Not)?;
        }
        Ok(())
    }
}

/// A numeric literal: an integer, an exact decimal (digits after the point
/// become the scale), or a float (with an exponent, or too many digits).
fn number(n: &str) -> Option<Scalar> {
    if n.contains(['e', 'E']) {
        return n.parse().ok().map(Scalar::Float);
    }
    if let Ok(i) = n.parse::<i64>() {
        return Some(Scalar::Int(i));
    }
    let (_, frac) = n.split_once('.')?;
    let scale = u8::try_from(frac.len()).ok().filter(|s| *s <= 18)?;
    insitu_rows::text::parse_decimal(n, scale).map(|value| Scalar::Decimal { value, scale })
}

/// The filter program of `--where` text on a typed table, checked against
/// the schema.
pub fn parse_where(schema: &Schema, text: &str) -> Result<Vec<Pred>, QueryError> {
    let toks = tokenize(text)?;
    if toks.is_empty() {
        return Err(err("an empty condition".into()));
    }
    let mut p = Parser {
        schema,
        toks,
        at: 0,
        end: text.len(),
        out: Vec::new(),
        depth: 0,
    };
    p.expr()?;
    if p.at < p.toks.len() {
        return Err(p.expected("AND, OR or the end"));
    }
    crate::compile::compile_filter(schema, &p.out).map_err(|e| match e {
        QueryError::Plan(m) => err(m),
        e => e,
    })?;
    Ok(p.out)
}
