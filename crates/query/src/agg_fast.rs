//! The common aggregates (`count`, `sum`, `avg` of exact numbers) without
//! the general path's tagged values: one NULL test per row for every column
//! the arguments read, then the row's inputs are copied into a batch
//! (`Batch`, column by column) and every `BATCH_ROWS` rows the aggregates
//! run over whole columns (`flush`; programs through `exact_batch.rs`).
//!
//! Why: the general path (`agg.rs` `update`) evaluates each argument to a
//! `Val`, tests it for NULL, and matches on the function, per aggregate per
//! row; TPC-H Q1 has eight aggregates over nearly every row. Row by row,
//! even the fast form paid a dispatch per aggregate and per program step;
//! over a batch they are paid once per batch. A row where one of the
//! columns is NULL takes the general path, so the answers are the same by
//! construction: for non-NULL arguments `update` does exactly what `flush`
//! does (count the row, add the exact value with a checked i128 add); only
//! the order of the adds differs, and a tablet's rows come in no defined
//! order anyway.

use insitu_protocol::query::AggFunc;
use insitu_protocol::schema::ColumnType;
use insitu_rows::RowRef;

use crate::QueryError;
use crate::agg::{State, sum_overflow};
use crate::arith::Arg;
use crate::compile::CompiledAgg;
use crate::exact::ExactProgram;
use crate::exact_batch::{BatchProgram, Scratch};
use crate::filter::{ExactRead, read_i64};

