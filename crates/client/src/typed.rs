//! Typed tables: rows written by their schema, and queries (filter,
//! projection, top-k, grouped aggregates) run on the servers.
//!
//! The schema comes with the table's map (`TableInfo::schema`) and never
//! changes, so the cached copy is always the table's. Rows are encoded here
//! (`insitu-rows`): a value that does not fit its column is refused before
//! anything is sent.
//!
//! A query goes to every tablet in parallel, each through the routing and
//! retry loop of `Client::routed` like a pushdown scan (`ops.rs`). A tablet
//! answers in pages; the client asks for the next page from the hash the
//! last one names. If the table's tablet layout changes during the query,
//! the whole query is run again on the new layout, so every row is counted
//! once. Partial aggregates are merged and top-k rows re-sorted here
//! (`insitu-query`).

use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use insitu_protocol::query::Scalar;
use insitu_protocol::query::{
    GroupPartial, IndexProbe, QueryData, QueryOutput, QueryPlan, QueryResult, QueryResume,
};
use insitu_protocol::schema::Schema;
use insitu_protocol::{Request, Response, Status};
use insitu_rows::{RowLayout, encode_key, encode_row};

use crate::client::Client;
use crate::client::PerItem;
use crate::error::ClientError;
use crate::ops::{AtSnapshot, LayoutOr, MAX_SNAPSHOT_RETRIES};

/// Layout changes tolerated before a query gives up.
const MAX_LAYOUT_RETRIES: u32 = 20;
/// Most pages one tablet may answer a query with (at ~1 MiB a page: 64 GiB).
const MAX_PAGES: u32 = 65_536;
/// Times one tablet's answer is started over because the shard dropped the
/// pages it held (`Status::CursorExpired`) before the query gives up.
const MAX_CURSOR_RESTARTS: u32 = 3;

/// What a query returned.
#[derive(Debug)]
pub enum QueryAnswer {
    /// Rows (of the projection), as Arrow batches: in no order, or sorted and
    /// cut to the limit for a top-k.
    Rows(Vec<RecordBatch>),
    /// Merged groups: their key values and each aggregate's state.
    Groups(Vec<GroupPartial>),
}

/// A query's answer and what it cost.
#[derive(Debug)]
pub struct QueryOutcome {
    pub answer: QueryAnswer,
    /// Rows the servers visited and rows that passed the filter.
    pub visited: u64,
    pub matched: u64,
    pub tablets: usize,
    /// Pages fetched in all.
    pub pages: u64,
    /// Longest server time spent on one page.
    pub max_server_time: Duration,
    /// The snapshot every tablet was read at (0: each as it was).
    pub snapshot_ts: u64,
}

/// One tablet's part of a query: what every page request to it names, kept
/// together so the page loop and the page request take it as one.
#[derive(Clone, Copy)]
struct TabletQuery<'a> {
    table: u64,
    /// The tablet's hash range (start, end), as the layout had it.
    range: (u64, u64),
    schema: &'a Schema,
    plan: &'a QueryPlan,
    index: Option<&'a IndexProbe>,
    /// The snapshot read at (0: none).
    snapshot_ts: u64,
}

fn status(s: Status, msg: impl Into<String>) -> ClientError {
    ClientError::Status(s, msg.into())
}

impl Client {
    /// The schema of table `table` (None: an untyped table).
    pub async fn schema(&self, table: u64) -> Result<Option<Schema>, ClientError> {
        let route = self.route(table, self.deadline()).await?;
        Ok(route.info.schema.clone())
    }

    async fn typed_schema(&self, table: u64) -> Result<Schema, ClientError> {
        match self.schema(table).await? {
            Some(s) => Ok(s),
            None => Err(status(
                Status::BadRequest,
                format!(
                    "table {table} has no schema (an untyped table): typed rows and queries need a table created with --schema"
                ),
            )),
        }
    }

    /// Write rows (one value per column, in schema order) to typed table
    /// `table`; each row's key is its primary key. Every row is checked and
    /// encoded before any is sent. Returns the new version per row.
    pub async fn put_rows(
        &self,
        table: u64,
        rows: &[Vec<Scalar>],
    ) -> Result<PerItem<u64>, ClientError> {
        self.put_rows_numbered(table, rows, 1).await
    }

    /// `put_rows`, where `rows[0]` is row number `first` of a longer input
    /// (a refused row is named by its number in the whole input).
    pub async fn put_rows_numbered(
        &self,
        table: u64,
        rows: &[Vec<Scalar>],
        first: u64,
    ) -> Result<PerItem<u64>, ClientError> {
        let schema = self.typed_schema(table).await?;
        let layout = RowLayout::new(&schema);
        let mut items = Vec::with_capacity(rows.len());
        for (row, n) in rows.iter().zip(first..) {
            let key = encode_key(&schema, row)
                .map_err(|e| status(Status::BadRequest, format!("row {n}: {e}")))?;
            let value = encode_row(&schema, &layout, row)
                .map_err(|e| status(Status::BadRequest, format!("row {n}: {e}")))?;
            items.push((key, value));
        }
        self.multi_write(table, &items).await
    }

