//! An aggregate's argument: a postfix `ValueOp` program type-checked once
//! (`compile_arg`) and evaluated per row without allocation.
//!
//! Integers and decimals compute exactly in i128 with the scale tracked at
//! compile time: `Add`/`Sub` first multiply the operand of smaller scale by
//! 10^(difference), `Mul` adds the scales. Once an operand is a float the
//! step computes in f64 (the exact side converted by `exact_to_f64`). A NULL
//! operand makes the result NULL. Overflow of i128 is an error, never a
//! wrapped value.

use insitu_protocol::query::{MAX_AGGS, Scalar, ValueOp};
use insitu_protocol::schema::{ColumnType, Schema};
use insitu_rows::RowRef;

use crate::QueryError;
use crate::exact::ExactProgram;
use crate::filter::{ExactCol, ExactRead, fixed_offset};
use crate::value::{exact_to_f64, pow10_i128};

/// Largest scale a computed decimal may have (Arrow's Decimal128 holds 38
/// digits).
pub const MAX_COMPUTED_SCALE: u32 = 38;

/// The type of an aggregate's argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgType {
    /// An integer (int32/int64 columns and integer arithmetic).
    Int,
    /// An exact decimal with this many digits after the point.
    Decimal(u32),
    Float,
    Date,
    Text,
    Bool,
}

impl ArgType {
    pub fn of_column(ty: ColumnType) -> ArgType {
        match ty {
            ColumnType::Int32 | ColumnType::Int64 => ArgType::Int,
            ColumnType::Decimal { scale, .. } => ArgType::Decimal(u32::from(scale)),
            ColumnType::Float64 => ArgType::Float,
            ColumnType::Date32 => ArgType::Date,
            ColumnType::Utf8 => ArgType::Text,
            ColumnType::Bool => ArgType::Bool,
        }
    }

    /// Scale of an exact number (0 for integers and non-numbers).
    pub fn scale(self) -> u32 {
        match self {
            ArgType::Decimal(s) => s,
            _ => 0,
        }
    }

    pub fn is_numeric(self) -> bool {
        matches!(self, ArgType::Int | ArgType::Decimal(_) | ArgType::Float)
    }

    fn is_exact(self) -> bool {
        matches!(self, ArgType::Int | ArgType::Decimal(_))
    }
}

/// One value of an argument for one row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Val<'r> {
    Null,
    /// Unscaled, at the argument's scale (dates as days, bools as 0/1).
    Exact(i128),
    Float(f64),
    Bytes(&'r [u8]),
}

