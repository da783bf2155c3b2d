//! Aggregate arguments → postfix `Vec<ValueOp>` programs, with the numeric
//! class (decimal scale, integer or float) of their result.

use arrow_schema::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Expr, Operator};
use insitu_protocol::query::{MAX_AGGS, Scalar, ValueOp};
use insitu_protocol::schema::{ColumnType, Schema};

use super::{Refusal, col_ref, int_value};

/// An aggregate argument as a postfix arithmetic program, with its numeric
/// class: the decimal scale of an exact (integer/decimal) result, or None
/// for a float result.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueProgram {
    pub ops: Vec<ValueOp>,
    /// Scale of the exact result (0 for integers), or None when any operand
    /// is a float (the servers then compute in f64).
    pub scale: Option<u8>,
    /// Whether every operand is an integer column or literal (scale 0, no
    /// decimal column involved).
    pub integer: bool,
    /// For a single column argument: its type (MIN/MAX of text, dates...).
    pub column: Option<ColumnType>,
}

/// Translate an aggregate's argument.
pub fn value_program(expr: &Expr, schema: &Schema) -> Result<ValueProgram, Refusal> {
    let mut ops = Vec::new();
    let num = value(expr, schema, &mut ops)?;
    if ops.len() > MAX_AGGS {
        return Err(format!(
            "argument of {} steps: more than the limit of {MAX_AGGS}",
            ops.len()
        ));
    }
    let column = match ops.as_slice() {
        [ValueOp::Col(c)] => Some(schema.columns[*c as usize].ty),
        _ => None,
    };
    let (scale, integer) = match num {
        Num::Exact { scale, integer } => (Some(scale), integer),
        Num::Float | Num::Other => (None, false),
    };
    Ok(ValueProgram {
        ops,
        scale,
        integer,
        column,
    })
}

/// The numeric class of an argument's value.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    /// Exact, at this decimal scale; `integer` when no decimal is involved.
    Exact {
        scale: u8,
        integer: bool,
    },
    Float,
    /// A bare non-numeric column (MIN/MAX of text, dates, booleans).
    Other,
}

/// Push `e`'s steps and return its class.
fn value(e: &Expr, schema: &Schema, out: &mut Vec<ValueOp>) -> Result<Num, Refusal> {
    match e {
        Expr::Alias(a) => value(&a.expr, schema, out),
        // A widening cast of an expression (DataFusion sums int32 as
        // int64): the value is unchanged, so the program is the inner one.
        Expr::Cast(c) if !matches!(c.expr.as_ref(), Expr::Column(_)) => {
            let num = value(&c.expr, schema, out)?;
            let ok = match (num, c.field.data_type()) {
                (Num::Exact { integer: true, .. }, DataType::Int64) => true,
                (Num::Exact { scale, .. }, DataType::Decimal128(_, t)) => {
                    *t >= 0 && *t as u8 >= scale
                }
                (Num::Float, DataType::Float64) => true,
                _ => false,
            };
            if !ok {
                return Err(format!("{e}: the cast may change values"));
            }
            Ok(num)
        }
        Expr::Column(_) | Expr::Cast(_) | Expr::TryCast(_) => {
            let c = col_ref(e, schema)?;
            out.push(ValueOp::Col(c.idx));
            Ok(match c.ty {
                ColumnType::Int32 | ColumnType::Int64 => Num::Exact {
                    scale: 0,
                    integer: true,
                },
                ColumnType::Decimal { scale, .. } => Num::Exact {
                    scale,
                    integer: false,
                },
                ColumnType::Float64 => Num::Float,
                _ => Num::Other,
            })
        }
        Expr::Literal(v, _) => {
            let (s, r) = match v {
                ScalarValue::Decimal128(Some(x), _, s) if *s >= 0 => {
                    let value = i64::try_from(*x).map_err(|_| format!("literal {v} overflows"))?;
                    let scale = *s as u8;
                    (
                        Scalar::Decimal { value, scale },
                        Num::Exact {
                            scale,
                            integer: false,
                        },
                    )
                }
                ScalarValue::Float64(Some(f)) => (Scalar::Float(*f), Num::Float),
                _ => match int_value(v) {
                    Some(i) => (
                        Scalar::Int(i),
                        Num::Exact {
                            scale: 0,
                            integer: true,
                        },
                    ),
                    None => return Err(format!("literal {v} in an aggregate argument")),
                },
            };
            out.push(ValueOp::Lit(s));
            Ok(r)
        }
        Expr::Negative(inner) => {
            let r = value(inner, schema, out)?;
            if r == Num::Other {
                return Err(format!("{e}: negation of a non-number"));
            }
            out.push(ValueOp::Neg);
            Ok(r)
        }
        Expr::BinaryExpr(b) => {
            let step = match b.op {
                Operator::Plus => ValueOp::Add,
                Operator::Minus => ValueOp::Sub,
                Operator::Multiply => ValueOp::Mul,
                op => return Err(format!("operator {op} in an aggregate argument")),
            };
            let l = value(&b.left, schema, out)?;
            let r = value(&b.right, schema, out)?;
            let num = match (l, r) {
                (Num::Other, _) | (_, Num::Other) => {
                    return Err(format!("{e}: arithmetic on a non-number"));
                }
                (
                    Num::Exact {
                        scale: a,
                        integer: ai,
                    },
                    Num::Exact {
                        scale: c,
                        integer: ci,
                    },
                ) => {
                    let scale = if step == ValueOp::Mul {
                        a.checked_add(c).filter(|s| *s <= 38)
                    } else {
                        Some(a.max(c))
                    };
                    let scale = scale.ok_or_else(|| format!("{e}: scale above 38"))?;
                    Num::Exact {
                        scale,
                        integer: ai && ci,
                    }
                }
                _ => Num::Float,
            };
            out.push(step);
            Ok(num)
        }
        other => Err(format!("{other} in an aggregate argument")),
    }
}