    /// Run `plan` on every tablet of typed table `table`.
    pub async fn query(&self, table: u64, plan: &QueryPlan) -> Result<QueryOutcome, ClientError> {
        self.query_with(table, plan, None).await
    }

    /// Run `plan` on every tablet of typed table `table`, finding each
    /// tablet's candidate rows through its secondary index as `index` says
    /// (a column declared with `create_index`). The filter still decides
    /// which rows pass, so the answer is the same as without the probe.
    pub async fn query_with(
        &self,
        table: u64,
        plan: &QueryPlan,
        index: Option<&IndexProbe>,
    ) -> Result<QueryOutcome, ClientError> {
        self.query_at(table, plan, index, 0).await
    }

    /// `query_with`, reading the rows as of snapshot timestamp
    /// `snapshot_ts` (0: as they are). A timestamp the oracle has not handed
    /// out is refused (`BadRequest`); a shard that no longer keeps the
    /// versions the snapshot needs answers `SnapshotTooOld`.
    pub async fn query_at(
        &self,
        table: u64,
        plan: &QueryPlan,
        index: Option<&IndexProbe>,
        snapshot_ts: u64,
    ) -> Result<QueryOutcome, ClientError> {
        if snapshot_ts != 0 {
            self.check_snapshot_ts(snapshot_ts).await?;
        }
        self.query_ts(table, plan, index, snapshot_ts).await
    }

    /// `query_with`, reading one snapshot as `at` says, as `count` and
    /// `aggregate` of untyped tables do (`execute_plan_at`): `Auto` reads
    /// every tablet at one fresh timestamp when the table has more than one
    /// (one tablet is read at one instant anyway), `On` always, `Off` never,
    /// `At(ts)` at `ts`. A fresh timestamp refused with `SnapshotTooOld` (a
    /// shard that had kept no versions begins keeping them when refused) is
    /// replaced by a new one, at most `MAX_SNAPSHOT_RETRIES` times; `At(ts)`
    /// is not retried. The outcome's `snapshot_ts` is the one read (0: none).
    pub async fn query_snapshot(
        &self,
        table: u64,
        plan: &QueryPlan,
        index: Option<&IndexProbe>,
        at: AtSnapshot,
    ) -> Result<QueryOutcome, ClientError> {
        let fresh = match at {
            AtSnapshot::Off => false,
            AtSnapshot::At(ts) => return self.query_at(table, plan, index, ts).await,
            AtSnapshot::On => true,
            AtSnapshot::Auto => {
                let deadline = Instant::now() + self.inner.config.op_timeout;
                self.tablet_ranges(table, deadline).await?.0.len() > 1
            }
        };
        if !fresh {
            return self.query_ts(table, plan, index, 0).await;
        }
        let deadline = Instant::now() + self.inner.config.op_timeout;
        let mut retries = 0;
        loop {
            // Handed out by the oracle just now: no need to ask it again.
            let ts = self.timestamp().await?;
            match self.query_ts(table, plan, index, ts).await {
                Err(e)
                    if e.status() == Some(Status::SnapshotTooOld)
                        && retries < MAX_SNAPSHOT_RETRIES
                        && Instant::now() < deadline =>
                {
                    retries += 1;
                }
                other => return other,
            }
        }
    }

    /// `query_at` without the check of the timestamp.
    async fn query_ts(
        &self,
        table: u64,
        plan: &QueryPlan,
        index: Option<&IndexProbe>,
        snapshot_ts: u64,
    ) -> Result<QueryOutcome, ClientError> {
        let schema = self.typed_schema(table).await?;
        // Refuse a bad plan here with the servers' own check.
        insitu_query::compile(&schema, plan)
            .map_err(|e| status(Status::BadRequest, e.to_string()))?;
        let deadline = Instant::now() + self.inner.config.op_timeout;
        let mut layout_retries = 0;
        loop {
            let (ranges, seen) = self.tablet_ranges(table, deadline).await?;
            let calls = ranges.iter().map(|&range| {
                self.query_tablet(TabletQuery {
                    table,
                    range,
                    schema: &schema,
                    plan,
                    index,
                    snapshot_ts,
                })
            });
            let results = futures::future::join_all(calls).await;
            let mut pages = Vec::new();
            let mut layout_changed = None;
            for r in results {
                match r {
                    Ok(p) => pages.extend(p),
                    Err(LayoutOr::Layout(why)) => layout_changed = Some(why),
                    Err(LayoutOr::Error(e)) => return Err(e),
                }
            }
            if let Some(why) = layout_changed {
                layout_retries += 1;
                if layout_retries > MAX_LAYOUT_RETRIES || Instant::now() >= deadline {
                    return Err(status(Status::StaleMap, why));
                }
                self.refresh(table, seen, deadline).await?;
                continue;
            }
            let mut out = merge_pages(&schema, plan, ranges.len(), pages)?;
            out.snapshot_ts = snapshot_ts;
            return Ok(out);
        }
    }