/// How an operand is brought to a step's type.
#[derive(Clone, Copy, Debug)]
pub enum Conv {
    Keep,
    /// Multiply an exact value by this power of ten.
    Scale(i128),
    /// An exact value of this scale to f64.
    ToFloat(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
}

#[derive(Clone, Debug)]
pub enum Step {
    Exact(ExactCol),
    Float(usize),
    Lit(Val<'static>),
    Bin {
        op: BinOp,
        l: Conv,
        r: Conv,
        float: bool,
    },
    Neg,
}

/// A compiled argument.
#[derive(Clone, Debug)]
pub enum Arg {
    /// `count(*)`.
    None,
    /// One column of any type, read as is.
    Col { col: usize, ty: ColumnType },
    /// Arithmetic on numbers.
    Program(Vec<Step>),
    /// Arithmetic on exact numbers only: the same answers as `Program`,
    /// computed faster (`exact.rs` says how).
    Exact(ExactProgram),
}

pub(crate) fn overflow() -> QueryError {
    QueryError::Eval("arithmetic overflow in an aggregate's argument (beyond 128 bits)".into())
}

fn conv(v: Val<'static>, c: Conv) -> Result<Val<'static>, QueryError> {
    Ok(match (v, c) {
        (Val::Exact(x), Conv::Scale(m)) => Val::Exact(x.checked_mul(m).ok_or_else(overflow)?),
        (Val::Exact(x), Conv::ToFloat(s)) => Val::Float(exact_to_f64(x, s)),
        (v, _) => v,
    })
}

impl Arg {
    /// The argument's value for `row`. `stack` is scratch space (kept by the
    /// caller so no row allocates).
    pub fn eval<'r>(
        &self,
        row: &RowRef<'r>,
        stack: &mut Vec<Val<'static>>,
    ) -> Result<Val<'r>, QueryError> {
        match self {
            Arg::None => Ok(Val::Null),
            Arg::Col { col, ty } => Ok(read_col(row, *col, *ty)),
            Arg::Exact(p) => p.eval(row),
            Arg::Program(steps) => {
                stack.clear();
                for s in steps {
                    let v = match s {
                        Step::Exact(c) => {
                            if row.is_null(c.col) {
                                Val::Null
                            } else {
                                Val::Exact(c.get(row))
                            }
                        }
                        Step::Float(col) => {
                            if row.is_null(*col) {
                                Val::Null
                            } else {
                                Val::Float(row.f64(*col))
                            }
                        }
                        Step::Lit(v) => *v,
                        Step::Neg => match stack.pop() {
                            Some(Val::Exact(x)) => {
                                Val::Exact(x.checked_neg().ok_or_else(overflow)?)
                            }
                            Some(Val::Float(x)) => Val::Float(-x),
                            _ => Val::Null,
                        },
                        Step::Bin { op, l, r, float } => {
                            let (Some(b), Some(a)) = (stack.pop(), stack.pop()) else {
                                unreachable!("compile_arg checks the stack")
                            };
                            let (a, b) = (conv(a, *l)?, conv(b, *r)?);
                            match (a, b) {
                                (Val::Null, _) | (_, Val::Null) => Val::Null,
                                (Val::Float(x), Val::Float(y)) if *float => Val::Float(match op {
                                    BinOp::Add => x + y,
                                    BinOp::Sub => x - y,
                                    BinOp::Mul => x * y,
                                }),
                                (Val::Exact(x), Val::Exact(y)) => Val::Exact(
                                    match op {
                                        BinOp::Add => x.checked_add(y),
                                        BinOp::Sub => x.checked_sub(y),
                                        BinOp::Mul => x.checked_mul(y),
                                    }
                                    .ok_or_else(overflow)?,
                                ),
                                _ => unreachable!("compile_arg types every step"),
                            }
                        }
                    };
                    stack.push(v);
                }
                Ok(stack.pop().unwrap_or(Val::Null))
            }
        }
    }
}

/// A column's value as a `Val`, read from its raw bytes.
pub fn read_col<'r>(row: &RowRef<'r>, col: usize, ty: ColumnType) -> Val<'r> {
    if row.is_null(col) {
        return Val::Null;
    }
    match ty {
        ColumnType::Int32 | ColumnType::Date32 => Val::Exact(i128::from(row.i32(col))),
        ColumnType::Int64 | ColumnType::Decimal { .. } => Val::Exact(i128::from(row.i64(col))),
        ColumnType::Float64 => Val::Float(row.f64(col)),
        ColumnType::Bool => Val::Exact(i128::from(row.bool(col))),
        ColumnType::Utf8 => Val::Bytes(row.var(col)),
    }
}

fn exact_read(ty: ColumnType) -> Option<ExactRead> {
    match ty {
        ColumnType::Int32 | ColumnType::Date32 => Some(ExactRead::I32),
        ColumnType::Int64 | ColumnType::Decimal { .. } => Some(ExactRead::I64),
        _ => None,
    }
}

/// Check an argument program against the schema: its type, and the
/// compiled steps. `what` names the aggregate in errors. An empty program is
/// `count(*)`'s (no value, `ArgType` None).
pub fn compile_arg(
    schema: &Schema,
    prog: &[ValueOp],
    what: &str,
) -> Result<(Arg, Option<ArgType>), QueryError> {
    Ok(match compile_general(schema, prog, what)? {
        (Arg::Program(steps), ty) => match ExactProgram::from_steps(&steps) {
            Some(exact) => (Arg::Exact(exact), ty),
            None => (Arg::Program(steps), ty),
        },
        other => other,
    })
}

