//! Data operations (pushdown): count, aggregate, update and the
//! logistic-regression gradient, computed on the storage servers.
//!
//! A [`ScanPlan`] is sent to every tablet of the table in parallel; each
//! request names the tablet's hash range and the map version that placed it.
//! A shard refuses a request whose tablet it does not serve exactly as named
//! (`StaleMap`, `UnknownTablet`, `Retry`), before and after its scan; the
//! client then refreshes its map and asks the tablet's current owner (the
//! retry loop of `Client`). The partial results of all tablets are merged
//! here. If the table's tablet *layout* (the set of ranges) changes midway,
//! the whole operation is redone on the new layout, so every hash range is
//! counted exactly once: a result is exact or an error.
//!
//! An update carries a random operation id, the same in every resend of a
//! tablet's request: a shard that already applied it answers with the
//! remembered result instead of applying it again, so a request lost with
//! its connection is resent like a read. It also carries the time the
//! client still waits; a shard whose budget passed writes nothing. If some
//! tablets fail, the error names the tablets that applied (with counts) and
//! those that did not.

use std::time::{Duration, Instant};

use insitu_compute::{merge_partial, validate_plan};
use insitu_protocol::plan::{
    AggPartial, Field, GradPartial, KeyRange, Op, Partial, PointLayout, PredOp, ScanPlan,
    ScanResult, Source, UpdateAction,
};
use insitu_protocol::{Request, Response, Status, TabletInfo};

use crate::client::{Client, decode};
use crate::error::ClientError;

/// Layout changes tolerated before an operation gives up.
const MAX_LAYOUT_RETRIES: u32 = 20;
/// Fresh snapshots tried before a snapshot read gives up. Why more than
/// one: the first snapshot read after a quiet time is always refused (the
/// shards start keeping versions then), and a tablet arriving on a shard
/// (a move, a recovery) refuses the snapshots older than it.
pub const MAX_SNAPSHOT_RETRIES: u32 = 10;

/// A merged result and what it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOutcome {
    pub partial: Partial,
    /// Objects the servers visited, matched or not.
    pub visited: u64,
    /// Objects that passed the key range and the predicate.
    pub matched: u64,
    /// Tablets asked.
    pub tablets: usize,
    /// Longest server-side scan time of one tablet.
    pub max_server_time: Duration,
    /// Scan restarts on the servers (tablet written or cleaned between chunks).
    pub restarts: u32,
    /// The snapshot every tablet was read at (0: none, each tablet as it was
    /// when scanned).
    pub snapshot_ts: u64,
    /// Times every tablet was read again at a fresh snapshot because a
    /// shard refused the one before (`Status::SnapshotTooOld`).
    pub snapshot_retries: u32,
}

/// Whether an operation reads every tablet at one snapshot timestamp: the
/// result is then the table's contents at one instant, as transactions
/// committed it (ARCHITECTURE.md, "Snapshot reads"). Costs a timestamp
/// from the coordinator per operation and makes the servers keep replaced
/// versions while snapshots are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtSnapshot {
    /// On when the table has more than one tablet (one tablet is read at
    /// one instant anyway).
    #[default]
    Auto,
    On,
    Off,
    /// At this timestamp (from `Client::timestamp`), e.g. to run several
    /// operations on one snapshot. Refused with `SnapshotTooOld` (not
    /// retried) when a server no longer keeps, or never kept, what it needs,
    /// and with `BadRequest` for 0 or a timestamp not yet handed out.
    At(u64),
}

/// Which objects an operation covers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    pub key_range: Option<KeyRange>,
    /// Postfix predicate program (see `insitu_protocol::plan`); empty = all.
    pub filter: Vec<PredOp>,
    /// As of one snapshot, or each tablet as it is (see [`AtSnapshot`]).
    pub at_snapshot: AtSnapshot,
}

impl Selection {
    pub fn all() -> Selection {
        Selection::default()
    }
    pub fn filter(filter: Vec<PredOp>) -> Selection {
        Selection {
            key_range: None,
            filter,
            at_snapshot: AtSnapshot::Auto,
        }
    }
    fn plan(&self, op: Op) -> ScanPlan {
        ScanPlan {
            source: Source::Log,
            key_range: self.key_range.clone(),
            filter: self.filter.clone(),
            op,
        }
    }
}

