//! The filter of a plan checked against the schema and compiled: each
//! postfix step (comparisons with literals or other columns, IN lists, IS
//! NULL, LIKE and regexes, AND/OR/NOT) with the refusals a hostile filter
//! needs, literals and columns brought to a common exact scale, the stack
//! depth checked.
//!
//! Apart from `compile.rs` because the filter is the larger half of a plan's
//! checks and has a caller of its own (`parse.rs` checks a `--where` with
//! it), while `compile.rs` holds the plan as a whole: its output, its
//! aggregates and `Compiled`.

use hashbrown::HashSet;
use insitu_protocol::plan::{CmpOp, MAX_PRED_OPS};
use insitu_protocol::query::{MAX_IN_LIST, Pred, Scalar};
use insitu_protocol::schema::{Column, ColumnType, Schema};
use insitu_rows::RowLayout;

use super::{column, refuse};
use crate::QueryError;
use crate::filter::{
    Exact64Col, ExactCol, ExactRead, FALSE, Filter, FloatCol, InList, Op, Operand, STACK_CAP,
    UNKNOWN, fixed_offset,
};
use crate::like;
use crate::value::{Kind, describe, pow10_i128};

/// Largest scale of a decimal literal in a filter (a column's is at most 18).
const MAX_LITERAL_SCALE: u8 = 18;

fn exact_read(ty: ColumnType) -> Option<ExactRead> {
    match ty {
        ColumnType::Int32 | ColumnType::Date32 => Some(ExactRead::I32),
        ColumnType::Int64 | ColumnType::Decimal { .. } => Some(ExactRead::I64),
        ColumnType::Bool => Some(ExactRead::Bool),
        ColumnType::Float64 | ColumnType::Utf8 => None,
    }
}

fn col_scale(ty: ColumnType) -> u32 {
    match ty {
        ColumnType::Decimal { scale, .. } => u32::from(scale),
        _ => 0,
    }
}

fn float_col(layout: &RowLayout, col: usize, ty: ColumnType) -> FloatCol {
    FloatCol {
        col,
        offset: fixed_offset(layout, col),
        exact: exact_read(ty).map(|r| (r, col_scale(ty))),
    }
}

/// An exact literal as (unscaled value, scale): ints, decimals, dates, bools.
fn exact_lit(v: &Scalar) -> Option<(i128, u32)> {
    match *v {
        Scalar::Int(i) => Some((i128::from(i), 0)),
        Scalar::Decimal { value, scale } => Some((i128::from(value), u32::from(scale))),
        Scalar::Date(d) => Some((i128::from(d), 0)),
        Scalar::Bool(b) => Some((i128::from(b), 0)),
        _ => None,
    }
}

fn lit_to_f64(v: &Scalar) -> f64 {
    match v {
        Scalar::Float(f) => *f,
        other => exact_lit(other)
            .map(|(x, s)| crate::value::exact_to_f64(x, s))
            .unwrap_or(f64::NAN),
    }
}

/// Check that literal `v` may be compared with column `col`.
fn check_literal(col: &Column, v: &Scalar, what: &str) -> Result<(), QueryError> {
    let Some(kind) = Kind::of_scalar(v) else {
        return Ok(());
    };
    if kind != Kind::of_column(col.ty) {
        return Err(refuse(format!(
            "{what}: column {:?} ({}) cannot be compared with {} ({})",
            col.name,
            col.ty,
            describe(v),
            kind.name()
        )));
    }
    if let Scalar::Decimal { scale, .. } = v
        && *scale > MAX_LITERAL_SCALE
    {
        return Err(refuse(format!(
            "{what}: the decimal literal {} has {scale} digits after the point (at most {MAX_LITERAL_SCALE})",
            describe(v)
        )));
    }
    Ok(())
}

