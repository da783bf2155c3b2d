//! Typed queries (`Request::Query`) on one tablet of this shard: filter,
//! projection, top-k and grouped aggregates over typed rows, evaluated by
//! `insitu-query`, answered as Arrow pages or partial aggregates.
//!
//! Two ways through a tablet:
//! - A first request (`resume: None`) walks the tablet's log with the scan
//!   driver (`scan_run.rs`): sequential reads, exact for one instant of the
//!   tablet (the driver restarts holding the tablet if it changed between
//!   chunks), and yielding every ~1 ms. Rows that outgrow one page
//!   (`PAGE_BYTES`) are cut into pages as the walk goes; the first page is
//!   the reply and the shard holds the rest for the client to fetch
//!   (`held.rs`, `QueryResume::Held`). Aggregates (bounded by `MAX_GROUPS`)
//!   and top-k (bounded by `MAX_TOP_K`) are always one page.
//! - Only when the held pages would pass `MAX_HELD_BYTES`, or the memory
//!   budget refuses them, is the walk abandoned (its rows dropped) and the
//!   answer paged in key-hash order instead (the walk `Enumerate` uses,
//!   `enumerate.rs`; `QueryResume::Hash`): each page ends at a hash boundary
//!   and names the hash to resume from. The guarantee is then
//!   `Enumerate`'s: a row present and unchanged during the whole query is
//!   returned exactly once; a row written meanwhile may be returned with
//!   either value, or not at all if created after its page's list was taken.
//!
//! At a snapshot (`snapshot_ts` > 0) the log or index walk goes through the
//! snapshot overlay (`snapshot.rs`), exactly as an untyped scan at a
//! snapshot does; such an answer must fit the held pages (the hash-order
//! paging reads only the newest rows), else it is refused, saying so.
//!
//! A row that does not decode with the schema (written by other means than
//! a typed client) fails the query with its key named; it never panics.

use std::time::Instant;

use bytes::BytesMut;
use insitu_protocol::plan::Source;
use insitu_protocol::query::{IndexProbe, QueryData, QueryPlan, QueryResult, QueryResume};
use insitu_protocol::schema::Schema;
use insitu_protocol::{Response, Status};
use insitu_query::{Compiled, Sink, compile};

use crate::held::{MAX_HELD_BYTES, Page};
use crate::scan_run::{CHUNK, ObjectSink, Refusal, Run, engine_refusal, show_key};
use crate::shard::ShardState;
use crate::snapshot::{self, Overlay};

/// Arrow bytes of rows per reply page. Why 1 MiB: a frame carries 4 MiB; a
/// page may overshoot by one row, or by one hash-walk batch
/// (`WALK_BATCH_BYTES` of input) when paging in hash order.
const PAGE_BYTES: usize = 1 << 20;
/// Raw object bytes one step of the hash-order walk takes before the page
/// checks its size and yields.
const WALK_BATCH_BYTES: usize = 256 << 10;

/// Pages cut from a log walk, to be held (`held.rs`).
#[derive(Default)]
struct Cut {
    pages: Vec<Page>,
    bytes: usize,
    /// The pages would pass MAX_HELD_BYTES or the budget refused one: the
    /// walk stops and the answer is paged in hash order instead.
    overflow: bool,
}

/// Rows offered to a query: decode, filter, sink.
struct QueryVisit<'c> {
    compiled: &'c Compiled,
    /// The engine whose budget held pages are charged to.
    state: &'c ShardState,
    sink: Sink,
    /// Log walk: full pages are cut off into here. Hash walk: `None`, the
    /// sink takes every row of a batch (a page never ends inside a hash).
    cut: Option<Cut>,
    visited: u64,
    matched: u64,
    /// The first row that did not decode or convert: (key, why).
    bad: Option<(Vec<u8>, String)>,
    /// `done()`, kept up to date by `offer` (the only place that changes
    /// what it reads), so the walk's every row tests one flag.
    stop: bool,
}

