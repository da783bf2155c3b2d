//! Where the rows that passed the filter go: a page of projected rows
//! (`Rows`), the best `limit` rows by a sort (`TopK`), or grouped
//! aggregates (`agg.rs`).

use std::cmp::Ordering;
use std::sync::Arc;

use arrow_array::RecordBatch;
use insitu_protocol::query::{QueryData, Scalar, SortKey};
use insitu_protocol::schema::Schema;
use insitu_rows::RowRef;
use insitu_rows::arrow::{BatchBuilder, arrow_type, projected_schema, to_ipc};

use crate::QueryError;
use crate::agg::GroupSink;
use crate::compile::{Compiled, Output};
use crate::value::sort_cmp;

/// Most bytes (estimated) a top-k may hold while it runs. Why: `limit` is
/// bounded (MAX_TOP_K) but rows are not; 100 000 rows of a few KiB each
/// fit, a query that would take a server's memory is refused.
pub const MAX_TOP_K_BYTES: usize = 256 << 20;

/// Rows pushed since the last `finish`, for one page.
pub struct Sink {
    /// Which output the plan asked for, and its state.
    kind: Kind,
}

enum Kind {
    Rows(RowsSink),
    TopK(TopK),
    /// Boxed: its batch (`agg_fast.rs`) makes it several times the others.
    Groups(Box<GroupSink>),
}

struct RowsSink {
    /// The page's projected rows.
    builder: BatchBuilder,
    /// For `to_ipc` (the builder's copy is private).
    arrow_schema: arrow_schema::SchemaRef,
    /// Rows this page may still take before the plan's limit (None: no limit).
    limit: Option<u64>,
    /// The page is full at about this many bytes of Arrow data.
    page_bytes: usize,
}

impl Compiled {
    /// A sink for one page: Rows output stops (`is_full`) at about
    /// `page_bytes` bytes.
    pub fn sink(&self, page_bytes: usize) -> Sink {
        self.sink_after(page_bytes, 0)
    }

    /// A sink for a later page of a `Rows` query without ORDER BY, when
    /// earlier pages of this tablet already returned `rows_sent` rows: the
    /// plan's limit counts them. Other outputs ignore `rows_sent`.
    pub fn sink_after(&self, page_bytes: usize, rows_sent: u64) -> Sink {
        let kind = match &*self.out {
            Output::Rows {
                schema,
                columns,
                limit,
            } => Kind::Rows(RowsSink {
                builder: BatchBuilder::new(schema, columns),
                arrow_schema: projected_schema(schema, columns),
                limit: limit.map(|l| l.saturating_sub(rows_sent)),
                page_bytes,
            }),
            Output::TopK { .. } => Kind::TopK(TopK::new(self.out.clone())),
            Output::Groups { .. } => Kind::Groups(Box::new(GroupSink::new(
                self.out.clone(),
                self.fast.clone(),
            ))),
        };
        Sink { kind }
    }
}

impl Sink {
    /// A row that passed the filter.
    pub fn push(&mut self, row: &RowRef<'_>) -> Result<(), QueryError> {
        match &mut self.kind {
            Kind::Rows(s) => {
                if s.limit.is_some_and(|l| s.builder.rows() as u64 >= l) {
                    return Ok(());
                }
                s.builder.append(row)?;
                Ok(())
            }
            Kind::TopK(t) => t.push(row),
            Kind::Groups(g) => g.push(row),
        }
    }

    /// No more rows are useful in this page: a `Rows` output without ORDER
    /// BY reached its limit or `page_bytes`. Top-k and aggregates need every
    /// row, so they are never full.
    pub fn is_full(&self) -> bool {
        match &self.kind {
            Kind::Rows(s) => self.rows_limit_reached() || s.builder.bytes() >= s.page_bytes,
            _ => false,
        }
    }

    /// The plan's limit (not the page size) stopped this page: the tablet
    /// has nothing more to return.
    pub fn rows_limit_reached(&self) -> bool {
        match &self.kind {
            Kind::Rows(s) => s.limit.is_some_and(|l| s.builder.rows() as u64 >= l),
            _ => false,
        }
    }