/// `compile_arg` without the choice of the exact evaluator: arithmetic is
/// always an `Arg::Program` (the reference the exact form is tested
/// against).
pub(crate) fn compile_general(
    schema: &Schema,
    prog: &[ValueOp],
    what: &str,
) -> Result<(Arg, Option<ArgType>), QueryError> {
    let refuse = |m: String| QueryError::Plan(format!("{what}: {m}"));
    if prog.is_empty() {
        return Ok((Arg::None, None));
    }
    if prog.len() > MAX_AGGS {
        return Err(refuse(format!(
            "its argument has {} steps, more than the limit of {MAX_AGGS}",
            prog.len()
        )));
    }
    let column = |c: u16| {
        schema.columns.get(c as usize).ok_or_else(|| {
            refuse(format!(
                "column {c} does not exist (the table has {} columns)",
                schema.columns.len()
            ))
        })
    };
    // A single column of any type is read as it is (min/max of text, ...).
    if let [ValueOp::Col(c)] = prog {
        let col = column(*c)?;
        return Ok((
            Arg::Col {
                col: *c as usize,
                ty: col.ty,
            },
            Some(ArgType::of_column(col.ty)),
        ));
    }
    let layout = insitu_rows::RowLayout::new(schema);
    let mut types: Vec<ArgType> = Vec::new();
    let mut steps = Vec::with_capacity(prog.len());
    for (i, op) in prog.iter().enumerate() {
        let pop = |types: &mut Vec<ArgType>| {
            types
                .pop()
                .ok_or_else(|| refuse(format!("step {i} ({op:?}) has no operand")))
        };
        match op {
            ValueOp::Col(c) => {
                let col = column(*c)?;
                let ty = ArgType::of_column(col.ty);
                match (col.ty, exact_read(col.ty)) {
                    (ColumnType::Float64, _) => steps.push(Step::Float(*c as usize)),
                    (
                        ColumnType::Int32 | ColumnType::Int64 | ColumnType::Decimal { .. },
                        Some(read),
                    ) => steps.push(Step::Exact(ExactCol {
                        col: *c as usize,
                        offset: fixed_offset(&layout, *c as usize),
                        read,
                        mul: 1,
                    })),
                    _ => {
                        return Err(refuse(format!(
                            "column {:?} ({}) cannot be used in arithmetic",
                            col.name, col.ty
                        )));
                    }
                }
                types.push(ty);
            }
            ValueOp::Lit(v) => {
                let (val, ty) = match *v {
                    Scalar::Null => (Val::Null, ArgType::Int),
                    Scalar::Int(i) => (Val::Exact(i128::from(i)), ArgType::Int),
                    Scalar::Decimal { value, scale } if u32::from(scale) <= MAX_COMPUTED_SCALE => (
                        Val::Exact(i128::from(value)),
                        ArgType::Decimal(u32::from(scale)),
                    ),
                    Scalar::Float(f) => (Val::Float(f), ArgType::Float),
                    _ => {
                        return Err(refuse(format!(
                            "the literal {} cannot be used in arithmetic",
                            crate::value::describe(v)
                        )));
                    }
                };
                steps.push(Step::Lit(val));
                types.push(ty);
            }
            ValueOp::Neg => {
                let t = pop(&mut types)?;
                types.push(t);
                steps.push(Step::Neg);
            }
            ValueOp::Add | ValueOp::Sub | ValueOp::Mul => {
                let b = pop(&mut types)?;
                let a = pop(&mut types)?;
                let op = match op {
                    ValueOp::Add => BinOp::Add,
                    ValueOp::Sub => BinOp::Sub,
                    _ => BinOp::Mul,
                };
                let (l, r, float, ty) = if a.is_exact() && b.is_exact() {
                    let both_int = a == ArgType::Int && b == ArgType::Int;
                    let (sa, sb) = (a.scale(), b.scale());
                    let (l, r, s) = match op {
                        BinOp::Mul => (Conv::Keep, Conv::Keep, sa + sb),
                        _ => {
                            let s = sa.max(sb);
                            (
                                Conv::Scale(pow10_i128(s - sa)),
                                Conv::Scale(pow10_i128(s - sb)),
                                s,
                            )
                        }
                    };
                    if s > MAX_COMPUTED_SCALE {
                        return Err(refuse(format!(
                            "step {i} would compute a decimal with {s} digits after the point \
                             (at most {MAX_COMPUTED_SCALE})"
                        )));
                    }
                    let ty = if both_int {
                        ArgType::Int
                    } else {
                        ArgType::Decimal(s)
                    };
                    (l, r, false, ty)
                } else {
                    let to_f = |t: ArgType| {
                        if t.is_exact() {
                            Conv::ToFloat(t.scale())
                        } else {
                            Conv::Keep
                        }
                    };
                    (to_f(a), to_f(b), true, ArgType::Float)
                };
                steps.push(Step::Bin { op, l, r, float });
                types.push(ty);
            }
        }
    }
    if types.len() != 1 {
        return Err(refuse(format!(
            "its argument leaves {} values instead of one",
            types.len()
        )));
    }
    Ok((Arg::Program(steps), Some(types[0])))
}