/// `column OP literal` as one step.
fn compile_cmp(
    schema: &Schema,
    layout: &RowLayout,
    c: u16,
    op: CmpOp,
    v: &Scalar,
    what: &str,
) -> Result<Op, QueryError> {
    let col = column(schema, c, what)?;
    check_literal(col, v, what)?;
    let i = c as usize;
    Ok(match v {
        Scalar::Null => Op::Const(UNKNOWN),
        Scalar::Str(s) => Op::Text {
            col: i,
            op,
            lit: s.as_bytes().into(),
        },
        Scalar::Float(_) => Op::Float {
            c: float_col(layout, i, col.ty),
            op,
            lit: lit_to_f64(v),
        },
        _ if col.ty == ColumnType::Float64 => Op::Float {
            c: float_col(layout, i, col.ty),
            op,
            lit: lit_to_f64(v),
        },
        _ => {
            let (x, sl) = exact_lit(v).expect("kinds checked: an exact literal");
            let sc = col_scale(col.ty);
            let s = sc.max(sl);
            let c = ExactCol {
                col: i,
                offset: fixed_offset(layout, i),
                read: exact_read(col.ty).expect("kinds checked: an exact column"),
                mul: pow10_i128(s - sc),
            };
            let lit = x * pow10_i128(s - sl);
            match i64::try_from(lit) {
                // The column at its own scale and a literal that fits: the
                // common case (`l_discount between 0.05 and 0.07`), compared
                // without i128 arithmetic.
                Ok(lit) if c.mul == 1 => Op::Exact64 {
                    c: Exact64Col {
                        col: i,
                        offset: c.offset,
                        read: c.read,
                    },
                    op,
                    lit,
                },
                _ => Op::Exact { c, op, lit },
            }
        }
    })
}

fn compile_cols(
    schema: &Schema,
    layout: &RowLayout,
    left: u16,
    op: CmpOp,
    right: u16,
    what: &str,
) -> Result<Op, QueryError> {
    let (a, b) = (column(schema, left, what)?, column(schema, right, what)?);
    let (ka, kb) = (Kind::of_column(a.ty), Kind::of_column(b.ty));
    if ka != kb {
        return Err(refuse(format!(
            "{what}: column {:?} ({}) cannot be compared with column {:?} ({})",
            a.name, a.ty, b.name, b.ty
        )));
    }
    let (li, ri) = (left as usize, right as usize);
    let (l, r) = if ka == Kind::Text {
        (Operand::Text(li), Operand::Text(ri))
    } else if a.ty == ColumnType::Float64 || b.ty == ColumnType::Float64 {
        (
            Operand::Float(float_col(layout, li, a.ty)),
            Operand::Float(float_col(layout, ri, b.ty)),
        )
    } else {
        let (sa, sb) = (col_scale(a.ty), col_scale(b.ty));
        let s = sa.max(sb);
        let side = |i, ty, sc| {
            Operand::Exact(ExactCol {
                col: i,
                offset: fixed_offset(layout, i),
                read: exact_read(ty).expect("not float, not text: exact"),
                mul: pow10_i128(s - sc),
            })
        };
        (side(li, a.ty, sa), side(ri, b.ty, sb))
    };
    Ok(Op::Cols { l, r, op })
}

fn compile_in(
    schema: &Schema,
    layout: &RowLayout,
    c: u16,
    values: &[Scalar],
    what: &str,
) -> Result<Op, QueryError> {
    let col = column(schema, c, what)?;
    if values.len() > MAX_IN_LIST {
        return Err(refuse(format!(
            "{what}: an IN list of {} values, more than the limit of {MAX_IN_LIST}",
            values.len()
        )));
    }
    for v in values {
        check_literal(col, v, what)?;
    }
    let i = c as usize;
    // `x IN ()` is the OR of no comparisons: false, even for a NULL x.
    if values.is_empty() {
        return Ok(Op::Const(FALSE));
    }
    let mut list = InList {
        col: i,
        exact: None,
        floats: None,
        text: HashSet::new(),
        has_null: values.iter().any(|v| matches!(v, Scalar::Null)),
    };
    let float_column = col.ty == ColumnType::Float64;
    let mut floats = Vec::new();
    let mut exact = Vec::new();
    for v in values {
        match v {
            Scalar::Null => {}
            Scalar::Str(s) => {
                list.text.insert(s.as_bytes().into());
            }
            Scalar::Float(_) => floats.push(lit_to_f64(v)),
            _ if float_column => floats.push(lit_to_f64(v)),
            _ => exact.push(exact_lit(v).expect("kinds checked: an exact literal")),
        }
    }
    if !floats.is_empty() {
        list.floats = Some((float_col(layout, i, col.ty), floats));
    }
    if !exact.is_empty() {
        let sc = col_scale(col.ty);
        let s = exact.iter().map(|&(_, sl)| sl).max().unwrap_or(0).max(sc);
        let set = exact
            .iter()
            .map(|&(x, sl)| x * pow10_i128(s - sl))
            .collect();
        let read = exact_read(col.ty).expect("kinds checked: an exact column");
        list.exact = Some((
            ExactCol {
                col: i,
                offset: fixed_offset(layout, i),
                read,
                mul: pow10_i128(s - sc),
            },
            set,
        ));
    }
    Ok(Op::In(Box::new(list)))
}