    /// Rows pushed and kept so far (Rows: this page's rows; top-k: the
    /// candidates held; aggregates: groups).
    pub fn len(&self) -> usize {
        match &self.kind {
            Kind::Rows(s) => s.builder.rows(),
            Kind::TopK(t) => t.cands.len(),
            Kind::Groups(g) => g.groups(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows output without ORDER BY: end the page here and return its Arrow
    /// IPC bytes and row count; the sink goes on empty, the plan's limit
    /// still counting the rows already taken. Other outputs are one page
    /// each: `None`.
    pub fn take_page(&mut self) -> Result<Option<(Vec<u8>, u64)>, QueryError> {
        match &mut self.kind {
            Kind::Rows(s) => {
                let rows = s.builder.rows() as u64;
                let batch = s.builder.finish()?;
                s.limit = s.limit.map(|l| l.saturating_sub(rows));
                Ok(Some((to_ipc(&s.arrow_schema, &[batch])?, rows)))
            }
            Kind::TopK(_) | Kind::Groups(_) => Ok(None),
        }
    }

    /// Forget everything pushed (the server's scan restarted).
    pub fn reset(&mut self) {
        match &mut self.kind {
            Kind::Rows(s) => {
                // Only to empty the builders: what they held is dropped.
                let _ = s.builder.finish();
            }
            Kind::TopK(t) => {
                t.cands.clear();
                t.threshold = None;
                t.bytes = 0;
            }
            Kind::Groups(g) => g.reset(),
        }
    }

    /// Rows and top-k: Arrow IPC stream bytes (one batch; top-k rows in
    /// sort order, columns = the projection then any ORDER BY columns not in
    /// it); aggregates: the groups.
    pub fn finish(self) -> Result<QueryData, QueryError> {
        match self.kind {
            Kind::Rows(mut s) => {
                let batch = s.builder.finish()?;
                Ok(QueryData::Rows(to_ipc(&s.arrow_schema, &[batch])?))
            }
            Kind::TopK(t) => {
                let (schema, batch) = t.finish()?;
                Ok(QueryData::Rows(to_ipc(&schema, &[batch])?))
            }
            Kind::Groups(g) => Ok(QueryData::Groups(g.finish()?)),
        }
    }
}

/// Compare two candidate rows by the sort keys.
pub(crate) fn cmp_rows(keys: &[(usize, SortKey)], a: &[Scalar], b: &[Scalar]) -> Ordering {
    for (i, k) in keys {
        let o = sort_cmp(&a[*i], &b[*i], k.descending, k.nulls_first);
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

fn scalar_bytes(v: &Scalar) -> usize {
    std::mem::size_of::<Scalar>()
        + match v {
            Scalar::Str(s) => s.len(),
            _ => 0,
        }
}

/// A top-k plan's schema, output columns, sort keys and limit.
type TopKParts<'a> = (&'a Arc<Schema>, &'a [u16], &'a [(usize, SortKey)], usize);

/// The best `limit` rows: candidates are kept unsorted until there are
/// twice as many as needed, then sorted and cut to `limit`; the last kept
/// row's key becomes the bar a new row must beat (O(n log k) overall, and a
/// row below the bar costs only reads of its sort columns).
struct TopK {
    /// The compiled plan's columns, keys and limit.
    out: Arc<Output>,
    /// Candidate rows: the values of `out_columns`.
    cands: Vec<Vec<Scalar>>,
    /// The sort-key values of the worst row kept at the last cut, once
    /// `limit` rows were kept.
    threshold: Option<Vec<Scalar>>,
    /// Estimated bytes of `cands` (checked against MAX_TOP_K_BYTES).
    bytes: usize,
}

impl TopK {
    fn new(out: Arc<Output>) -> TopK {
        TopK {
            out,
            cands: Vec::new(),
            threshold: None,
            bytes: 0,
        }
    }

    fn parts(out: &Output) -> TopKParts<'_> {
        match out {
            Output::TopK {
                schema,
                out_columns,
                keys,
                limit,
            } => (schema, out_columns, keys, *limit),
            _ => unreachable!("a top-k sink is made for a top-k plan"),
        }
    }

    fn push(&mut self, row: &RowRef<'_>) -> Result<(), QueryError> {
        let out = self.out.clone();
        let (_, out_columns, keys, limit) = Self::parts(&out);
        if limit == 0 {
            return Ok(());
        }
        if let Some(bar) = &self.threshold {
            let mut better = false;
            for (j, (i, k)) in keys.iter().enumerate() {
                let v = row.scalar(out_columns[*i] as usize)?;
                match sort_cmp(&v, &bar[j], k.descending, k.nulls_first) {
                    Ordering::Less => {
                        better = true;
                        break;
                    }
                    Ordering::Greater => return Ok(()),
                    Ordering::Equal => {}
                }
            }
            if !better {
                return Ok(());
            }
        }
        let cand = out_columns
            .iter()
            .map(|&c| row.scalar(c as usize))
            .collect::<Result<Vec<_>, _>>()?;
        self.bytes += cand.iter().map(scalar_bytes).sum::<usize>();
        self.cands.push(cand);
        if self.cands.len() >= 2 * limit.max(64) {
            self.cut(keys, limit);
        }
        if self.bytes > MAX_TOP_K_BYTES {
            return Err(QueryError::Eval(format!(
                "the ORDER BY .. LIMIT {limit} rows take more than {} MiB on one tablet; \
                 project fewer columns or ask for fewer rows",
                MAX_TOP_K_BYTES >> 20
            )));
        }
        Ok(())
    }

    /// Sort the candidates and keep the best `limit`.
    fn cut(&mut self, keys: &[(usize, SortKey)], limit: usize) {
        self.cands.sort_by(|a, b| cmp_rows(keys, a, b));
        self.cands.truncate(limit);
        self.bytes = self
            .cands
            .iter()
            .flat_map(|c| c.iter().map(scalar_bytes))
            .sum();
        if limit > 0 && self.cands.len() == limit {
            let worst = &self.cands[limit - 1];
            self.threshold = Some(keys.iter().map(|(i, _)| worst[*i].clone()).collect());
        }
    }

    fn finish(mut self) -> Result<(arrow_schema::SchemaRef, RecordBatch), QueryError> {
        let out = self.out.clone();
        let (schema, out_columns, keys, limit) = Self::parts(&out);
        self.cut(keys, limit);
        let arrow_schema = projected_schema(schema, out_columns);
        let arrays = out_columns
            .iter()
            .enumerate()
            .map(|(j, &c)| {
                let col = &schema.columns[c as usize];
                crate::build::array_of(
                    &arrow_type(col.ty),
                    &col.name,
                    self.cands.iter().map(|r| &r[j]),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(self.cands.len()));
        let batch = RecordBatch::try_new_with_options(arrow_schema.clone(), arrays, &options)
            .map_err(|e| QueryError::Arrow(e.to_string()))?;
        Ok((arrow_schema, batch))
    }
}
