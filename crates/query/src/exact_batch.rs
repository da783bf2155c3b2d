//! Exact programs (`exact.rs`) over a batch of rows at once, one step at a
//! time over whole columns of values.
//!
//! Why: row by row, every step of a program is a dispatch on the step and
//! on its operands' kinds, and TPC-H Q1 runs two programs on nearly every
//! row; over a batch the dispatch happens once per step per batch and each
//! step is a tight loop over plain `i64`s. The answers are the row
//! evaluator's: the i64 pass records whether any operation overflowed, and
//! if one did, the whole batch is computed again in i128 row by row (the
//! arithmetic of `ExactProgram::run_i128`, which decides overflow errors).

use crate::QueryError;
use crate::agg_fast::input;
use crate::arith::BinOp;
use crate::exact::{DEPTH, ExactProgram, XStep, run_i128_steps};
use crate::filter::ExactRead;

/// A step reading batch columns instead of row bytes: `Col(k)` is input
/// column `k` of the batch.
type BStep = XStep<usize>;

/// An exact program over a batch's input columns.
#[derive(Clone, Debug)]
pub(crate) struct BatchProgram {
    steps: Vec<BStep>,
    /// Every literal and factor fits i64: the i64 pass may run.
    fits_i64: bool,
}

/// Columns the i64 pass works in, kept between batches (no allocation per
/// batch once they have grown).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    stack: Vec<Vec<i64>>,
}

impl BatchProgram {
    /// `p` reading batch columns: each (offset, read) it reads is found in,
    /// or added to, `inputs` (the batch's input columns).
    pub fn new(p: &ExactProgram, inputs: &mut Vec<(usize, ExactRead)>) -> BatchProgram {
        let steps = p
            .steps()
            .iter()
            .map(|s| s.map_col(|col| input(inputs, col)))
            .collect();
        BatchProgram {
            steps,
            fits_i64: p.fits_i64(),
        }
    }

    /// The program's values for rows `0..n` into `out`, reading `cols`
    /// (each input's values). With `init` (a program built from
    /// `ExactProgram::after`), each row's stack starts holding the prefix
    /// program's value for the row. An error only when a value does not fit
    /// i128, as the row evaluator.
    pub fn eval(
        &self,
        cols: &[Vec<i64>],
        init: Option<&[i128]>,
        n: usize,
        scratch: &mut Scratch,
        out: &mut Vec<i128>,
    ) -> Result<(), QueryError> {
        out.clear();
        if self.fits_i64 && self.run_i64(cols, init, n, scratch) {
            out.extend(scratch.stack[0][..n].iter().map(|&v| i128::from(v)));
            return Ok(());
        }
        for i in 0..n {
            out.push(self.run_i128(cols, init.map(|v| v[i]), i)?);
        }
        Ok(())
    }

    /// The i64 pass into `scratch.stack[0]`; false when any operation
    /// overflowed (or a prefix value does not fit i64).
    fn run_i64(
        &self,
        cols: &[Vec<i64>],
        init: Option<&[i128]>,
        n: usize,
        scratch: &mut Scratch,
    ) -> bool {
        let stack = &mut scratch.stack;
        stack.resize_with(DEPTH, Vec::new);
        for s in stack.iter_mut() {
            s.resize(n, 0);
        }
        let mut sp = 0usize;
        if let Some(init) = init {
            for (d, &v) in stack[0].iter_mut().zip(&init[..n]) {
                match i64::try_from(v) {
                    Ok(v) => *d = v,
                    Err(_) => return false,
                }
            }
            sp = 1;
        }
        for s in &self.steps {
            let overflowed = match *s {
                BStep::Col(k) => {
                    stack[sp].copy_from_slice(&cols[k][..n]);
                    sp += 1;
                    false
                }
                BStep::Lit(v) => {
                    // fits_i64: every literal fits.
                    stack[sp].fill(v as i64);
                    sp += 1;
                    false
                }
                BStep::Neg => {
                    let mut o = false;
                    for x in stack[sp - 1].iter_mut() {
                        let (y, oy) = x.overflowing_neg();
                        *x = y;
                        o |= oy;
                    }
                    o
                }
                BStep::Bin { op, l, r } => {
                    sp -= 1;
                    let (below, top) = stack.split_at_mut(sp);
                    let (a, b) = (&mut below[sp - 1], &top[0]);
                    let (l, r) = (l as i64, r as i64);
                    match op {
                        BinOp::Add => bin(a, b, l, r, i64::overflowing_add),
                        BinOp::Sub => bin(a, b, l, r, i64::overflowing_sub),
                        BinOp::Mul => bin(a, b, l, r, i64::overflowing_mul),
                    }
                }
            };
            if overflowed {
                return false;
            }
        }
        debug_assert_eq!(sp, 1, "a program leaves one value");
        true
    }