/// Rows a batch takes before its aggregates run. Why 1024: the batch's
/// columns (8 bytes per input per row) stay in the L1/L2 cache, and the
/// per-batch dispatch is spread over enough rows to vanish.
pub(crate) const BATCH_ROWS: usize = 1024;

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
    /// (byte offset, read) of each column the sums and programs read: the
    /// batch's input columns, each once.
    inputs: Vec<(usize, ExactRead)>,
    /// (aggregate, input) of sums of a column.
    sums: Vec<(usize, usize)>,
    /// (aggregate, program, from): sums of exact programs, in plan order;
    /// with `from` (an earlier entry of this list), the program is the rest
    /// after that entry's program, starting from its values.
    programs: Vec<(usize, BatchProgram, Option<usize>)>,
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
            inputs: Vec::new(),
            sums: Vec::new(),
            programs: Vec::new(),
            same: Vec::new(),
        };
        // Aggregate index -> its entry in `programs`, for `from`.
        let mut program_of: Vec<Option<usize>> = vec![None; out.len()];
        for (a, f) in out.into_iter().enumerate() {
            match f {
                FastAgg::Count => fast.counts.push(a),
                FastAgg::SumCol { offset, read } => {
                    let k = input(&mut fast.inputs, (offset, read));
                    fast.sums.push((a, k));
                }
                FastAgg::SumProgram(p) => {
                    program_of[a] = Some(fast.programs.len());
                    let bp = BatchProgram::new(&p, &mut fast.inputs);
                    fast.programs.push((a, bp, None));
                }
                FastAgg::SumAfter { from, rest } => {
                    let from = program_of[from].expect("`from` is an earlier program");
                    let bp = BatchProgram::new(&rest, &mut fast.inputs);
                    fast.programs.push((a, bp, Some(from)));
                }
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

    /// None of the columns the arguments read is NULL in `row` (else the
    /// row takes the general path).
    #[inline]
    pub fn present(&self, row: &RowRef<'_>) -> bool {
        let bytes = row.bytes();
        // In bounds: the bitmap precedes the fixed region RowRef checked.
        !self.null_bits.iter().any(|&(b, m)| bytes[b] & m != 0)
    }

    /// Take a `present` row of group `g` into `batch`; true when the batch
    /// is full (the caller flushes it).
    #[inline]
    pub fn add(&self, batch: &mut Batch, row: &RowRef<'_>, g: usize) -> bool {
        if batch.cols.len() != self.inputs.len() {
            batch.cols.resize_with(self.inputs.len(), Vec::new);
        }
        for (col, &(offset, read)) in batch.cols.iter_mut().zip(&self.inputs) {
            col.push(read_i64(row, offset, read));
        }
        // Groups are at most MAX_GROUPS.
        batch.groups.push(g as u32);
        batch.groups.len() >= BATCH_ROWS
    }

    /// Add the batch's rows to `states` (group-major, `per_group` states a
    /// group) and empty it.
    pub fn flush(
        &self,
        batch: &mut Batch,
        states: &mut [State],
        per_group: usize,
    ) -> Result<(), QueryError> {
        let n = batch.groups.len();
        if n == 0 || per_group == 0 {
            // No aggregates (GROUP BY alone): nothing to add.
            batch.clear();
            return Ok(());
        }
        let Batch {
            groups,
            cols,
            values,
            scratch,
            rows_of,
            touched,
        } = batch;
        // Every aggregate but a repeat counts each of its group's rows: per
        // group of this batch (`touched`), not per group so far (a tablet
        // may have up to MAX_GROUPS). `rows_of` is all zeros between flushes.
        rows_of.resize(states.len() / per_group, 0);
        touched.clear();
        for &g in groups.iter() {
            let rows = &mut rows_of[g as usize];
            if *rows == 0 {
                touched.push(g);
            }
            *rows += 1;
        }
        let counting = self.counts.iter().copied();
        let counting = counting
            .chain(self.sums.iter().map(|s| s.0))
            .chain(self.programs.iter().map(|p| p.0));
        for a in counting {
            for &g in touched.iter() {
                states[g as usize * per_group + a].count += rows_of[g as usize];
            }
        }
        for &g in touched.iter() {
            rows_of[g as usize] = 0;
        }
        for &(a, k) in &self.sums {
            add_sums(
                states,
                per_group,
                a,
                groups,
                cols[k].iter().map(|&v| i128::from(v)),
            )?;
        }
        values.resize_with(self.programs.len(), Vec::new);
        for (j, (a, p, from)) in self.programs.iter().enumerate() {
            let (done, rest) = values.split_at_mut(j);
            let init = from.map(|f| done[f].as_slice());
            p.eval(cols, init, n, scratch, &mut rest[0])?;
            add_sums(states, per_group, *a, groups, rest[0].iter().copied())?;
        }
        groups.clear();
        for c in cols.iter_mut() {
            c.clear();
        }
        Ok(())
    }
}

/// Rows of the fast path waiting for their aggregates, column by column.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Each row's group.
    groups: Vec<u32>,
    /// Per input of `FastAggs::inputs`, each row's value.
    cols: Vec<Vec<i64>>,
    /// Per entry of `FastAggs::programs`, its values for the batch (kept for
    /// the programs that continue it).
    values: Vec<Vec<i128>>,
    /// The programs' i64 columns.
    scratch: Scratch,
    /// Per group, its rows in the batch (zero outside `flush`).
    rows_of: Vec<u64>,
    /// The groups of the batch, each once (`flush`).
    touched: Vec<u32>,
}

impl Batch {
    /// Forget the rows taken (the scan restarted).
    pub fn clear(&mut self) {
        self.groups.clear();
        for c in self.cols.iter_mut() {
            c.clear();
        }
    }
}

/// Add each row's value to its group's sum of aggregate `a` (checked: a
/// sum past i128 is an error).
fn add_sums(
    states: &mut [State],
    per_group: usize,
    a: usize,
    groups: &[u32],
    values: impl Iterator<Item = i128>,
) -> Result<(), QueryError> {
    for (&g, v) in groups.iter().zip(values) {
        let st = &mut states[g as usize * per_group + a];
        st.sum_int = st.sum_int.checked_add(v).ok_or_else(sum_overflow)?;
    }
    Ok(())
}

/// The index of `col` in `inputs`, added if new.
pub(crate) fn input(inputs: &mut Vec<(usize, ExactRead)>, col: (usize, ExactRead)) -> usize {
    match inputs.iter().position(|&i| i == col) {
        Some(k) => k,
        None => {
            inputs.push(col);
            inputs.len() - 1
        }
    }
}

/// `p` as a fast aggregate: from the earlier program it starts with (the
/// longest), else in full.
fn longest_prefix(earlier: &[FastAgg], p: &ExactProgram) -> FastAgg {
    let mut best: Option<(usize, usize, ExactProgram)> = None;
    for (j, f) in earlier.iter().enumerate() {
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
