//! An aggregate's argument made of exact arithmetic only (integer and
//! decimal columns and literals, `+ - *`, negation): evaluated on plain
//! integers, in i64 first and again in i128 only when i64 overflows.
//!
//! Why a second evaluator beside `Arg::Program`: that one moves a tagged
//! `Val` (32 bytes) through a `Vec` per step, checks each operand for NULL
//! and multiplies in i128; TPC-H Q1's `l_extendedprice * (1 - l_discount) *
//! (1 + l_tax)` runs on nearly every row. Here the NULL check is one pass
//! over the columns read (every step propagates NULL, so any NULL operand
//! makes the value NULL), the stack is a small array, and the common case
//! (values far from 2^63) costs i64 multiplies. The answer is the same: the
//! i64 pass either gives the exact value or overflows and the i128 pass,
//! which is `Arg::Program`'s arithmetic, decides.

use insitu_rows::RowRef;

use crate::QueryError;
use crate::arith::{BinOp, Conv, Step, Val, overflow};
use crate::filter::{ExactRead, read_at, read_i64};

/// Deepest stack an exact program may need (deeper programs keep the
/// general evaluator): Q1's deepest argument needs 3.
pub(crate) const DEPTH: usize = 8;

/// Where a row holds a column an exact program reads: its offset and how to
/// read it (also what tells a batch's input columns apart).
pub(crate) type RowCol = (usize, ExactRead);

/// A step of an exact program. `C` names a column: where a row holds it, or,
/// in a batch program (`exact_batch.rs`), the input column of its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum XStep<C = RowCol> {
    /// A column's value (its NULL was checked up front).
    Col(C),
    Lit(i128),
    Neg,
    /// `(a * l) op (b * r)`: `l` and `r` bring both operands to the step's
    /// scale (1 when already there).
    Bin {
        op: BinOp,
        l: i128,
        r: i128,
    },
}

impl<C> XStep<C> {
    /// The same step with its column (if any) named by `f`.
    pub(crate) fn map_col<D>(self, f: impl FnOnce(C) -> D) -> XStep<D> {
        match self {
            XStep::Col(c) => XStep::Col(f(c)),
            XStep::Lit(v) => XStep::Lit(v),
            XStep::Neg => XStep::Neg,
            XStep::Bin { op, l, r } => XStep::Bin { op, l, r },
        }
    }
}

/// An operand the i64 pass reads without the stack.
#[derive(Clone, Copy, Debug)]
enum Imm {
    Col { offset: usize, read: ExactRead },
    Lit(i64),
}

impl Imm {
    #[inline]
    fn get(self, row: &RowRef<'_>) -> i64 {
        match self {
            Imm::Col { offset, read } => read_i64(row, offset, read),
            Imm::Lit(v) => v,
        }
    }
}

/// A step of the i64 pass: `XStep`s with a binary operator fused with the
/// pushes of its operands where they come right before it. Why: Q1's
/// `l_extendedprice * (1 - l_discount) * (1 + l_tax)` is 9 steps, 5 fused,
/// and each step is a dispatch and stack traffic.
#[derive(Clone, Copy, Debug)]
enum NStep {
    Push(Imm),
    Neg,
    /// Both operands from the stack.
    Bin {
        op: BinOp,
        l: i64,
        r: i64,
    },
    /// Both operands immediate: pushes the result.
    BinImm {
        op: BinOp,
        a: Imm,
        b: Imm,
        l: i64,
        r: i64,
    },
    /// The left operand from the stack, the right immediate.
    BinTop {
        op: BinOp,
        b: Imm,
        l: i64,
        r: i64,
    },
}

/// `(a * l) op (b * r)` in i64; None on overflow.
#[inline]
fn bin_i64(op: BinOp, a: i64, b: i64, l: i64, r: i64) -> Option<i64> {
    let (a, b) = (a.checked_mul(l)?, b.checked_mul(r)?);
    match op {
        BinOp::Add => a.checked_add(b),
        BinOp::Sub => a.checked_sub(b),
        BinOp::Mul => a.checked_mul(b),
    }
}

/// `(a * l) op (b * r)` in i128: the arithmetic of `Arg::Program`, shared
/// by the row and batch (`exact_batch.rs`) evaluators; an error past i128.
fn bin_i128(op: BinOp, a: i128, b: i128, l: i128, r: i128) -> Result<i128, QueryError> {
    let a = a.checked_mul(l).ok_or_else(overflow)?;
    let b = b.checked_mul(r).ok_or_else(overflow)?;
    match op {
        BinOp::Add => a.checked_add(b),
        BinOp::Sub => a.checked_sub(b),
        BinOp::Mul => a.checked_mul(b),
    }
    .ok_or_else(overflow)
}

