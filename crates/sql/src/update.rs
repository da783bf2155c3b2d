//! `UPDATE table SET .. WHERE ..` on an insitu table, run by the servers
//! (`Op::UpdateRows`): DataFusion plans the statement and hands the table
//! its assignments and WHERE conjuncts (`TableProvider::update`); the
//! assignments are translated here, and `WriteExec` (`write_exec.rs`) runs
//! the update when the plan is executed.
//!
//! What the servers apply, exactly or not at all:
//! - `SET c = <literal>` (NULL included), the literal converted to `c`'s
//!   type without loss (else refused: `SET age = 2.7` on an integer column
//!   is an error, not 2);
//! - `SET c = c + <literal>`, `c - <literal>`, `<literal> + c`, on a
//!   numeric column (and `dt + INTERVAL 'n' DAY` on a date column);
//! - a WHERE clause whose every conjunct the servers evaluate exactly (the
//!   same translation as a scan's pushed filters).
//!
//! Anything else (`SET a = b`, functions, a subquery in WHERE) is refused
//! with the reason: the row is changed in the server, never read out and
//! written back by the client.

use datafusion::common::ScalarValue;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use insitu_protocol::plan::RowAction;
use insitu_protocol::query::Scalar;
use insitu_protocol::schema::{ColumnType, Schema};

use crate::translate::{Refusal, col_ref, int_value, literal, scalar_for};

/// The expression under any aliases and casts. Why unwrapping casts is
/// safe here: DataFusion casts an assignment back to the column's type
/// (and widens `c + 1` to compute it); the servers compute in the column's
/// own type, refusing a value that does not fit instead of casting it.
fn bare(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => bare(&a.expr),
        Expr::Cast(c) => bare(&c.expr),
        Expr::TryCast(c) => bare(&c.expr),
        other => other,
    }
}

/// `v` as a value of column `column` (NULL included), exactly.
fn set_value(schema: &Schema, col: usize, v: &ScalarValue) -> Result<Scalar, Refusal> {
    let column = &schema.columns[col];
    if v.is_null() {
        return Ok(Scalar::Null);
    }
    match (column.ty, v) {
        // A date written as text: the servers' own date parsing.
        (
            ColumnType::Date32,
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
        ) => insitu_rows::coerce(&Scalar::Str(s.clone()), column).map_err(|e| e.to_string()),
        (ty, v) => scalar_for(ty, v).map_err(|e| format!("SET {}: {e}", column.name)),
    }
}

/// The delta of `SET c = c + v` for a column of type `ty`.
fn delta(ty: ColumnType, v: &ScalarValue) -> Option<Scalar> {
    match (ty, v) {
        (ColumnType::Int32 | ColumnType::Int64, v) => int_value(v).map(Scalar::Int),
        (ColumnType::Date32, ScalarValue::IntervalDayTime(Some(i))) if i.milliseconds == 0 => {
            Some(Scalar::Int(i.days.into()))
        }
        (ColumnType::Date32, ScalarValue::IntervalMonthDayNano(Some(i)))
            if i.months == 0 && i.nanoseconds == 0 =>
        {
            Some(Scalar::Int(i.days.into()))
        }
        (ColumnType::Decimal { .. }, v) => scalar_for(ty, v).ok(),
        (ColumnType::Float64, v) => match v {
            ScalarValue::Float64(Some(f)) => Some(Scalar::Float(*f)),
            ScalarValue::Float32(Some(f)) => Some(Scalar::Float(f64::from(*f))),
            ScalarValue::Decimal128(Some(x), _, s) => {
                Some(Scalar::Float(*x as f64 / 10f64.powi(i32::from(*s))))
            }
            v => int_value(v).map(|i| Scalar::Float(i as f64)),
        },
        _ => None,
    }
}

fn negate(s: Scalar) -> Option<Scalar> {
    Some(match s {
        Scalar::Int(i) => Scalar::Int(i.checked_neg()?),
        Scalar::Decimal { value, scale } => Scalar::Decimal {
            value: value.checked_neg()?,
            scale,
        },
        Scalar::Float(f) => Scalar::Float(-f),
        _ => return None,
    })
}

/// One assignment `name = e` as the change the servers make.
fn assignment(schema: &Schema, name: &str, e: &Expr) -> Result<(u16, RowAction), Refusal> {
    let col = schema
        .column_index(name)
        .ok_or_else(|| format!("the table has no column {name}"))?;
    let ty = schema.columns[col].ty;
    let e = bare(e);
    if let Some(v) = literal(e) {
        return Ok((col as u16, RowAction::Set(set_value(schema, col, v)?)));
    }
    let unsupported = || {
        format!(
            "SET {name} = {e}: the servers apply SET {name} = <value> or SET {name} = {name} + <number> (or - <number>)"
        )
    };
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
        return Err(unsupported());
    };
    let own = |x: &Expr| col_ref(bare(x), schema).is_ok_and(|c| c.idx as usize == col);
    let (v, negative) = match op {
        Operator::Plus if own(left) => (literal(bare(right)), false),
        Operator::Plus if own(right) => (literal(bare(left)), false),
        Operator::Minus if own(left) => (literal(bare(right)), true),
        _ => return Err(unsupported()),
    };
    let v = v.ok_or_else(unsupported)?;
    if v.is_null() {
        return Err(format!(
            "SET {name} = {e}: adding NULL makes every row NULL (SET {name} = NULL says so)"
        ));
    }
    let d = delta(ty, v)
        .ok_or_else(|| format!("SET {name} = {e}: {v} is not a number {ty} can add exactly"))?;
    let d = if negative {
        negate(d).ok_or_else(|| format!("SET {name} = {e}: cannot negate {v}"))?
    } else {
        d
    };
    Ok((col as u16, RowAction::Add(d)))
}

/// DataFusion's assignments as the servers' changes.
pub fn assignments_to_set(
    assignments: &[(String, Expr)],
    schema: &Schema,
) -> Result<Vec<(u16, RowAction)>, Refusal> {
    assignments
        .iter()
        .map(|(name, e)| assignment(schema, name, e))
        .collect()
}