fn merge(into: &mut Option<Partial>, p: Partial) -> Result<(), ClientError> {
    merge_partial(into, p).map_err(|what| ClientError::Unexpected {
        addr: String::new(),
        what,
    })
}

impl Client {
    /// Run `plan` on every tablet of `table` and merge the partial results
    /// (read-only plans at one snapshot when the table has several tablets).
    pub async fn execute_plan(
        &self,
        table: u64,
        plan: &ScanPlan,
    ) -> Result<PlanOutcome, ClientError> {
        self.execute_plan_at(table, plan, AtSnapshot::Auto).await
    }

    /// `execute_plan`, saying whether to read one snapshot (never for an
    /// update: it changes the newest versions).
    pub async fn execute_plan_at(
        &self,
        table: u64,
        plan: &ScanPlan,
        at: AtSnapshot,
    ) -> Result<PlanOutcome, ClientError> {
        // Refuse a bad plan here with the server's own check (the servers
        // check again): an out-of-range `set` never leaves the client.
        validate_plan(plan)
            .map_err(|e| ClientError::Status(Status::BadRequest, format!("bad plan: {e}")))?;
        let is_update = plan.op.is_update();
        let deadline = Instant::now() + self.inner.config.op_timeout;
        if is_update && matches!(at, AtSnapshot::On | AtSnapshot::At(_)) {
            return Err(ClientError::Status(
                Status::BadRequest,
                "an update cannot run at a snapshot (it changes the newest versions)".into(),
            ));
        }
        if let AtSnapshot::At(ts) = at {
            self.check_snapshot_ts(ts).await?;
        }
        let mut layout_retries = 0;
        let mut snapshot_retries = 0;
        loop {
            let (ranges, seen) = self.tablet_ranges(table, deadline).await?;
            let op_id = if is_update { new_op_id() } else { 0 };
            let snapshot_ts = match at {
                _ if is_update => 0,
                AtSnapshot::Off => 0,
                AtSnapshot::Auto if ranges.len() < 2 => 0,
                AtSnapshot::At(ts) => ts,
                AtSnapshot::Auto | AtSnapshot::On => self.timestamp().await?,
            };
            let calls = ranges.iter().map(|&(s, e)| {
                self.scan_tablet(table, (s, e), plan, (op_id, snapshot_ts), deadline)
            });
            let results = futures::future::join_all(calls).await;
            let mut layout_changed = None;
            let mut too_old = None;
            let mut ok = Vec::with_capacity(results.len());
            let mut failed = Vec::new();
            for (r, &(s, _)) in results.into_iter().zip(&ranges) {
                match r {
                    Ok(r) => ok.push((s, r)),
                    Err(LayoutOr::Layout(why)) => layout_changed = Some(why),
                    Err(LayoutOr::Error(e)) if e.status() == Some(Status::SnapshotTooOld) => {
                        too_old = Some(e)
                    }
                    Err(LayoutOr::Error(e)) if is_update => failed.push((s, e)),
                    Err(LayoutOr::Error(e)) => return Err(e),
                }
            }
            if let Some((_, first)) = failed.first() {
                return Err(partial_update_error(first, &ok, &failed));
            }
            if let Some(why) = layout_changed {
                // Partial results of an update on the unchanged tablets were
                // applied; redoing them would apply them twice.
                if is_update {
                    return Err(ClientError::Status(
                        Status::StaleMap,
                        format!(
                            "the table's tablets were split or merged during the update: {why}"
                        ),
                    ));
                }
                layout_retries += 1;
                if layout_retries > MAX_LAYOUT_RETRIES || Instant::now() >= deadline {
                    return Err(ClientError::Status(Status::StaleMap, why));
                }
                self.refresh(table, seen, deadline).await?;
                continue;
            }
            if let Some(e) = too_old {
                // Every tablet must be read at the same timestamp: all again.
                snapshot_retries += 1;
                if matches!(at, AtSnapshot::At(_))
                    || snapshot_retries > MAX_SNAPSHOT_RETRIES
                    || Instant::now() >= deadline
                {
                    return Err(e);
                }
                continue;
            }
            let mut partial = None;
            let mut out = PlanOutcome {
                partial: Partial::Count(0),
                visited: 0,
                matched: 0,
                tablets: ok.len(),
                max_server_time: Duration::ZERO,
                restarts: 0,
                snapshot_ts,
                snapshot_retries,
            };
            for (_, r) in ok {
                out.visited += r.visited;
                out.matched += r.matched;
                out.restarts += r.restarts;
                out.max_server_time = out
                    .max_server_time
                    .max(Duration::from_nanos(r.server_nanos));
                merge(&mut partial, r.partial)?;
            }
            if let Some(p) = partial {
                out.partial = p;
            }
            return Ok(out);
        }
    }