/// The i128 pass over `steps`, each column's value given by `read`, from a
/// stack holding `init` when given: shared by the row evaluator and the
/// batch's fallback (`exact_batch.rs`) so both decide overflow alike.
#[inline]
pub(crate) fn run_i128_steps<C: Copy>(
    steps: &[XStep<C>],
    init: Option<i128>,
    mut read: impl FnMut(C) -> i128,
) -> Result<i128, QueryError> {
    let mut stack = [0i128; DEPTH];
    let mut sp = 0usize;
    if let Some(v) = init {
        stack[0] = v;
        sp = 1;
    }
    for &s in steps {
        match s {
            XStep::Col(c) => {
                stack[sp] = read(c);
                sp += 1;
            }
            XStep::Lit(v) => {
                stack[sp] = v;
                sp += 1;
            }
            XStep::Neg => stack[sp - 1] = stack[sp - 1].checked_neg().ok_or_else(overflow)?,
            XStep::Bin { op, l, r } => {
                sp -= 1;
                stack[sp - 1] = bin_i128(op, stack[sp - 1], stack[sp], l, r)?;
            }
        }
    }
    Ok(stack[0])
}

/// The i64 steps of `steps` (every literal and factor fits i64).
fn narrow_steps(steps: &[XStep]) -> Vec<NStep> {
    let mut out: Vec<NStep> = Vec::with_capacity(steps.len());
    for s in steps {
        let n = match *s {
            XStep::Col((offset, read)) => NStep::Push(Imm::Col { offset, read }),
            XStep::Lit(v) => NStep::Push(Imm::Lit(v as i64)),
            XStep::Neg => NStep::Neg,
            XStep::Bin { op, l, r } => {
                let (l, r) = (l as i64, r as i64);
                match out.as_slice() {
                    [.., NStep::Push(a), NStep::Push(b)] => {
                        let (a, b) = (*a, *b);
                        out.truncate(out.len() - 2);
                        NStep::BinImm { op, a, b, l, r }
                    }
                    [.., NStep::Push(b)] => {
                        let b = *b;
                        out.pop();
                        NStep::BinTop { op, b, l, r }
                    }
                    _ => NStep::Bin { op, l, r },
                }
            }
        };
        out.push(n);
    }
    out
}

/// A compiled all-exact argument.
#[derive(Clone, Debug)]
pub struct ExactProgram {
    /// Every column the program reads: one NULL makes the value NULL.
    cols: Vec<usize>,
    /// The program for the i128 pass.
    steps: Vec<XStep>,
    /// The program for the i64 pass; empty when some literal or scale
    /// factor does not fit i64 (then only the i128 pass runs).
    narrow: Vec<NStep>,
}

impl ExactProgram {
    /// The exact form of a checked program, or None when a step is not
    /// exact (a float, a NULL literal) or the stack would be deeper than
    /// `DEPTH`.
    pub fn from_steps(steps: &[Step]) -> Option<ExactProgram> {
        let mut cols = Vec::new();
        let mut out = Vec::with_capacity(steps.len());
        let mut depth = 0usize;
        for s in steps {
            let x = match s {
                Step::Exact(c) if c.mul == 1 => {
                    if !cols.contains(&c.col) {
                        cols.push(c.col);
                    }
                    XStep::Col((c.offset, c.read))
                }
                Step::Lit(Val::Exact(v)) => XStep::Lit(*v),
                Step::Neg => XStep::Neg,
                Step::Bin {
                    op,
                    l,
                    r,
                    float: false,
                } => {
                    let factor = |c: &Conv| match c {
                        Conv::Keep => Some(1),
                        Conv::Scale(m) => Some(*m),
                        Conv::ToFloat(_) => None,
                    };
                    XStep::Bin {
                        op: *op,
                        l: factor(l)?,
                        r: factor(r)?,
                    }
                }
                _ => return None,
            };
            match x {
                XStep::Col(_) | XStep::Lit(_) => depth += 1,
                XStep::Bin { .. } => depth = depth.checked_sub(1)?,
                XStep::Neg => {}
            }
            if depth > DEPTH {
                return None;
            }
            out.push(x);
        }
        let fits = |v: i128| i64::try_from(v).is_ok();
        let narrow = if out.iter().all(|s| match *s {
            XStep::Lit(v) => fits(v),
            XStep::Bin { l, r, .. } => fits(l) && fits(r),
            _ => true,
        }) {
            narrow_steps(&out)
        } else {
            Vec::new()
        };
        Some(ExactProgram {
            cols,
            steps: out,
            narrow,
        })
    }