impl<'c> QueryVisit<'c> {
    fn new(compiled: &'c Compiled, state: &'c ShardState, cut: bool) -> QueryVisit<'c> {
        QueryVisit {
            compiled,
            state,
            sink: compiled.sink(PAGE_BYTES),
            cut: cut.then(Cut::default),
            visited: 0,
            matched: 0,
            bad: None,
            stop: false,
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

    fn overflowed(&self) -> bool {
        self.cut.as_ref().is_some_and(|c| c.overflow)
    }

    /// The sink's page is full: cut it off and keep it, charged to the budget.
    fn cut_page(&mut self) {
        let Some(cut) = self.cut.as_mut() else { return };
        let (data, rows) = match self.sink.take_page() {
            Ok(Some(page)) => page,
            Ok(None) => return,
            Err(e) => {
                self.bad = Some((Vec::new(), e.to_string()));
                return;
            }
        };
        let charge = self
            .state
            .engine
            .borrow()
            .try_charge_transient(data.len() as u64);
        match charge {
            Ok(charge) if cut.bytes + data.len() <= MAX_HELD_BYTES => {
                cut.bytes += data.len();
                cut.pages.push(Page {
                    data,
                    rows,
                    _charge: charge,
                });
            }
            _ => {
                cut.overflow = true;
                cut.pages.clear();
            }
        }
    }

    /// A row the cheap first look did not reject: the whole filter, then
    /// the sink. Out of line so that `object`, which runs for every row of
    /// the walk, stays small enough to inline into it.
    #[inline(never)]
    fn offer(&mut self, key: &[u8], value: &[u8]) {
        match self.compiled.keep_unrejected(value) {
            Err(e) => self.bad = Some((key.to_vec(), e.to_string())),
            Ok(None) => {}
            Ok(Some(row)) => {
                self.matched += 1;
                if let Err(e) = self.sink.push(&row) {
                    self.bad = Some((key.to_vec(), e.to_string()));
                } else if self.cut.is_some()
                    && self.sink.is_full()
                    && !self.sink.rows_limit_reached()
                {
                    self.cut_page();
                }
            }
        }
        self.stop = self.bad.is_some() || self.overflowed() || self.sink.rows_limit_reached();
    }
}

impl ObjectSink for QueryVisit<'_> {
    /// Every live row of the walk comes here. Why so small: on a selective
    /// scan nearly every row ends at `rejects` (see there).
    #[inline(always)]
    fn object(&mut self, key: &[u8], value: &[u8]) {
        if self.stop {
            return;
        }
        self.visited += 1;
        if self.compiled.rejects(value) {
            return;
        }
        self.offer(key, value);
    }

    fn reset(&mut self) {
        self.sink.reset();
        if let Some(cut) = self.cut.as_mut() {
            *cut = Cut::default();
        }
        self.visited = 0;
        self.matched = 0;
        self.bad = None;
        self.stop = false;
    }

    fn done(&self) -> bool {
        debug_assert_eq!(
            self.stop,
            self.bad.is_some() || self.overflowed() || self.sink.rows_limit_reached()
        );
        self.stop
    }
}

/// The shard's copy of a tablet's query, for the tablet checks of `Run`.
fn run<'a>(
    state: &'a ShardState,
    (table, start_hash, end_hash, map_version): (u64, u64, u64, u64),
    source: &'a Source,
) -> Run<'a> {
    Run {
        hold: None,
        state,
        table,
        start_hash,
        end_hash,
        map_version,
        source,
        write: false,
        restarts: 0,
        index_snap: std::cell::RefCell::new(None),
        clock_ms: None,
    }
}

/// The sink's answer. An evaluation error here (a sum past 128 bits found
/// when the last batch of aggregates ran) is the query's, not the server's.
fn finished(sink: Sink) -> Result<QueryData, Refusal> {
    sink.finish().map_err(|e| {
        let status = match e {
            insitu_query::QueryError::Eval(_) => Status::BadRequest,
            _ => Status::Internal,
        };
        (status, e.to_string())
    })
}

/// Feed the tablet's rows to `visit`: those with the `candidates` hashes
/// (a secondary index's) or, with none, the whole log.
async fn walk(
    run: &mut Run<'_>,
    visit: &mut impl ObjectSink,
    candidates: Option<&[u64]>,
) -> Result<(), Refusal> {
    match candidates {
        Some(hashes) => index_walk(run, visit, hashes).await,
        None => run.scan(visit).await,
    }
}

/// Feed the objects with `hashes` (a secondary index's candidates) to
/// `visit`, yielding every ~1 ms and checking the tablet after each yield.
/// Each hash is read once, so a row is returned at most once; a row changed
/// during the walk may be seen with either value.
async fn index_walk(
    run: &Run<'_>,
    visit: &mut impl ObjectSink,
    hashes: &[u64],
) -> Result<(), Refusal> {
    let mut chunk_start = Instant::now();
    for chunk in hashes.chunks(256) {
        {
            let engine = run.state.engine.borrow();
            let _then = run.clock_ms.map(|ms| engine.pin_clock(ms));
            for &h in chunk {
                engine
                    .objects_with_hash(run.table, run.start_hash, h, |o| {
                        visit.object(o.key, o.value)
                    })
                    .map_err(engine_refusal)?;
            }
        }
        if visit.done() {
            break;
        }
        if chunk_start.elapsed() >= CHUNK {
            tokio::task::yield_now().await;
            run.check()?;
            chunk_start = Instant::now();
        }
    }
    run.check()
}