    /// Every page of one tablet's answer.
    async fn query_tablet(&self, q: TabletQuery<'_>) -> Result<Vec<QueryResult>, LayoutOr> {
        let limit = match &q.plan.output {
            QueryOutput::Rows {
                order_by, limit, ..
            } if order_by.is_empty() => *limit,
            _ => None,
        };
        let mut pages = Vec::new();
        let mut resume = None;
        let mut rows = 0u64;
        let mut restarts = 0;
        loop {
            if pages.len() as u32 >= MAX_PAGES {
                return Err(LayoutOr::Error(status(
                    Status::Internal,
                    format!("tablet {:#x}: more than {MAX_PAGES} pages", q.range.0),
                )));
            }
            let page = match self.query_page(q, resume).await {
                Ok(page) => page,
                // The shard dropped the pages it held for us (expired or
                // evicted by other queries): this tablet's answer starts over.
                Err(LayoutOr::Error(ClientError::Status(Status::CursorExpired, _)))
                    if restarts < MAX_CURSOR_RESTARTS =>
                {
                    restarts += 1;
                    (pages, resume, rows) = (Vec::new(), None, 0);
                    continue;
                }
                Err(e) => return Err(e),
            };
            resume = page.resume;
            if let QueryData::Rows(_) = &page.data {
                rows += page.matched;
            }
            pages.push(page);
            // A LIMIT without order: this tablet has given enough rows.
            if resume.is_none() || limit.is_some_and(|l| rows >= l) {
                return Ok(pages);
            }
        }
    }

    /// One page of a tablet's answer, from `resume` (None: the first page).
    async fn query_page(
        &self,
        q: TabletQuery<'_>,
        resume: Option<QueryResume>,
    ) -> Result<QueryResult, LayoutOr> {
        self.tablet_op(
            q.table,
            q.range,
            |t| Request::Query {
                table: q.table,
                start_hash: t.start_hash,
                end_hash: t.end_hash,
                map_version: t.map_version,
                schema: q.schema.clone(),
                plan: q.plan.clone(),
                resume,
                index: q.index.cloned(),
                snapshot_ts: q.snapshot_ts,
            },
            "Query",
            |r| match r {
                Response::Query(r) => Ok(r),
                other => Err(format!("{other:?}")),
            },
        )
        .await
    }
}

fn merge_pages(
    schema: &Schema,
    plan: &QueryPlan,
    tablets: usize,
    pages: Vec<QueryResult>,
) -> Result<QueryOutcome, ClientError> {
    let bad = |e: String| ClientError::Unexpected {
        addr: String::new(),
        what: e,
    };
    let mut out = QueryOutcome {
        answer: QueryAnswer::Rows(Vec::new()),
        visited: 0,
        matched: 0,
        tablets,
        pages: pages.len() as u64,
        max_server_time: Duration::ZERO,
        snapshot_ts: 0,
    };
    let mut batches = Vec::new();
    let mut groups = Vec::new();
    for p in pages {
        out.visited += p.visited;
        out.matched += p.matched;
        out.max_server_time = out
            .max_server_time
            .max(Duration::from_nanos(p.server_nanos));
        match p.data {
            QueryData::Rows(bytes) => batches
                .extend(insitu_rows::arrow::from_ipc(&bytes).map_err(|e| bad(e.to_string()))?),
            QueryData::Groups(g) => groups.push(g),
        }
    }
    out.answer = match &plan.output {
        QueryOutput::Aggregate { .. } => QueryAnswer::Groups(
            insitu_query::merge_groups(plan, groups).map_err(|e| bad(e.to_string()))?,
        ),
        QueryOutput::Rows {
            order_by, limit, ..
        } => {
            if !order_by.is_empty() {
                QueryAnswer::Rows(
                    insitu_query::merge_top_k(schema, plan, batches)
                        .map_err(|e| bad(e.to_string()))?,
                )
            } else {
                QueryAnswer::Rows(cut(batches, *limit))
            }
        }
    };
    Ok(out)
}

/// The first `limit` rows of `batches` (all without a limit).
fn cut(batches: Vec<RecordBatch>, limit: Option<u64>) -> Vec<RecordBatch> {
    let Some(mut left) = limit else {
        return batches;
    };
    let mut out = Vec::new();
    for b in batches {
        if left == 0 {
            break;
        }
        let take = (b.num_rows() as u64).min(left);
        left -= take;
        out.push(b.slice(0, take as usize));
    }
    out
}

impl crate::txn::Transaction {
    /// Write `row` (values in `schema`'s column order) to typed table
    /// `table` at the commit: the row's key columns make its object key, as
    /// `Client::put_rows` does, so a row with an existing key replaces it.
    /// Refused (`BadRequest`) if a value does not fit its column; nothing
    /// is queued then.
    pub fn write_row(
        &mut self,
        table: u64,
        schema: &Schema,
        row: &[Scalar],
    ) -> Result<(), ClientError> {
        let key = encode_key(schema, row).map_err(|e| status(Status::BadRequest, e.to_string()))?;
        let value = encode_row(schema, &RowLayout::new(schema), row)
            .map_err(|e| status(Status::BadRequest, e.to_string()))?;
        self.write(table, key, value);
        Ok(())
    }
}
