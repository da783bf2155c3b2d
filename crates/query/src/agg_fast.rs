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
    /// `sum` / `avg` of a program that starts with all of aggregate
    /// `from`'s program (an earlier `SumProgram`): the rest, run from that
    /// value (`ExactProgram::after`).
    SumAfter { from: usize, rest: ExactProgram },
    /// The same state as earlier aggregate `of` (`sum(x)` and `avg(x)`, or a
    /// repeated aggregate): skipped per row, copied at the end (`fill_same`).
    Same { of: usize },
}

/// Earlier aggregates whose values a later one may start from: the values
/// are kept per row in a small array. Why a bound: a stack array, no
/// allocation per row; later programs are computed in full.
const REUSE: usize = 16;

/// Whether aggregates `a` and `b` get equal states from `agg.rs`'s
/// `update` on every row: sum and avg keep the same state; count(column)
/// differs from count(*) on NULLs; arguments are equal when they are the
/// same column or the same exact program (general programs never are).
fn same_state(a: &CompiledAgg, b: &CompiledAgg) -> bool {
    let class = |f: AggFunc| match f {
        AggFunc::Sum | AggFunc::Avg => Some(0),
        AggFunc::Count => Some(1),
        AggFunc::CountStar => Some(2),
        AggFunc::Min | AggFunc::Max => None,
    };
    if class(a.func).is_none() || class(a.func) != class(b.func) {
        return false;
    }
    match (&a.arg, &b.arg) {
        _ if a.func == AggFunc::CountStar => true,
        (Arg::Col { col: x, .. }, Arg::Col { col: y, .. }) => x == y,
        (Arg::Exact(x), Arg::Exact(y)) => x.same(y),
        _ => false,
    }
}

/// Every aggregate of a plan in its fast form, sorted by kind so a row
/// runs a few tight loops instead of a `match` per aggregate. Why: with
/// eight aggregates (TPC-H Q1) the per-aggregate dispatch was an indirect
/// jump that mispredicted often enough to cost a tenth of the query.
#[derive(Clone, Debug)]
pub(crate) struct FastAggs {
    /// (bitmap byte, mask) of every column an argument reads, merged per
    /// byte: a row with any of those bits set takes the general path.
    null_bits: Vec<(usize, u8)>,
    /// Aggregates that count the row and add nothing.
    counts: Vec<usize>,
    /// (aggregate, byte offset) of sums of an int64 or decimal column.
    sums_i64: Vec<(usize, usize)>,
    /// (aggregate, byte offset) of sums of an int32 column.
    sums_i32: Vec<(usize, usize)>,
    /// (aggregate, program, from): sums of exact programs, in plan order;
    /// with `from`, the program is the rest after aggregate `from`'s
    /// program, whose value it starts from.
    programs: Vec<(usize, ExactProgram, Option<usize>)>,
    /// (aggregate, the earlier aggregate it repeats).
    same: Vec<(usize, usize)>,
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
        let mut out: Vec<FastAgg> = Vec::with_capacity(aggs.len());
        for (i, a) in aggs.iter().enumerate() {
            if let Some(of) = aggs[..i].iter().position(|b| same_state(b, a)) {
                out.push(FastAgg::Same { of });
                continue;
            }
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
                        _ => longest_prefix(&out, p),
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
        let mut fast = FastAggs {
            null_bits,
            counts: Vec::new(),
            sums_i64: Vec::new(),
            sums_i32: Vec::new(),
            programs: Vec::new(),
            same: Vec::new(),
        };
        for (a, f) in out.into_iter().enumerate() {
            match f {
                FastAgg::Count => fast.counts.push(a),
                FastAgg::SumCol {
                    offset,
                    read: ExactRead::I64,
                } => fast.sums_i64.push((a, offset)),
                FastAgg::SumCol {
                    offset,
                    read: ExactRead::I32,
                } => fast.sums_i32.push((a, offset)),
                FastAgg::SumCol {
                    read: ExactRead::Bool,
                    ..
                } => unreachable!("`summable` reads integers only"),
                FastAgg::SumProgram(p) => fast.programs.push((a, p, None)),
                FastAgg::SumAfter { from, rest } => fast.programs.push((a, rest, Some(from))),
                FastAgg::Same { of } => fast.same.push((a, of)),
            }
        }
        Some(fast)
    }

    /// Copy each `Same` aggregate's state from the one it repeats, once the
    /// group has seen every row (`states`: one group's, one per aggregate).
    /// Rows of the general path updated both alike, so the copy is the state
    /// the repeat would have had.
    pub fn fill_same(&self, states: &mut [State]) {
        for &(a, of) in &self.same {
            states[a] = states[of].clone();
        }
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
        for &a in &self.counts {
            states[a].count += 1;
        }
        for &(a, offset) in &self.sums_i64 {
            let st = &mut states[a];
            st.count += 1;
            let v = i128::from(read_i64(row, offset, ExactRead::I64));
            st.sum_int = st.sum_int.checked_add(v).ok_or_else(sum_overflow)?;
        }
        for &(a, offset) in &self.sums_i32 {
            let st = &mut states[a];
            st.count += 1;
            let v = i128::from(read_i64(row, offset, ExactRead::I32));
            st.sum_int = st.sum_int.checked_add(v).ok_or_else(sum_overflow)?;
        }
        // This row's program values by aggregate, for programs that start
        // from them.
        let mut values = [0i128; REUSE];
        for (a, p, from) in &self.programs {
            let v = match from {
                None => p.eval_present(row)?,
                Some(f) => p.eval_after(row, values[*f])?,
            };
            if let Some(slot) = values.get_mut(*a) {
                *slot = v;
            }
            let st = &mut states[*a];
            st.count += 1;
            st.sum_int = st.sum_int.checked_add(v).ok_or_else(sum_overflow)?;
        }
        Ok(true)
    }
}

/// `p` as a fast aggregate: from the earlier program it starts with (the
/// longest, among the first `REUSE` aggregates), else in full.
fn longest_prefix(earlier: &[FastAgg], p: &ExactProgram) -> FastAgg {
    let mut best: Option<(usize, usize, ExactProgram)> = None;
    for (j, f) in earlier.iter().enumerate().take(REUSE) {
        let prefix = match f {
            FastAgg::SumProgram(q) => q,
            _ => continue,
        };
        if best
            .as_ref()
            .is_some_and(|(len, _, _)| *len >= prefix.len())
        {
            continue;
        }
        if let Some(rest) = p.after(prefix) {
            best = Some((prefix.len(), j, rest));
        }
    }
    match best {
        Some((_, from, rest)) => FastAgg::SumAfter { from, rest },
        None => FastAgg::SumProgram(p.clone()),
    }
}
