//! The common aggregates (`count`, `sum`, `avg` of exact numbers) applied to
//! a row without the general path's tagged values: one NULL test for every
//! column the arguments read, then plain integer reads and adds.
//!
//! Why: the general path (`agg.rs` `update`) evaluates each argument to a
//! `Val`, tests it for NULL, and matches on the function, per aggregate per
//! row; TPC-H Q1 has eight aggregates over nearly every row, and that
//! dispatch was most of its time. A row where one of the columns is NULL
//! takes the general path, so the answers are the same by construction:
//! for non-NULL arguments `update` does exactly what `apply` does (count
//! the row, add the exact value with a checked i128 add).

use insitu_protocol::query::AggFunc;
use insitu_protocol::schema::ColumnType;
use insitu_rows::RowRef;

use crate::QueryError;
use crate::agg::{State, sum_overflow};
use crate::arith::Arg;
use crate::compile::CompiledAgg;
use crate::exact::ExactProgram;
use crate::filter::{ExactRead, read_i64};

/// How one aggregate's state changes for a row whose arguments are present.
#[derive(Clone, Debug)]
enum FastAgg {
    /// `count(*)`, or `count(column)` of a column tested for NULL up front.
    Count,
    /// `sum` / `avg` of an exact column.
    SumCol { offset: usize, read: ExactRead },
    /// `sum` / `avg` of exact arithmetic.
    SumProgram(ExactProgram),
}

/// Every aggregate of a plan in its fast form.
#[derive(Clone, Debug)]
pub(crate) struct FastAggs {
    /// (bitmap byte, mask) of every column an argument reads, merged per
    /// byte: a row with any of those bits set takes the general path.
    null_bits: Vec<(usize, u8)>,
    /// Per aggregate, in the plan's order.
    aggs: Vec<FastAgg>,
}

/// The i64 read of an exact column type, if it may be summed.
fn summable(ty: ColumnType) -> Option<ExactRead> {
    match ty {
        ColumnType::Int32 => Some(ExactRead::I32),
        ColumnType::Int64 | ColumnType::Decimal { .. } => Some(ExactRead::I64),
        _ => None,
    }
}

impl FastAggs {
    /// The fast form of `aggs`, or None when one of them needs the general
    /// path (min/max, floats, a program the exact evaluator does not take).
    /// `offset_of` gives a fixed column's byte offset.
    pub fn new(aggs: &[CompiledAgg], offset_of: impl Fn(usize) -> usize) -> Option<FastAggs> {
        let mut cols: Vec<usize> = Vec::new();
        let mut out = Vec::with_capacity(aggs.len());
        for a in aggs {
            let f = match (a.func, &a.arg) {
                (AggFunc::CountStar, _) => FastAgg::Count,
                (AggFunc::Count, Arg::Col { col, .. }) => {
                    cols.push(*col);
                    FastAgg::Count
                }
                (AggFunc::Sum | AggFunc::Avg, Arg::Col { col, ty }) => {
                    let read = summable(*ty)?;
                    cols.push(*col);
                    FastAgg::SumCol {
                        offset: offset_of(*col),
                        read,
                    }
                }
                (AggFunc::Sum | AggFunc::Avg | AggFunc::Count, Arg::Exact(p)) => {
                    cols.extend(p.columns());
                    match a.func {
                        AggFunc::Count => FastAgg::Count,
                        _ => FastAgg::SumProgram(p.clone()),
                    }
                }
                _ => return None,
            };
            out.push(f);
        }
        let mut null_bits: Vec<(usize, u8)> = Vec::new();
        for c in cols {
            let (byte, bit) = (1 + c / 8, 1u8 << (c % 8));
            match null_bits.iter_mut().find(|(b, _)| *b == byte) {
                Some((_, mask)) => *mask |= bit,
                None => null_bits.push((byte, bit)),
            }
        }
        Some(FastAggs {
            null_bits,
            aggs: out,
        })
    }

    /// Apply the row to `states` (this group's, one per aggregate). Ok(false),
    /// with nothing changed, when one of the argument columns is NULL in
    /// this row: the caller takes the general path.
    #[inline]
    pub fn apply(&self, row: &RowRef<'_>, states: &mut [State]) -> Result<bool, QueryError> {
        let bytes = row.bytes();
        // In bounds: the bitmap precedes the fixed region RowRef checked.
        if self.null_bits.iter().any(|&(b, m)| bytes[b] & m != 0) {
            return Ok(false);
        }
        for (f, st) in self.aggs.iter().zip(states.iter_mut()) {
            st.count += 1;
            match f {
                FastAgg::Count => {}
                FastAgg::SumCol { offset, read } => {
                    st.sum_int = st
                        .sum_int
                        .checked_add(i128::from(read_i64(row, *offset, *read)))
                        .ok_or_else(sum_overflow)?
                }
                FastAgg::SumProgram(p) => {
                    st.sum_int = st
                        .sum_int
                        .checked_add(p.eval_present(row)?)
                        .ok_or_else(sum_overflow)?
                }
            }
        }
        Ok(true)
    }
}
