//! Typed queries (`Request::Query`) on one tablet of this shard: filter,
//! projection, top-k and grouped aggregates over typed rows, evaluated by
//! `insitu-query`, answered as Arrow pages or partial aggregates.
//!
//! Two ways through a tablet:
//! - A first request (`resume: None`) walks the tablet's log with the scan
//!   driver (`scan_run.rs`): sequential reads, exact for the tablet (the
//!   driver restarts holding the tablet if it changed between chunks), and
//!   yielding every ~1 ms. Most queries end here: aggregates (bounded by
//!   `MAX_GROUPS`), top-k (bounded by `MAX_TOP_K`), and rows that fit one
//!   page (a LIMIT, or a selective filter).
//! - When the rows outgrow one page (`PAGE_BYTES`) the log walk stops and its
//!   rows are dropped, and the answer is paged in key-hash order instead
//!   (the walk `Enumerate` uses, `enumerate.rs`): each page ends at a hash
//!   boundary and names the hash to resume from. The guarantee is
//!   `Enumerate`'s: a row present and unchanged during the whole query is
//!   returned exactly once; a row written meanwhile may be returned with
//!   either value, or not at all if created after its page's list was taken.
//!   The wasted log-walk work is bounded by one page of output.
//!
//! A row that does not decode with the schema (written by other means than
//! a typed client) fails the query with its key named; it never panics.

use std::time::Instant;

use bytes::BytesMut;
use insitu_protocol::plan::Source;
use insitu_protocol::query::{QueryPlan, QueryResult};
use insitu_protocol::schema::Schema;
use insitu_protocol::{Response, Status, encode_error};
use insitu_query::{Compiled, Sink, compile};
use insitu_rows::RowRef;

use crate::scan_run::{CHUNK, ObjectSink, Refusal, Run, engine_refusal, show_key};
use crate::shard::ShardState;

/// Arrow bytes of rows per reply page. Why 1 MiB: a frame carries 4 MiB; a
/// page may overshoot by one hash-walk batch (`WALK_BATCH_BYTES` of input).
const PAGE_BYTES: usize = 1 << 20;
/// Raw object bytes one step of the hash-order walk takes before the page
/// checks its size and yields.
const WALK_BATCH_BYTES: usize = 256 << 10;

/// Rows offered to a query: decode, filter, sink.
struct QueryVisit<'c> {
    compiled: &'c Compiled,
    sink: Sink,
    /// Log walk: stop taking rows once the page is full (the walk then
    /// switches to paging). Hash walk: take every row of the batch, so a
    /// page never ends in the middle of a hash.
    stop_when_full: bool,
    visited: u64,
    matched: u64,
    /// The first row that did not decode or convert: (key, why).
    bad: Option<(Vec<u8>, String)>,
}

impl<'c> QueryVisit<'c> {
    fn new(compiled: &'c Compiled, stop_when_full: bool) -> QueryVisit<'c> {
        QueryVisit {
            compiled,
            sink: compiled.sink(PAGE_BYTES),
            stop_when_full,
            visited: 0,
            matched: 0,
            bad: None,
        }
    }

    fn refusal(&self) -> Option<Refusal> {
        self.bad.as_ref().map(|(key, why)| {
            (
                Status::BadRequest,
                format!("row of key {}: {why}", show_key(key)),
            )
        })
    }
}

impl ObjectSink for QueryVisit<'_> {
    #[inline]
    fn object(&mut self, key: &[u8], value: &[u8]) {
        if self.bad.is_some() || (self.stop_when_full && self.sink.is_full()) {
            return;
        }
        self.visited += 1;
        match RowRef::new(self.compiled.layout(), value) {
            Err(e) => self.bad = Some((key.to_vec(), e.to_string())),
            Ok(row) => {
                if self.compiled.filter(&row) {
                    self.matched += 1;
                    if let Err(e) = self.sink.push(&row) {
                        self.bad = Some((key.to_vec(), e.to_string()));
                    }
                }
            }
        }
    }