    /// One tablet, with the retry policy of `Client::routed`.
    async fn scan_tablet(
        &self,
        table: u64,
        (start, end): (u64, u64),
        plan: &ScanPlan,
        (op_id, snapshot_ts): (u64, u64),
        deadline: Instant,
    ) -> Result<ScanResult, LayoutOr> {
        self.tablet_op(
            table,
            (start, end),
            // Read-only, or an update the shard deduplicates by `op_id`.
            |t| Request::Scan {
                table,
                start_hash: t.start_hash,
                end_hash: t.end_hash,
                map_version: t.map_version,
                plan: plan.clone(),
                op_id,
                budget_ms: deadline
                    .saturating_duration_since(Instant::now())
                    .as_millis()
                    .clamp(1, u32::MAX as u128) as u32,
                snapshot_ts,
            },
            "Scan",
            |r| match r {
                Response::Scan(r) => Ok(r),
                other => Err(format!("{other:?}")),
            },
        )
        .await
    }

    /// Number of objects of `table` in the selection.
    pub async fn count(&self, table: u64, sel: &Selection) -> Result<u64, ClientError> {
        match self
            .execute_plan_at(table, &sel.plan(Op::Count), sel.at_snapshot)
            .await?
            .partial
        {
            Partial::Count(n) => Ok(n),
            other => Err(wrong_kind(other)),
        }
    }

    /// count, sum, min, max (and avg) of `field` over the selection.
    pub async fn aggregate(
        &self,
        table: u64,
        field: Field,
        sel: &Selection,
    ) -> Result<AggPartial, ClientError> {
        self.aggregate_with(table, field, sel, Source::Log)
            .await
            .map(|(a, _)| a)
    }

    /// `aggregate` with the server-side strategy forced (log traversal, hash
    /// table iteration, or hash table lookups of integer keys).
    pub async fn aggregate_with(
        &self,
        table: u64,
        field: Field,
        sel: &Selection,
        source: Source,
    ) -> Result<(AggPartial, PlanOutcome), ClientError> {
        let mut plan = sel.plan(Op::Aggregate { field });
        plan.source = source;
        let out = self.execute_plan_at(table, &plan, sel.at_snapshot).await?;
        match &out.partial {
            Partial::Aggregate(a) => Ok((*a, out)),
            other => Err(wrong_kind(other.clone())),
        }
    }

    /// count, sum, min, max of the JSON numbers at `path` (e.g. `$.age`,
    /// `insitu_compute::parse_path`) over the selection; objects that are
    /// not JSON or hold no number there are skipped. Integers within i64
    /// sum exactly in `sum_int`, other numbers in `sum_float`
    /// (`AggExt::mixed_sum` adds them up).
    pub async fn aggregate_json(
        &self,
        table: u64,
        path: insitu_protocol::plan::JsonPath,
        sel: &Selection,
    ) -> Result<AggPartial, ClientError> {
        let plan = sel.plan(Op::JsonAggregate { path });
        match self
            .execute_plan_at(table, &plan, sel.at_snapshot)
            .await?
            .partial
        {
            Partial::Aggregate(a) => Ok(a),
            other => Err(wrong_kind(other)),
        }
    }