    /// Row `i` in i128, as `ExactProgram::run_i128`.
    fn run_i128(
        &self,
        cols: &[Vec<i64>],
        init: Option<i128>,
        i: usize,
    ) -> Result<i128, QueryError> {
        run_i128_steps(&self.steps, init, |k| i128::from(cols[k][i]))
    }
}

/// `a[i] = (a[i] * l) op (b[i] * r)` for every row; true if any overflowed.
#[inline(always)]
fn bin(a: &mut [i64], b: &[i64], l: i64, r: i64, op: impl Fn(i64, i64) -> (i64, bool)) -> bool {
    let mut o = false;
    if l == 1 && r == 1 {
        for (x, &y) in a.iter_mut().zip(b) {
            let (z, oz) = op(*x, y);
            *x = z;
            o |= oz;
        }
        return o;
    }
    for (x, &y) in a.iter_mut().zip(b) {
        let (p, op_) = x.overflowing_mul(l);
        let (q, oq) = y.overflowing_mul(r);
        let (z, oz) = op(p, q);
        *x = z;
        o |= op_ | oq | oz;
    }
    o
}

#[cfg(test)]
mod tests {
    use insitu_protocol::query::{Scalar, ValueOp};
    use insitu_rows::{RowLayout, RowRef, encode_row};

    use super::*;
    use crate::exact::tests::{exact, schema};
    use crate::filter::read_i64;

    /// Whole batches, and a program continued from its prefix, give what
    /// the row evaluator gives for each row, errors included: small values,
    /// a prefix inside i64 whose whole is not, a prefix beyond i64, a whole
    /// beyond i128 (one such row turns the batch into that error).
    #[test]
    fn batches_and_continued_programs_equal_the_row_evaluator() {
        use ValueOp::*;
        // Q1's shape: k * (1 - d), then that * (1 + d).
        let prefix = exact(&[Col(0), Lit(Scalar::Int(1)), Col(1), Sub, Mul]);
        let whole = exact(&[
            Col(0),
            Lit(Scalar::Int(1)),
            Col(1),
            Sub,
            Mul,
            Lit(Scalar::Int(1)),
            Col(1),
            Add,
            Mul,
        ]);
        let rest = whole.after(&prefix).expect("a prefix");
        assert_eq!(rest.len(), 4);
        assert!(prefix.after(&whole).is_none(), "longer is no prefix");
        assert!(whole.after(&whole).is_none(), "equal is no proper prefix");
        assert!(
            whole
                .after(&exact(&[Col(1), Lit(Scalar::Int(1)), Add]))
                .is_none()
        );
        let schema = schema();
        let layout = RowLayout::new(&schema);
        let cases: [&[(i64, i64)]; 4] = [
            &[(3, 25), (-7, 1_000), (0, 0)],
            &[(3, 25), (i64::MAX / 200, 5)],
            &[(i64::MAX, -3), (1, 1)],
            &[(2, 2), (i64::MAX, 999_999_999_999_999)],
        ];
        for rows in cases {
            let bytes: Vec<Vec<u8>> = rows
                .iter()
                .map(|&(k, d)| {
                    let r = [Scalar::Int(k), Scalar::Decimal { value: d, scale: 2 }];
                    encode_row(&schema, &layout, &r).expect("row")
                })
                .collect();
            let refs: Vec<RowRef<'_>> = bytes
                .iter()
                .map(|b| RowRef::new(&layout, b).expect("row"))
                .collect();
            let want: Result<Vec<i128>, String> = refs
                .iter()
                .map(|r| whole.eval_present(r).map_err(|e| e.to_string()))
                .collect();
            let mut inputs = Vec::new();
            let (bp, br, bw) = (
                BatchProgram::new(&prefix, &mut inputs),
                BatchProgram::new(&rest, &mut inputs),
                BatchProgram::new(&whole, &mut inputs),
            );
            assert_eq!(inputs.len(), 2, "k and d, each once");
            let cols: Vec<Vec<i64>> = inputs
                .iter()
                .map(|&(off, read)| refs.iter().map(|r| read_i64(r, off, read)).collect())
                .collect();
            let n = rows.len();
            let mut scratch = Scratch::default();
            let (mut pv, mut out) = (Vec::new(), Vec::new());
            let got_whole = bw
                .eval(&cols, None, n, &mut scratch, &mut out)
                .map(|()| out.clone())
                .map_err(|e| e.to_string());
            assert_eq!(got_whole, want, "whole, rows {rows:?}");
            let got = bp
                .eval(&cols, None, n, &mut scratch, &mut pv)
                .and_then(|()| br.eval(&cols, Some(&pv), n, &mut scratch, &mut out))
                .map(|()| out.clone())
                .map_err(|e| e.to_string());
            assert_eq!(got, want, "continued, rows {rows:?}");
        }
    }
}
