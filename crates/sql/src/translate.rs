//! DataFusion expressions → insitu query programs.
//!
//! A WHERE clause becomes a postfix `Vec<Pred>` only when the servers will
//! give *exactly* the answer DataFusion would: same three-valued logic, every
//! literal converted to the column's own type without loss, and a cast on a
//! column unwrapped only when it widens within one type family (so it cannot
//! change how two values compare). Anything else is refused with the reason,
//! and DataFusion evaluates it on the client.
//!
//! An aggregate's argument becomes a postfix `Vec<ValueOp>` (columns,
//! literals, `+ - *`, unary minus), with the decimal scale of its result.

use arrow_schema::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::expr::{Between, InList, Like};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use insitu_protocol::plan::{CmpOp, MAX_PRED_OPS};
use insitu_protocol::query::{MAX_IN_LIST, MAX_PATTERN_BYTES, Pred, Scalar};
use insitu_protocol::schema::{ColumnType, Schema};

mod value;

pub use value::{ValueProgram, value_program};

/// Why an expression was not translated (shown by tests and logs).
pub type Refusal = String;

/// A column reference, possibly under casts that were proven harmless.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ColRef {
    /// Index of the column in the table's schema.
    pub idx: u16,
    /// The column's stored type (what the server compares with).
    pub ty: ColumnType,
}

/// Translate one filter expression to a postfix program of at most
/// `MAX_PRED_OPS` steps.
pub fn filter_to_preds(expr: &Expr, schema: &Schema) -> Result<Vec<Pred>, Refusal> {
    let mut out = Vec::new();
    pred(expr, schema, &mut out)?;
    if out.len() > MAX_PRED_OPS {
        return Err(format!(
            "filter of {} steps: more than the limit of {MAX_PRED_OPS}",
            out.len()
        ));
    }
    Ok(out)
}

/// Translate several filters (all must hold) into one program.
pub fn filters_to_preds(exprs: &[Expr], schema: &Schema) -> Result<Vec<Pred>, Refusal> {
    let mut out = Vec::new();
    for (i, e) in exprs.iter().enumerate() {
        pred(e, schema, &mut out)?;
        if i > 0 {
            out.push(Pred::And);
        }
    }
    if out.len() > MAX_PRED_OPS {
        return Err(format!(
            "filters of {} steps: more than the limit of {MAX_PRED_OPS}",
            out.len()
        ));
    }
    Ok(out)
}

fn pred(expr: &Expr, schema: &Schema, out: &mut Vec<Pred>) -> Result<(), Refusal> {
    match expr {
        Expr::Alias(a) => pred(&a.expr, schema, out),
        Expr::BinaryExpr(b) => binary(b, schema, out),
        Expr::Not(inner) => {
            pred(inner, schema, out)?;
            out.push(Pred::Not);
            Ok(())
        }
        Expr::IsNull(inner) => {
            let c = col_ref(inner, schema)?;
            out.push(Pred::IsNull { col: c.idx });
            Ok(())
        }
        Expr::IsNotNull(inner) => {
            let c = col_ref(inner, schema)?;
            out.push(Pred::IsNull { col: c.idx });
            out.push(Pred::Not);
            Ok(())
        }
        Expr::Between(b) => between(b, schema, out),
        Expr::InList(l) => in_list(l, schema, out),
        Expr::Like(l) => like(l, schema, out),
        Expr::Column(_) | Expr::Cast(_) | Expr::TryCast(_) => {
            // A bare boolean column: `WHERE flag` is `flag = true` (NULL stays unknown).
            let c = col_ref(expr, schema)?;
            if c.ty != ColumnType::Bool {
                return Err(format!("{expr} is not a boolean column"));
            }
            out.push(Pred::Cmp {
                col: c.idx,
                op: CmpOp::Eq,
                value: Scalar::Bool(true),
            });
            Ok(())
        }
        Expr::ScalarFunction(f) if f.name() == "regexp_like" => {
            let (col, pattern, flags) = match f.args.as_slice() {
                [c, p] => (c, p, None),
                [c, p, fl] => (c, p, Some(fl)),
                _ => return Err("regexp_like takes 2 or 3 arguments".into()),
            };
            let case_insensitive = match flags {
                None => false,
                Some(fl) => match literal_str(fl)?.as_str() {
                    "" => false,
                    "i" => true,
                    other => {
                        return Err(format!("regexp_like flags {other:?}: only 'i' is pushed"));
                    }
                },
            };
            text_match(
                Match::Regex,
                col,
                pattern,
                case_insensitive,
                false,
                schema,
                out,
            )
        }
        other => Err(format!("{other} is not a pushable filter")),
    }
}

