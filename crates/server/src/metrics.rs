//! What a shard reports on the metrics port (`insitu_telemetry`), and its
//! figures for `Request::ShardStats` (`shard_stats`).
//!
//! The hot path touches only this shard's own counters (a `RefCell`ed map
//! on the shard thread: no atomics, no global registry lookup per request);
//! `publish` copies them into the process's recorder once a second, with
//! the gauges read from the engine (objects, bytes, segments per tablet,
//! memory, cleaner work), the connection count and the replication lag.
//! Latency is sampled: every `LATENCY_SAMPLE_EVERY`th request of a shard is
//! timed and goes into a histogram handle registered once per request kind.
//! Why sampled: two clock reads and a histogram append cost ~80 ns, ~5 % of
//! a pipelined point read's whole server time (1.4-1.8 us measured on the
//! bench machine); one request in 16 still gives thousands of samples a
//! second on a busy shard, and the counts stay exact.
//!
//! Every series carries `shard="HOST:PORT"` (unique in a cluster, known
//! before the server enlists) so one endpoint can show every server of an
//! `insitu up`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

// hashbrown's default hasher (foldhash): this map is looked up on every
// request, and std's SipHash costs several times more for a short key.
use hashbrown::HashMap;
use insitu_protocol::Status;

use crate::shard::ShardState;

/// One request in this many is timed (see the module comment).
pub const LATENCY_SAMPLE_EVERY: u64 = 16;

/// How often the counters and gauges are copied into the recorder.
const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

/// One request kind's counts on this shard.
struct KindCounts {
    /// Requests handled (refused ones included).
    requests: u64,
    /// Non-Ok replies, by status (a handful of statuses at most).
    errors: HashMap<Status, u64>,
    /// Time the shard spent handling, for the sampled requests (replication
    /// wait excluded: that is the connection's, shared by every reply of a
    /// batch).
    latency: metrics::Histogram,
}

/// A shard's request counters. Lives in `ShardState`.
pub struct ShardMetrics {
    /// The shard's listen address: the `shard` label.
    addr: String,
    by_kind: RefCell<HashMap<&'static str, KindCounts>>,
    /// Scans and queries being served now.
    scans_running: Cell<usize>,
    /// Requests handled since start (all kinds): `ShardStats::requests`.
    total: Cell<u64>,
    /// The longest synchronous handling of one point request, in ns, since
    /// start or the last reset: `ShardStats::longest_point_call_us`.
    longest_point_ns: Cell<u64>,
    /// Objects removed by the expiry sweep since start (`expiry.rs`).
    pub expired: Cell<u64>,
    /// Duration of each replication round that reached every backup, from
    /// its plan to the last backup's reply (`replicate::run`). Why: a
    /// durable reply waits for the round in flight and then its own, so
    /// this is what the replication wait is made of, and the request
    /// latency above leaves it out. Made on first use, so a cluster
    /// without replicas shows no series.
    replication_round: std::cell::OnceCell<metrics::Histogram>,
}

/// Counts a scan or query as running until dropped.
pub struct ScanRunning<'a>(&'a Cell<usize>);

impl Drop for ScanRunning<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

impl ShardMetrics {
    pub fn new(addr: String) -> ShardMetrics {
        // Install the recorder before the first handle is registered, so
        // no early sample is dropped.
        insitu_telemetry::recorder();
        ShardMetrics {
            addr,
            by_kind: RefCell::new(HashMap::new()),
            scans_running: Cell::new(0),
            total: Cell::new(0),
            longest_point_ns: Cell::new(0),
            expired: Cell::new(0),
            replication_round: std::cell::OnceCell::new(),
        }
    }

    /// Whether the next request is one of the timed ones.
    #[inline]
    pub fn sample_next(&self) -> bool {
        self.total.get().is_multiple_of(LATENCY_SAMPLE_EVERY)
    }

    /// One request of `kind` answered `status`; `elapsed`: its handling
    /// time if it was timed (`sample_next`).
    #[inline]
    pub fn record(&self, kind: &'static str, status: Status, elapsed: Option<Duration>) {
        self.total.set(self.total.get() + 1);
        let mut by_kind = self.by_kind.borrow_mut();
        let counts = by_kind.entry(kind).or_insert_with(|| KindCounts {
            requests: 0,
            errors: HashMap::new(),
            latency: metrics::histogram!(
                "insitu_request_duration_seconds",
                "shard" => self.addr.clone(),
                "kind" => kind
            ),
        });
        counts.requests += 1;
        if status != Status::Ok {
            *counts.errors.entry(status).or_insert(0) += 1;
        }
        if let Some(elapsed) = elapsed {
            counts.latency.record(elapsed.as_secs_f64());
        }
    }

    pub fn scan_started(&self) -> ScanRunning<'_> {
        self.scans_running.set(self.scans_running.get() + 1);
        ScanRunning(&self.scans_running)
    }

    /// A replication round reached every backup after `elapsed`.
    pub fn replication_round(&self, elapsed: Duration) {
        self.replication_round
            .get_or_init(|| {
                metrics::histogram!("insitu_replication_round_duration_seconds", "shard" => self.addr.clone())
            })
            .record(elapsed.as_secs_f64());
    }

    /// Requests handled since the shard started.
    pub fn total_requests(&self) -> u64 {
        self.total.get()
    }

    /// One point request took `elapsed` of the shard's time.
    #[inline]
    pub fn point_call(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        if ns > self.longest_point_ns.get() {
            self.longest_point_ns.set(ns);
        }
    }

    /// The longest point call since start or the last reset, in µs
    /// (rounded up); `reset` starts a new window.
    pub fn longest_point_call_us(&self, reset: bool) -> u64 {
        let ns = self.longest_point_ns.get();
        if reset {
            self.longest_point_ns.set(0);
        }
        ns.div_ceil(1000)
    }
}