fn text_column<'s>(schema: &'s Schema, c: u16, what: &str) -> Result<&'s Column, QueryError> {
    let col = column(schema, c, what)?;
    if col.ty != ColumnType::Utf8 {
        return Err(refuse(format!(
            "{what}: column {:?} is {}, not text",
            col.name, col.ty
        )));
    }
    Ok(col)
}

/// Check and compile a postfix filter program.
pub(crate) fn compile_filter(schema: &Schema, preds: &[Pred]) -> Result<Filter, QueryError> {
    let layout = &RowLayout::new(schema);
    if preds.len() > MAX_PRED_OPS {
        return Err(refuse(format!(
            "the filter has {} steps, more than the limit of {MAX_PRED_OPS}",
            preds.len()
        )));
    }
    let mut ops = Vec::with_capacity(preds.len() + 4);
    let mut depth = 0usize;
    let mut max_depth = 0usize;
    for (i, p) in preds.iter().enumerate() {
        let what = format!("filter step {i}");
        let what = what.as_str();
        let pushes_leaf = !matches!(p, Pred::And | Pred::Or | Pred::Not);
        match p {
            Pred::Cmp { col, op, value } => {
                ops.push(compile_cmp(schema, layout, *col, *op, value, what)?)
            }
            Pred::CmpCols { left, op, right } => {
                ops.push(compile_cols(schema, layout, *left, *op, *right, what)?)
            }
            Pred::Between { col, lo, hi } => {
                ops.push(compile_cmp(schema, layout, *col, CmpOp::Ge, lo, what)?);
                ops.push(compile_cmp(schema, layout, *col, CmpOp::Le, hi, what)?);
                ops.push(Op::And);
                max_depth = max_depth.max(depth + 2);
            }
            Pred::In { col, values } => ops.push(compile_in(schema, layout, *col, values, what)?),
            Pred::IsNull { col } => {
                column(schema, *col, what)?;
                ops.push(Op::IsNull(*col as usize));
            }
            Pred::Like {
                col,
                pattern,
                case_insensitive,
            } => {
                let c = text_column(schema, *col, what)?;
                let re = like::like(pattern, *case_insensitive)
                    .map_err(|m| refuse(format!("{what} (column {:?}): {m}", c.name)))?;
                ops.push(Op::Match {
                    col: *col as usize,
                    re: Box::new(re),
                });
            }
            Pred::Regex {
                col,
                pattern,
                case_insensitive,
            } => {
                let c = text_column(schema, *col, what)?;
                let re = like::regex(pattern, *case_insensitive)
                    .map_err(|m| refuse(format!("{what} (column {:?}): {m}", c.name)))?;
                ops.push(Op::Match {
                    col: *col as usize,
                    re: Box::new(re),
                });
            }
            Pred::And | Pred::Or => {
                if depth < 2 {
                    return Err(refuse(format!(
                        "the filter is malformed: step {i} ({p:?}) needs two values, the stack holds {depth}"
                    )));
                }
                depth -= 1;
                ops.push(if matches!(p, Pred::And) {
                    Op::And
                } else {
                    Op::Or
                });
            }
            Pred::Not => {
                if depth < 1 {
                    return Err(refuse(format!(
                        "the filter is malformed: step {i} (Not) needs a value, the stack is empty"
                    )));
                }
                ops.push(Op::Not);
            }
        }
        if pushes_leaf {
            depth += 1;
            max_depth = max_depth.max(depth);
        }
    }
    if !preds.is_empty() && depth != 1 {
        return Err(refuse(format!(
            "the filter is malformed: it leaves {depth} values instead of one"
        )));
    }
    assert!(max_depth <= STACK_CAP, "MAX_PRED_OPS bounds the stack");
    Ok(Filter::new(ops, max_depth))
}