async fn execute(
    state: &ShardState,
    tablet: (u64, u64, u64, u64),
    (schema, plan): (&Schema, &QueryPlan),
    (resume, index, snapshot_ts): (Option<QueryResume>, Option<&IndexProbe>, u64),
) -> Result<QueryResult, Refusal> {
    let started = Instant::now();
    let (table, start_hash, end_hash, _) = tablet;
    let source = Source::Log;
    let mut run = run(state, tablet, &source);
    if snapshot_ts != 0 {
        run.clock_ms = Some(crate::versions::clock_ms_at(snapshot_ts));
    }
    let reply = |data, visited, matched, resume| QueryResult {
        data,
        visited,
        matched,
        server_nanos: started.elapsed().as_nanos() as u64,
        resume,
    };
    let from = match resume {
        Some(QueryResume::Held { cursor, page }) => {
            // The tablet must still be this shard's to answer for it.
            run.check()?;
            let got = state
                .held
                .borrow_mut()
                .fetch(cursor, table, start_hash, page);
            let Some((data, rows, last)) = got else {
                return Err((
                    Status::CursorExpired,
                    format!(
                        "query pages {cursor}/{page} of tablet {table}/{start_hash:#x} are gone"
                    ),
                ));
            };
            let next = (!last).then(|| QueryResume::Held {
                cursor,
                page: page + 1,
            });
            return Ok(reply(QueryData::Rows(data), 0, rows, next));
        }
        Some(QueryResume::Hash(h)) => h,
        None => {
            schema
                .check()
                .map_err(|e| (Status::BadRequest, format!("bad schema: {e}")))?;
            let compiled =
                compile(schema, plan).map_err(|e| (Status::BadRequest, e.to_string()))?;
            let mut visit = QueryVisit::new(&compiled, state, true);
            run.check()?;
            let snap = match snapshot_ts {
                0 => None,
                ts => Some(snapshot::begin(state, table, (start_hash, end_hash), ts).await?),
            };
            let candidates = match index {
                Some(probe) => {
                    crate::sindex::candidates(state, table, start_hash, schema, probe).await?
                }
                None => None,
            };
            // At a snapshot, the rows a commit after it changed are read
            // from the kept versions (`snapshot.rs`): the overlay skips their
            // newest values during the walk and feeds the older ones after
            // it. An index walk finds the current rows that match; a row
            // that matched only at the snapshot is among the changed ones
            // the overlay feeds, and the filter decides.
            match &snap {
                None => walk(&mut run, &mut visit, candidates.as_deref()).await?,
                Some(snap) => {
                    let range = (table, (start_hash, end_hash));
                    let mut o = Overlay::new(visit, state, range, snap, &source);
                    walk(&mut run, &mut o, candidates.as_deref()).await?;
                    visit = o.finish().await;
                    snapshot::check_end(state, snap)?;
                }
            }
            if let Some(r) = visit.refusal() {
                return Err(r);
            }
            if snap.is_some() && visit.overflowed() {
                // The hash-order paging below reads the newest rows only.
                return Err((
                    Status::BadRequest,
                    format!(
                        "the answer at snapshot {snapshot_ts} is more than one tablet may hold \
                         as pages (at most {MAX_HELD_BYTES} bytes, and what the memory budget \
                         leaves): select fewer rows or columns, aggregate, or read without a \
                         snapshot"
                    ),
                ));
            }
            if !visit.overflowed() {
                let (visited, matched) = (visit.visited, visit.matched);
                let mut pages = visit.cut.take().map(|c| c.pages).unwrap_or_default();
                let last_rows = visit.sink.len() as u64;
                let last = finished(visit.sink)?;
                if pages.is_empty() {
                    return Ok(reply(last, visited, matched, None));
                }
                // Page 0 is this reply; the shard holds the rest.
                let QueryData::Rows(data) = last else {
                    return Err((Status::Internal, "rows pages ended in groups".into()));
                };
                let charge = state
                    .engine
                    .borrow()
                    .try_charge_transient(data.len() as u64);
                // A refused charge pages in hash order, like any overflow.
                if let Ok(charge) = charge {
                    pages.push(Page {
                        data,
                        rows: last_rows,
                        _charge: charge,
                    });
                    let first = pages.remove(0);
                    let cursor = state.held.borrow_mut().hold(table, start_hash, pages);
                    let next = QueryResume::Held { cursor, page: 1 };
                    return Ok(reply(
                        QueryData::Rows(first.data),
                        visited,
                        first.rows,
                        Some(next),
                    ));
                }
            }
            // Too many rows to hold: page in hash order from the start.
            0
        }
    };
    drop(run.hold.take());
    schema
        .check()
        .map_err(|e| (Status::BadRequest, format!("bad schema: {e}")))?;
    let compiled = compile(schema, plan).map_err(|e| (Status::BadRequest, e.to_string()))?;
    let mut visit = QueryVisit::new(&compiled, state, false);
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
            Some(h) if visit.sink.is_full() => break Some(QueryResume::Hash(h)),
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
    Ok(reply(finished(visit.sink)?, visited, matched, resume))
}

/// Serve `Request::Query` over the tablet it names: (table, start hash, end
/// hash, map version).
pub async fn handle(
    state: &ShardState,
    id: u64,
    tablet: (u64, u64, u64, u64),
    (schema, plan): (Schema, QueryPlan),
    (resume, index, snapshot_ts): (Option<QueryResume>, Option<IndexProbe>, u64),
    out: &mut BytesMut,
) {
    let result = execute(
        state,
        tablet,
        (&schema, &plan),
        (resume, index.as_ref(), snapshot_ts),
    )
    .await;
    crate::handler::reply_or_refuse(out, id, result.map(Response::Query));
}