fn binary(b: &BinaryExpr, schema: &Schema, out: &mut Vec<Pred>) -> Result<(), Refusal> {
    let (l, r) = (b.left.as_ref(), b.right.as_ref());
    match b.op {
        Operator::And | Operator::Or => {
            pred(l, schema, out)?;
            pred(r, schema, out)?;
            out.push(if b.op == Operator::And {
                Pred::And
            } else {
                Pred::Or
            });
            Ok(())
        }
        Operator::Eq
        | Operator::NotEq
        | Operator::Lt
        | Operator::LtEq
        | Operator::Gt
        | Operator::GtEq => compare(l, b.op, r, schema, out),
        Operator::RegexMatch => text_match(Match::Regex, l, r, false, false, schema, out),
        Operator::RegexIMatch => text_match(Match::Regex, l, r, true, false, schema, out),
        Operator::RegexNotMatch => text_match(Match::Regex, l, r, false, true, schema, out),
        Operator::RegexNotIMatch => text_match(Match::Regex, l, r, true, true, schema, out),
        Operator::LikeMatch => text_match(Match::Like, l, r, false, false, schema, out),
        Operator::ILikeMatch => text_match(Match::Like, l, r, true, false, schema, out),
        Operator::NotLikeMatch => text_match(Match::Like, l, r, false, true, schema, out),
        Operator::NotILikeMatch => text_match(Match::Like, l, r, true, true, schema, out),
        op => Err(format!("operator {op} is not pushed")),
    }
}

fn cmp_op(op: Operator) -> CmpOp {
    match op {
        Operator::Eq => CmpOp::Eq,
        Operator::NotEq => CmpOp::Ne,
        Operator::Lt => CmpOp::Lt,
        Operator::LtEq => CmpOp::Le,
        Operator::Gt => CmpOp::Gt,
        _ => CmpOp::Ge,
    }
}

/// `a OP b` is `b flip(OP) a`.
fn flip(op: CmpOp) -> CmpOp {
    match op {
        CmpOp::Lt => CmpOp::Gt,
        CmpOp::Le => CmpOp::Ge,
        CmpOp::Gt => CmpOp::Lt,
        CmpOp::Ge => CmpOp::Le,
        same => same,
    }
}

fn compare(
    l: &Expr,
    op: Operator,
    r: &Expr,
    schema: &Schema,
    out: &mut Vec<Pred>,
) -> Result<(), Refusal> {
    let op = cmp_op(op);
    match (literal(l), literal(r)) {
        (None, Some(v)) => {
            let c = col_ref(l, schema)?;
            out.push(Pred::Cmp {
                col: c.idx,
                op,
                value: scalar_for(c.ty, v)?,
            });
        }
        (Some(v), None) => {
            let c = col_ref(r, schema)?;
            out.push(Pred::Cmp {
                col: c.idx,
                op: flip(op),
                value: scalar_for(c.ty, v)?,
            });
        }
        (None, None) => {
            let (a, b) = (col_ref(l, schema)?, col_ref(r, schema)?);
            if !comparable(a.ty, b.ty) {
                return Err(format!(
                    "columns of types {} and {} are not compared on the servers",
                    a.ty, b.ty
                ));
            }
            out.push(Pred::CmpCols {
                left: a.idx,
                op,
                right: b.idx,
            });
        }
        (Some(_), Some(_)) => return Err("a comparison of two literals".into()),
    }
    Ok(())
}

/// Whether two stored types compare exactly as DataFusion compares them
/// after its coercion (same type, or two integer widths).
fn comparable(a: ColumnType, b: ColumnType) -> bool {
    let int = |t| matches!(t, ColumnType::Int32 | ColumnType::Int64);
    a == b || (int(a) && int(b))
}