    /// Change `field` of every object in the selection, on the servers; each
    /// change is a new version. Returns how many objects were updated.
    pub async fn update(
        &self,
        table: u64,
        field: Field,
        action: UpdateAction,
        sel: &Selection,
    ) -> Result<u64, ClientError> {
        let plan = sel.plan(Op::Update { field, action });
        updated_count(self.execute_plan(table, &plan).await?.partial)
    }

    /// Change the columns `set` names (each `(column, action)`) of every row
    /// of the typed table `table` that `filter` passes (SQL's three-valued logic), on the servers; each
    /// change is a new version, and an object's deadline is kept. Checked
    /// here against the schema first (the servers check again): a value the
    /// column cannot hold, a key column or a bad filter never leaves the
    /// client. Returns how many rows were written: every row `filter`
    /// passes, as SQL counts (an `Add` leaves a NULL NULL).
    pub async fn update_rows(
        &self,
        table: u64,
        schema: &insitu_protocol::schema::Schema,
        filter: Vec<insitu_protocol::query::Pred>,
        set: Vec<(u16, insitu_protocol::plan::RowAction)>,
    ) -> Result<u64, ClientError> {
        insitu_query::RowUpdate::compile(schema, &filter, &set)
            .map_err(|e| ClientError::Status(Status::BadRequest, e.to_string()))?;
        let plan = ScanPlan::new(Op::UpdateRows {
            schema: schema.clone(),
            filter,
            set,
        });
        updated_count(self.execute_plan(table, &plan).await?.partial)
    }

    /// Remove every object of `table` in the selection (key range and
    /// filter), on the servers: each tablet's objects all or none (a value
    /// too short for the filter refuses that tablet's removal). Returns how
    /// many objects were removed. Never at a snapshot.
    pub async fn remove_where(&self, table: u64, sel: &Selection) -> Result<u64, ClientError> {
        let plan = sel.plan(Op::Remove);
        updated_count(self.execute_plan(table, &plan).await?.partial)
    }

    /// Remove every row of the typed table `table` that `filter` passes
    /// (SQL's three-valued logic), on the servers: each tablet's rows all or
    /// none. Checked here against the schema first. Returns how many rows
    /// were removed.
    pub async fn delete_rows(
        &self,
        table: u64,
        schema: &insitu_protocol::schema::Schema,
        filter: Vec<insitu_protocol::query::Pred>,
    ) -> Result<u64, ClientError> {
        insitu_query::compile_filter(schema, &filter)
            .map_err(|e| ClientError::Status(Status::BadRequest, e.to_string()))?;
        let plan = ScanPlan::new(Op::RemoveRows {
            schema: schema.clone(),
            filter,
        });
        updated_count(self.execute_plan(table, &plan).await?.partial)
    }

    /// Logistic-regression gradient and log-loss sums over every point of
    /// `table` at (`weights`, `bias`).
    pub async fn gradient(
        &self,
        table: u64,
        layout: PointLayout,
        weights: &[f32],
        bias: f32,
    ) -> Result<GradPartial, ClientError> {
        let plan = ScanPlan::new(Op::Gradient {
            layout,
            weights: weights.to_vec(),
            bias,
        });
        match self.execute_plan(table, &plan).await?.partial {
            Partial::Gradient(g) => Ok(g),
            other => Err(wrong_kind(other)),
        }
    }

    /// Train a logistic regression by batch gradient descent, computing every
    /// gradient on the servers: `iterations` steps of
    /// `w -= rate * grad / n`, `b -= rate * bias_grad / n`, from zero.
    /// Returns the weights, the bias and the mean log-loss of each iteration.
    pub async fn train_logreg(
        &self,
        table: u64,
        layout: PointLayout,
        iterations: u32,
        rate: f64,
    ) -> Result<TrainedModel, ClientError> {
        let dims = layout.dims as usize;
        let mut w = vec![0f32; dims];
        let mut b = 0f32;
        let mut losses = Vec::with_capacity(iterations as usize);
        for _ in 0..iterations {
            let g = self.gradient(table, layout, &w, b).await?;
            if g.count == 0 {
                break;
            }
            let n = g.count as f64;
            losses.push(g.loss / n);
            step(&mut w, &mut b, &g, rate);
        }
        Ok(TrainedModel {
            weights: w,
            bias: b,
            losses,
        })
    }
}