    /// The value for `row`: NULL, or the exact result; an error if it
    /// does not fit i128.
    #[inline]
    pub fn eval(&self, row: &RowRef<'_>) -> Result<Val<'static>, QueryError> {
        if self.cols.iter().any(|&c| row.is_null(c)) {
            return Ok(Val::Null);
        }
        self.eval_present(row).map(Val::Exact)
    }

    /// The value for a row where none of `columns()` is NULL (the caller
    /// tested them).
    #[inline]
    pub fn eval_present(&self, row: &RowRef<'_>) -> Result<i128, QueryError> {
        if !self.narrow.is_empty()
            && let Some(v) = self.run_i64(row)
        {
            return Ok(i128::from(v));
        }
        self.run_i128(row)
    }

    /// The rest of this program after its first `prefix.steps` steps, when
    /// `prefix` is a shorter program those steps equal: it starts from the
    /// stack `[prefix's value]` (`exact_batch.rs`). None otherwise. Why: TPC-H
    /// Q1's `sum(disc_price * (1 + l_tax))` starts with all of
    /// `sum(disc_price)`'s steps; computed once, the second costs 4 steps
    /// instead of 9.
    pub fn after(&self, prefix: &ExactProgram) -> Option<ExactProgram> {
        let k = prefix.steps.len();
        if k >= self.steps.len() || self.steps[..k] != prefix.steps[..] {
            return None;
        }
        let steps = self.steps[k..].to_vec();
        // The i64 pass exists for the rest when it exists for the whole.
        let narrow = if self.narrow.is_empty() {
            Vec::new()
        } else {
            narrow_steps(&steps)
        };
        Some(ExactProgram {
            cols: self.cols.clone(),
            steps,
            narrow,
        })
    }

    /// The same computation as `other` (equal steps).
    pub fn same(&self, other: &ExactProgram) -> bool {
        self.steps == other.steps
    }

    /// Steps in the program (its length, for picking the longest prefix).
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// The steps, for the batch evaluator (`exact_batch.rs`).
    pub(crate) fn steps(&self) -> &[XStep] {
        &self.steps
    }

    /// Every literal and scale factor fits i64: an i64 pass may run.
    pub(crate) fn fits_i64(&self) -> bool {
        !self.narrow.is_empty()
    }

    /// The columns the program reads.
    pub fn columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.cols.iter().copied()
    }

    /// The program in i64; None on any overflow.
    #[inline]
    fn run_i64(&self, row: &RowRef<'_>) -> Option<i64> {
        let mut stack = [0i64; DEPTH];
        let mut sp = 0usize;
        for s in &self.narrow {
            match *s {
                NStep::Push(v) => {
                    stack[sp] = v.get(row);
                    sp += 1;
                }
                NStep::Neg => stack[sp - 1] = stack[sp - 1].checked_neg()?,
                NStep::Bin { op, l, r } => {
                    sp -= 1;
                    stack[sp - 1] = bin_i64(op, stack[sp - 1], stack[sp], l, r)?;
                }
                NStep::BinImm { op, a, b, l, r } => {
                    stack[sp] = bin_i64(op, a.get(row), b.get(row), l, r)?;
                    sp += 1;
                }
                NStep::BinTop { op, b, l, r } => {
                    stack[sp - 1] = bin_i64(op, stack[sp - 1], b.get(row), l, r)?;
                }
            }
        }
        Some(stack[0])
    }