    fn reset(&mut self) {
        self.sink.reset();
        self.visited = 0;
        self.matched = 0;
        self.bad = None;
    }

    fn done(&self) -> bool {
        self.bad.is_some() || (self.stop_when_full && self.sink.is_full())
    }
}

#[allow(clippy::too_many_arguments)] // the fields of Request::Query
async fn execute(
    state: &ShardState,
    table: u64,
    start_hash: u64,
    end_hash: u64,
    map_version: u64,
    schema: &Schema,
    plan: &QueryPlan,
    resume: Option<u64>,
) -> Result<QueryResult, Refusal> {
    let started = Instant::now();
    schema
        .check()
        .map_err(|e| (Status::BadRequest, format!("bad schema: {e}")))?;
    let compiled = compile(schema, plan).map_err(|e| (Status::BadRequest, e.to_string()))?;
    let source = Source::Log;
    let mut run = Run {
        hold: None,
        state,
        table,
        start_hash,
        end_hash,
        map_version,
        source: &source,
        write: false,
        restarts: 0,
        index_snap: std::cell::RefCell::new(None),
    };
    let from = match resume {
        Some(h) => h,
        None => {
            let mut visit = QueryVisit::new(&compiled, true);
            run.scan(&mut visit).await?;
            if let Some(r) = visit.refusal() {
                return Err(r);
            }
            if !visit.sink.is_full() || visit.sink.rows_limit_reached() {
                let (visited, matched) = (visit.visited, visit.matched);
                let data = visit
                    .sink
                    .finish()
                    .map_err(|e| (Status::Internal, e.to_string()))?;
                return Ok(QueryResult {
                    data,
                    visited,
                    matched,
                    server_nanos: started.elapsed().as_nanos() as u64,
                    resume: None,
                });
            }
            // Too many rows for one page: page in hash order from the start.
            0
        }
    };
    drop(run.hold.take());
    let mut visit = QueryVisit::new(&compiled, false);
    let mut cursor = from;
    let mut chunk_start = Instant::now();
    let resume = loop {
        let next = {
            let engine = state.engine.borrow();
            let mut walks = state.enumerate.borrow_mut();
            let (objects, next) = walks
                .next_batch(&engine, table, start_hash, cursor, WALK_BATCH_BYTES)
                .map_err(engine_refusal)?;
            for o in objects {
                visit.object(o.key, o.value);
            }
            next
        };
        if let Some(r) = visit.refusal() {
            return Err(r);
        }
        match next {
            None => break None,
            Some(_) if visit.sink.rows_limit_reached() => break None,
            Some(h) if visit.sink.is_full() => break Some(h),
            Some(h) => cursor = h,
        }
        if chunk_start.elapsed() >= CHUNK {
            tokio::task::yield_now().await;
            run.check()?;
            chunk_start = Instant::now();
        }
    };
    run.check()?;
    let (visited, matched) = (visit.visited, visit.matched);
    let data = visit
        .sink
        .finish()
        .map_err(|e| (Status::Internal, e.to_string()))?;
    Ok(QueryResult {
        data,
        visited,
        matched,
        server_nanos: started.elapsed().as_nanos() as u64,
        resume,
    })
}

#[allow(clippy::too_many_arguments)] // the fields of Request::Query
pub async fn handle(
    state: &ShardState,
    id: u64,
    table: u64,
    start_hash: u64,
    end_hash: u64,
    map_version: u64,
    schema: Schema,
    plan: QueryPlan,
    resume: Option<u64>,
    out: &mut BytesMut,
) {
    let result = execute(
        state,
        table,
        start_hash,
        end_hash,
        map_version,
        &schema,
        &plan,
        resume,
    )
    .await;
    match result {
        Ok(result) => crate::handler::reply(out, id, &Response::Query(result)),
        Err((status, message)) => encode_error(out, id, status, message),
    }
}