fn between(b: &Between, schema: &Schema, out: &mut Vec<Pred>) -> Result<(), Refusal> {
    let c = col_ref(&b.expr, schema)?;
    let (Some(lo), Some(hi)) = (literal(&b.low), literal(&b.high)) else {
        return Err("BETWEEN bounds must be literals".into());
    };
    out.push(Pred::Between {
        col: c.idx,
        lo: scalar_for(c.ty, lo)?,
        hi: scalar_for(c.ty, hi)?,
    });
    if b.negated {
        out.push(Pred::Not);
    }
    Ok(())
}

fn in_list(l: &InList, schema: &Schema, out: &mut Vec<Pred>) -> Result<(), Refusal> {
    let c = col_ref(&l.expr, schema)?;
    if l.list.is_empty() || l.list.len() > MAX_IN_LIST {
        return Err(format!(
            "IN list of {} items (1 to {MAX_IN_LIST} are pushed)",
            l.list.len()
        ));
    }
    let mut values = Vec::with_capacity(l.list.len());
    for item in &l.list {
        let v = literal(item).ok_or_else(|| format!("IN list item {item} is not a literal"))?;
        // A NULL item makes a non-matching row unknown instead of false;
        // scalar_for refuses NULL, so such lists stay in DataFusion.
        values.push(scalar_for(c.ty, v)?);
    }
    out.push(Pred::In { col: c.idx, values });
    if l.negated {
        out.push(Pred::Not);
    }
    Ok(())
}

fn like(l: &Like, schema: &Schema, out: &mut Vec<Pred>) -> Result<(), Refusal> {
    // DataFusion's LIKE escapes with `\` and refuses any other escape
    // character; the servers use the same default.
    if l.escape_char.is_some_and(|c| c != '\\') {
        return Err("LIKE with an escape character other than \\".into());
    }
    text_match(
        Match::Like,
        &l.expr,
        &l.pattern,
        l.case_insensitive,
        l.negated,
        schema,
        out,
    )
}

/// Which text match a pattern pushes down as.
#[derive(Clone, Copy)]
enum Match {
    Like,
    Regex,
}

/// A text column matched against a literal pattern (of at most
/// `MAX_PATTERN_BYTES`), then `NOT` if negated.
fn text_match(
    kind: Match,
    col: &Expr,
    pattern: &Expr,
    case_insensitive: bool,
    negated: bool,
    schema: &Schema,
    out: &mut Vec<Pred>,
) -> Result<(), Refusal> {
    let c = text_col(col, schema)?;
    let pattern = literal_str(pattern)?;
    if pattern.len() > MAX_PATTERN_BYTES {
        let what = match kind {
            Match::Like => "LIKE pattern",
            Match::Regex => "regex",
        };
        return Err(format!(
            "{what} of {} bytes: more than {MAX_PATTERN_BYTES}",
            pattern.len()
        ));
    }
    out.push(match kind {
        Match::Like => Pred::Like {
            col: c.idx,
            pattern,
            case_insensitive,
        },
        Match::Regex => Pred::Regex {
            col: c.idx,
            pattern,
            case_insensitive,
        },
    });
    if negated {
        out.push(Pred::Not);
    }
    Ok(())
}

fn text_col(e: &Expr, schema: &Schema) -> Result<ColRef, Refusal> {
    let c = col_ref(e, schema)?;
    if c.ty != ColumnType::Utf8 {
        return Err(format!("{e} is not a text column"));
    }
    Ok(c)
}

/// The value of a literal expression (through aliases), if it is one.
pub(crate) fn literal(e: &Expr) -> Option<&ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v),
        Expr::Alias(a) => literal(&a.expr),
        _ => None,
    }
}

fn literal_str(e: &Expr) -> Result<String, Refusal> {
    match literal(e) {
        Some(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
        ) => Ok(s.clone()),
        _ => Err(format!("{e} is not a text literal")),
    }
}

/// The column `e` reads, when `e` is a column under zero or more casts that
/// cannot change comparisons or arithmetic values.
pub(crate) fn col_ref(e: &Expr, schema: &Schema) -> Result<ColRef, Refusal> {
    match e {
        Expr::Column(c) => {
            let idx = schema
                .column_index(&c.name)
                .ok_or_else(|| format!("unknown column {}", c.name))?;
            let ty = schema.columns[idx].ty;
            Ok(ColRef {
                idx: idx as u16,
                ty,
            })
        }
        Expr::Alias(a) => col_ref(&a.expr, schema),
        Expr::Cast(c) => widened(col_ref(&c.expr, schema)?, c.field.data_type(), e),
        Expr::TryCast(c) => widened(col_ref(&c.expr, schema)?, c.field.data_type(), e),
        other => Err(format!("{other} is not a column")),
    }
}