    /// The program in i128, as `Arg::Program` computes it.
    fn run_i128(&self, row: &RowRef<'_>) -> Result<i128, QueryError> {
        run_i128_steps(&self.steps, None, |(offset, read)| {
            read_at(row, offset, read)
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use insitu_protocol::query::{Scalar, ValueOp};
    use insitu_protocol::schema::{Column, ColumnType, Schema};
    use insitu_rows::{RowLayout, encode_row};

    use super::*;
    use crate::arith::{Arg, compile_general};

    /// (k int64, d decimal(15,2)): the rows these tests and
    /// `exact_batch.rs`'s evaluate programs over.
    pub(crate) fn schema() -> Schema {
        let col = |name: &str, ty| Column::new(name, ty, true);
        Schema {
            columns: vec![
                col("k", ColumnType::Int64),
                col(
                    "d",
                    ColumnType::Decimal {
                        precision: 15,
                        scale: 2,
                    },
                ),
            ],
            key: vec![0],
        }
    }

    /// `p` over `schema()` compiled to its exact form.
    pub(crate) fn exact(p: &[ValueOp]) -> ExactProgram {
        match compile_general(&schema(), p, "t").expect("compiles").0 {
            Arg::Program(s) => ExactProgram::from_steps(&s).expect("exact"),
            a => panic!("{a:?}"),
        }
    }

    /// `prog` over the row (k, d) by the exact program and by the general
    /// one; both must agree, and the exact form must have been chosen.
    fn both(prog: &[ValueOp], k: Option<i64>, d: Option<i64>) -> Result<Val<'static>, String> {
        let schema = schema();
        let (arg, _) = compile_general(&schema, prog, "test").expect("compiles");
        let Arg::Program(steps) = &arg else {
            panic!("a program")
        };
        let exact = ExactProgram::from_steps(steps).expect("all exact");
        let layout = RowLayout::new(&schema);
        let bytes = encode_row(
            &schema,
            &layout,
            &[
                k.map_or(Scalar::Null, Scalar::Int),
                d.map_or(Scalar::Null, |value| Scalar::Decimal { value, scale: 2 }),
            ],
        )
        .expect("row");
        let r = RowRef::new(&layout, &bytes).expect("row");
        let mut stack = Vec::new();
        let general = arg.eval(&r, &mut stack).map_err(|e| e.to_string());
        let fast = exact.eval(&r).map_err(|e| e.to_string());
        assert_eq!(fast, general, "{prog:?} at k={k:?} d={d:?}");
        fast
    }

    #[test]
    fn agrees_with_the_general_evaluator_past_i64_and_at_i128_overflow() {
        use ValueOp::*;
        // k * (1 - d) + d: scales 0 and 2 meet.
        let p = [Col(0), Lit(Scalar::Int(1)), Col(1), Sub, Mul, Col(1), Add];
        assert_eq!(both(&p, Some(3), Some(25)), Ok(Val::Exact(3 * 75 + 25)));
        assert_eq!(both(&p, None, Some(25)), Ok(Val::Null));
        // Beyond i64 but inside i128: the i64 pass overflows, i128 answers.
        let sq = [Col(0), Col(0), Mul];
        let big = i64::MAX;
        assert_eq!(
            both(&sq, Some(big), Some(0)),
            Ok(Val::Exact(i128::from(big) * i128::from(big)))
        );
        assert_eq!(
            both(&[Col(0), Neg], Some(i64::MIN), Some(0)),
            Ok(Val::Exact(-i128::from(i64::MIN)))
        );
        // Beyond i128: both refuse.
        let cube = [Col(0), Col(0), Mul, Col(0), Mul];
        assert!(both(&cube, Some(big), Some(0)).is_err());
    }

    #[test]
    fn operators_fuse_with_the_pushes_right_before_them() {
        use ValueOp::*;
        // k, (1 - d) from two immediates, *, then + d with d immediate.
        let p = exact(&[Col(0), Lit(Scalar::Int(1)), Col(1), Sub, Mul, Col(1), Add]);
        assert!(matches!(
            p.narrow.as_slice(),
            [
                NStep::Push(Imm::Col { .. }),
                NStep::BinImm {
                    op: BinOp::Sub,
                    a: Imm::Lit(1),
                    b: Imm::Col { .. },
                    l: 100,
                    r: 1
                },
                NStep::Bin { op: BinOp::Mul, .. },
                NStep::BinTop { op: BinOp::Add, .. },
            ]
        ));
        // A scale factor beyond i64 (10^20): no i64 pass at all.
        let wide = exact(&[
            Col(0),
            Lit(Scalar::Decimal {
                value: 1,
                scale: 20,
            }),
            Add,
        ]);
        assert!(wide.narrow.is_empty());
        assert_eq!(
            both(
                &[
                    Col(0),
                    Lit(Scalar::Int(i64::MAX)),
                    Lit(Scalar::Int(i64::MAX)),
                    Mul,
                    Add
                ],
                Some(1),
                Some(0)
            ),
            Ok(Val::Exact(i128::from(i64::MAX) * i128::from(i64::MAX) + 1))
        );
    }

    #[test]
    fn floats_null_literals_and_deep_programs_keep_the_general_evaluator() {
        use ValueOp::*;
        let schema = schema();
        let steps = |p: &[ValueOp]| match compile_general(&schema, p, "t").expect("compiles").0 {
            Arg::Program(s) => s,
            a => panic!("{a:?}"),
        };
        let float = steps(&[Col(0), Lit(Scalar::Float(0.5)), Mul]);
        assert!(ExactProgram::from_steps(&float).is_none());
        let null = steps(&[Lit(Scalar::Null), Col(0), Add]);
        assert!(ExactProgram::from_steps(&null).is_none());
        // 9 values pushed before the first operator: deeper than DEPTH.
        let mut deep: Vec<ValueOp> = (0..9).map(|_| Col(0)).collect();
        deep.extend((0..8).map(|_| Add));
        assert!(ExactProgram::from_steps(&steps(&deep)).is_none());
    }
}