/// A trained logistic-regression model.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainedModel {
    pub weights: Vec<f32>,
    pub bias: f32,
    /// Mean log-loss before each step.
    pub losses: Vec<f64>,
}

/// One gradient-descent step; shared by `train_logreg` and in-memory references.
pub fn step(w: &mut [f32], b: &mut f32, g: &GradPartial, rate: f64) {
    let n = g.count.max(1) as f64;
    for (wj, gj) in w.iter_mut().zip(&g.grad) {
        *wj = (*wj as f64 - rate * gj / n) as f32;
    }
    *b = (*b as f64 - rate * g.bias / n) as f32;
}

/// A random, non-zero operation id (the std hasher's per-process random keys
/// mixed with a counter and the clock: unique enough to name one update).
fn new_op_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
}

/// An update that failed on some tablets: which applied (and how many
/// objects), which did not and why. Keeps the first failure's status.
fn partial_update_error(
    first: &ClientError,
    ok: &[(u64, ScanResult)],
    failed: &[(u64, ClientError)],
) -> ClientError {
    let applied: Vec<String> = ok
        .iter()
        .map(|(s, r)| match r.partial {
            Partial::Update { updated } => format!("{s:#018x} ({updated} objects)"),
            _ => format!("{s:#018x}"),
        })
        .collect();
    let not: Vec<String> = failed
        .iter()
        .map(|(s, e)| format!("{s:#018x}: {e}"))
        .collect();
    let msg = format!(
        "update failed on {} of {} tablets; applied on [{}]; not applied on [{}]",
        failed.len(),
        failed.len() + ok.len(),
        applied.join(", "),
        not.join("; ")
    );
    ClientError::Status(first.status().unwrap_or(Status::Internal), msg)
}

/// How one tablet's part of a whole-table operation failed.
pub(crate) enum LayoutOr {
    /// The tablet layout changed since the operation was planned: run the
    /// whole operation again.
    Layout(String),
    Error(ClientError),
}

impl Client {
    /// One call to the tablet `range` of `table` (found by its start hash,
    /// with the retry policy of `routed`; the request is read-only or
    /// deduplicated, so it may be sent again), for the whole-table
    /// operations (pushdown scans, typed queries). A reply from a tablet
    /// whose range is no longer `range` is a layout change; a status other
    /// than Ok is an error; `pick` takes the expected response or describes
    /// the one that came instead (`what` names the request in that error).
    pub(crate) async fn tablet_op<'r, T>(
        &self,
        table: u64,
        range: (u64, u64),
        make: impl Fn(&TabletInfo) -> Request<'r>,
        what: &str,
        pick: impl FnOnce(Response<'_>) -> Result<T, String>,
    ) -> Result<T, LayoutOr> {
        let (start, end) = range;
        let got = self
            .routed(table, start, true, make, |reply, t, addr| {
                if (t.start_hash, t.end_hash) != (start, end) {
                    return Ok(Err(format!(
                        "tablet {start:#x}..={end:#x} is now {:#x}..={:#x}",
                        t.start_hash, t.end_hash
                    )));
                }
                if reply.status != Status::Ok {
                    return Err(ClientError::Status(reply.status, reply.error_message()));
                }
                pick(decode(&reply, addr)?)
                    .map(Ok)
                    .map_err(|other| ClientError::unexpected(addr, format!("{other} to {what}")))
            })
            .await;
        match got {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(why)) => Err(LayoutOr::Layout(why)),
            Err(e) => Err(LayoutOr::Error(e)),
        }
    }
}

/// How many objects an update or removal plan changed, from its merged
/// result (every such plan answers with `Partial::Update`).
fn updated_count(p: Partial) -> Result<u64, ClientError> {
    match p {
        Partial::Update { updated } => Ok(updated),
        other => Err(wrong_kind(other)),
    }
}

fn wrong_kind(p: Partial) -> ClientError {
    ClientError::Unexpected {
        addr: String::new(),
        what: format!("partial result of the wrong kind: {p:?}"),
    }
}