/// Copy this shard's counters and gauges into the recorder, every second,
/// for as long as the shard runs.
pub async fn publish(state: Rc<ShardState>) {
    let mut tick = tokio::time::interval(PUBLISH_INTERVAL);
    loop {
        tick.tick().await;
        publish_once(&state);
    }
}

fn publish_once(state: &ShardState) {
    let m = &state.metrics;
    let shard = m.addr.clone();
    for (kind, counts) in m.by_kind.borrow().iter() {
        metrics::counter!("insitu_requests_total", "shard" => shard.clone(), "kind" => *kind)
            .absolute(counts.requests);
        for (status, n) in &counts.errors {
            metrics::counter!(
                "insitu_request_errors_total",
                "shard" => shard.clone(),
                "kind" => *kind,
                "status" => format!("{status:?}")
            )
            .absolute(*n);
        }
    }
    let gauge = |name: &'static str, value: f64| {
        metrics::gauge!(name, "shard" => shard.clone()).set(value);
    };
    gauge("insitu_connections", state.connections.get() as f64);
    gauge("insitu_scans_running", m.scans_running.get() as f64);
    let engine = state.engine.borrow();
    let mem = engine.memory();
    gauge("insitu_memory_budget_bytes", mem.budget_bytes as f64);
    gauge("insitu_memory_segment_bytes", mem.segment_bytes as f64);
    gauge("insitu_memory_index_bytes", mem.index_bytes as f64);
    gauge("insitu_memory_live_bytes", mem.live_bytes as f64);
    let used = mem.segment_bytes + mem.index_bytes + mem.transient_bytes;
    gauge(
        "insitu_memory_utilization_ratio",
        if mem.budget_bytes == 0 {
            0.0
        } else {
            used as f64 / mem.budget_bytes as f64
        },
    );
    let cleaned = engine.cleaner_totals();
    let counter = |name: &'static str, value: u64| {
        metrics::counter!(name, "shard" => shard.clone()).absolute(value);
    };
    counter(
        "insitu_cleaner_segments_cleaned_total",
        cleaned.segments_cleaned,
    );
    counter("insitu_cleaner_entries_moved_total", cleaned.entries_moved);
    counter("insitu_expired_objects_total", m.expired.get());
    counter("insitu_cleaner_bytes_freed_total", cleaned.bytes_freed);
    // Log changes the engine made that R backups do not hold yet (0: every
    // reply may leave at once).
    let pending = engine
        .log_changes()
        .saturating_sub(state.repl.durable_mark());
    gauge("insitu_replication_pending_changes", pending as f64);
    let tablets = engine.tablets();
    gauge("insitu_tablets", tablets.len() as f64);
    let (mut objects, mut segments, mut records) = (0u64, 0u64, 0u64);
    for t in &tablets {
        objects += t.object_count;
        segments += t.segments;
        records += engine.record_count(t.table, t.range.start) as u64;
        let labels = [
            ("shard", shard.clone()),
            ("table", t.table.to_string()),
            ("tablet", format!("{:016x}", t.range.start)),
        ];
        metrics::gauge!("insitu_tablet_objects", &labels).set(t.object_count as f64);
        metrics::gauge!("insitu_tablet_live_bytes", &labels).set(t.live_bytes as f64);
        metrics::gauge!("insitu_tablet_segment_bytes", &labels).set(t.segment_bytes as f64);
        metrics::gauge!("insitu_tablet_segments", &labels).set(t.segments as f64);
    }
    gauge("insitu_objects", objects as f64);
    gauge("insitu_segments", segments as f64);
    // Transactions' votes and decisions, updates' ids: a count that only
    // grows under a steady load means records that are never removed.
    gauge("insitu_side_records", records as f64);
}

/// The shard's figures for `Request::ShardStats` (the status page, `insitu
/// bench`, and the Redis port's `INFO`, which sums `expiring_*` over the
/// tablets of a table). `reset_longest_call`: see the request.
pub(crate) fn shard_stats(
    state: &ShardState,
    reset_longest_call: bool,
) -> insitu_protocol::ShardStats {
    let engine = state.engine.borrow();
    let mem = engine.memory();
    let tablets = engine
        .tablets()
        .into_iter()
        .map(|t| {
            // The tablet was just listed, so it is there.
            let expiring = engine
                .expiring_figures(t.table, t.range.start)
                .unwrap_or_default();
            insitu_protocol::TabletStat {
                table: t.table,
                start_hash: t.range.start,
                end_hash: t.range.end,
                objects: t.object_count,
                live_bytes: t.live_bytes,
                segment_bytes: t.segment_bytes,
                expiring_objects: expiring.objects,
                expiring_deadline_sum_ms: expiring.deadline_sum_ms,
                records: engine.record_count(t.table, t.range.start) as u64,
            }
        })
        .collect();
    insitu_protocol::ShardStats {
        tablets,
        memory_budget_bytes: mem.budget_bytes,
        segment_bytes: mem.segment_bytes,
        live_bytes: mem.live_bytes,
        requests: state.metrics.total_requests(),
        longest_point_call_us: state.metrics.longest_point_call_us(reset_longest_call),
        resp_port: state.resp_port,
    }
}