/// `c` seen through a cast to `to`, if that cast widens within the column's
/// type family (every value maps to the same number or text, order kept).
fn widened(c: ColRef, to: &DataType, e: &Expr) -> Result<ColRef, Refusal> {
    let ok = match (c.ty, to) {
        (ColumnType::Int32, DataType::Int32 | DataType::Int64) => true,
        (ColumnType::Int64, DataType::Int64) => true,
        (ColumnType::Float64, DataType::Float64) => true,
        (ColumnType::Date32, DataType::Date32) => true,
        (ColumnType::Bool, DataType::Boolean) => true,
        (ColumnType::Utf8, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => true,
        (ColumnType::Decimal { precision, scale }, DataType::Decimal128(p, s)) => {
            // More fraction digits and at least as many integer digits.
            *s >= 0
                && (*s as u8) >= scale
                && (*p as i32 - *s as i32) >= (precision as i32 - scale as i32)
        }
        _ => false,
    };
    if ok {
        Ok(c)
    } else {
        Err(format!("{e}: the cast may change comparisons"))
    }
}

/// `v` as a value of a column of type `ty`, exactly, or a refusal.
pub(crate) fn scalar_for(ty: ColumnType, v: &ScalarValue) -> Result<Scalar, Refusal> {
    if v.is_null() {
        return Err("a comparison with NULL".into());
    }
    let int = int_value(v);
    let s = match (ty, v) {
        (ColumnType::Int32 | ColumnType::Int64, _) if int.is_some() => int.map(Scalar::Int),
        (ColumnType::Float64, ScalarValue::Float64(Some(f))) if !f.is_nan() => {
            Some(Scalar::Float(*f))
        }
        (ColumnType::Float64, ScalarValue::Float32(Some(f))) if !f.is_nan() => {
            Some(Scalar::Float(*f as f64))
        }
        (ColumnType::Decimal { scale, .. }, ScalarValue::Decimal128(Some(x), _, s)) => {
            rescale(*x, *s, scale).map(|value| Scalar::Decimal { value, scale })
        }
        (ColumnType::Decimal { scale, .. }, _) if int.is_some() => int
            .and_then(|i| rescale(i as i128, 0, scale))
            .map(|value| Scalar::Decimal { value, scale }),
        (ColumnType::Date32, ScalarValue::Date32(Some(d))) => Some(Scalar::Date(*d)),
        (
            ColumnType::Utf8,
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
        ) => Some(Scalar::Str(s.clone())),
        (ColumnType::Bool, ScalarValue::Boolean(Some(b))) => Some(Scalar::Bool(*b)),
        _ => None,
    };
    s.ok_or_else(|| format!("literal {v} is not exactly a {ty} value"))
}

/// An integer literal's value, if it is an integer that fits i64.
pub(crate) fn int_value(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::Int8(Some(x)) => Some(*x as i64),
        ScalarValue::Int16(Some(x)) => Some(*x as i64),
        ScalarValue::Int32(Some(x)) => Some(*x as i64),
        ScalarValue::Int64(Some(x)) => Some(*x),
        ScalarValue::UInt8(Some(x)) => Some(*x as i64),
        ScalarValue::UInt16(Some(x)) => Some(*x as i64),
        ScalarValue::UInt32(Some(x)) => Some(*x as i64),
        ScalarValue::UInt64(Some(x)) => i64::try_from(*x).ok(),
        _ => None,
    }
}

/// The unscaled value `x / 10^from` at scale `to`, if exact and within i64.
fn rescale(x: i128, from: i8, to: u8) -> Option<i64> {
    let (from, to) = (from as i32, to as i32);
    let v = if to >= from {
        x.checked_mul(10i128.checked_pow((to - from) as u32)?)?
    } else {
        let d = 10i128.checked_pow((from - to) as u32)?;
        if x % d != 0 {
            return None;
        }
        x / d
    };
    i64::try_from(v).ok()
}
