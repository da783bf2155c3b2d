//! Crash recovery of one tablet on this shard (`RecoverTablet`).
//!
//! The coordinator names a dead master and every live backup. This shard
//! 1. asks every backup in parallel for the replicas it holds of the master
//!    (`BackupList{fence: true}`: from then on the master, if it still runs,
//!    can no longer make a write durable there); if any backup does not
//!    answer in time, the recovery is refused with `Retry` (retried by the
//!    coordinator) rather than run without the replicas only it holds;
//! 2. keeps the replicas of the tablet (table, start_hash) and takes the
//!    HIGHEST log id among them: the newest instance of the tablet on that
//!    master (an older instance's log is freed by its master, but its free may
//!    not have reached every backup);
//! 3. fetches every segment of that log (`FETCHES_IN_FLIGHT` at once, each
//!    in one `BackupRead` when it fits `READ_CHUNK_BYTES`, else in chunks),
//!    from the holder with the most bytes (ties: a closed replica first, then
//!    the holders take turns by segment, so every backup serves a share),
//!    falling back to the next holder on any error or short read;
//! 4. replays the segments into a fresh tablet in steps, yielding to the
//!    shard's other work between them (`Engine::replay_in_steps`): the
//!    segments are resolved first, and a segment with a corrupt entry is
//!    fetched again from its next holder and the resolution redone before
//!    anything is built; if every holder's copy is corrupt the recovery is
//!    refused (`DataLost`) rather than silently losing the segment's tail;
//! 5. holds the tablet `Receiving` at the given map version: the coordinator
//!    commits the new owner and then activates it.
//!
//! The fetched bytes are all held at once during the replay; they are charged
//! to the engine's memory budget first, and the recovery is refused with
//! `OutOfMemory` if they do not fit.
//!
//! Steps 1 and 3 talk to the backups (`backups.rs`), step 2 is planned in
//! `plan.rs`, steps 4 and 5 replay and register the tablet (`replay.rs`).

use std::collections::BTreeMap;

mod backups;
mod plan;
mod replay;
pub use backups::read_replica;
use backups::{fetch_segment, list_all};
use plan::{check_digest, plan_segments};
use replay::install;

use bytes::Bytes;
use futures::StreamExt;
use insitu_engine::HashRange;
use insitu_protocol::Status;

use crate::shard::ShardState;

/// Segments fetched at once. Why more than one: a fetch is a round trip in
/// which a backup reads a file and verifies it; with several in flight the
/// backups (on other threads and servers) read while this shard receives.
/// Why not more: every fetched segment is held until the replay, and the
/// whole tablet's bytes were charged up front, so this bounds nothing but
/// the backups' queues.
const FETCHES_IN_FLIGHT: usize = 4;

/// A refusal: the reply's status and a message naming what went wrong.
pub type Refusal = (Status, String);

/// What a recovery installed (the `Recovered` reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovered {
    pub objects: u64,
    pub segments: u64,
    pub bytes: u64,
}

/// What the coordinator asks for (the fields of `RecoverTablet`).
pub struct RecoverTablet {
    pub table: u64,
    pub start_hash: u64,
    pub end_hash: u64,
    pub map_version: u64,
    /// Server id of the dead master whose replicas are read.
    pub master: u64,
    /// Backup service addresses of every live server.
    pub backups: Vec<String>,
    /// An operator accepted the loss: a digest refusal is logged instead.
    pub accept_missing: bool,
}

/// The cluster id sent with every backup request. Backups label replicas
/// with it and refuse requests of another cluster; the shard learns it when
/// the server enlists.
fn cluster_id(state: &ShardState) -> u64 {
    state.repl.cluster_id()
}

/// Marks a tablet as being recovered on this shard until dropped, so a
/// second `RecoverTablet` for it (a coordinator retry after a timeout) is
/// refused with `Retry` instead of racing the first.
struct InProgress<'a> {
    state: &'a ShardState,
    key: (u64, u64),
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.state.recovering.borrow_mut().remove(&self.key);
    }
}

/// Recover the tablet; see the module docs.
pub async fn recover_tablet(state: &ShardState, req: RecoverTablet) -> Result<Recovered, Refusal> {
    let Some(range) = HashRange::new(req.start_hash, req.end_hash) else {
        return Err((Status::BadRequest, "tablet range start > end".into()));
    };
    let key = (req.table, req.start_hash);
    if !state.recovering.borrow_mut().insert(key) {
        return Err((
            Status::Retry,
            format!(
                "tablet {}/{:#x} is already being recovered on this shard",
                req.table, req.start_hash
            ),
        ));
    }
    let _in_progress = InProgress { state, key };
    check_not_serving(state, req.table, req.start_hash)?;
    let cluster = cluster_id(state);
    let list_started = std::time::Instant::now();
    let (conns, listed, digests) = list_all(state, &req.backups, cluster, req.master).await;
    let list_ms = list_started.elapsed().as_millis() as u64;
    let mut plans = plan_segments(&listed, req.table, req.start_hash);
    // Every backup the coordinator names must answer. Nothing records which
    // segments a log should have (no log digest), so a recovery that went on
    // without one would silently miss the segments only it holds: seen after
    // a whole-cluster restart, where the first server back was recovered
    // while the others' backups were still down or not yet open, and every
    // object of its tablets was lost. Refused with `Retry` instead: the
    // coordinator retries with back-off, by when the backup answers or its
    // server is declared dead (then it is no longer named, and the
    // coordinator waits for that server's disk or an operator's removal).
    let unreachable: Vec<&str> = req
        .backups
        .iter()
        .zip(&conns)
        .filter(|(_, c)| c.is_none())
        .map(|(addr, _)| addr.as_str())
        .collect();
    if !unreachable.is_empty() {
        return Err((
            Status::Retry,
            format!(
                "recovery of tablet {}/{:#x} of dead server {} waits for every backup: {} of {} \
                 did not answer ({}); the replicas only they hold would be lost",
                req.table,
                req.start_hash,
                req.master,
                unreachable.len(),
                req.backups.len(),
                unreachable.join(", ")
            ),
        ));
    }
    let log = plans.log;
    if let Err((status, why)) = check_digest(&plans, &digests, &req) {
        if !req.accept_missing {
            return Err((status, why));
        }
        tracing::warn!(
            table = req.table,
            start_hash = req.start_hash,
            master = req.master,
            "an operator accepted the loss: recovering what the backups hold although {why}"
        );
    }
    // The best holder of each segment has the most bytes: an upper bound of
    // what is held at once, charged before any byte is fetched.
    let total_bytes: u64 = plans
        .segments
        .iter()
        .map(|p| p.holders[0].bytes)
        .fold(0u64, u64::saturating_add);
    let _charge = state
        .engine
        .borrow()
        .try_charge_transient(total_bytes)
        .map_err(|_| {
            (
                Status::OutOfMemory,
                format!(
                    "tablet {}/{:#x}: its {} segments ({total_bytes} bytes) do not fit in this shard's memory budget beside its data",
                    req.table,
                    req.start_hash,
                    plans.segments.len()
                ),
            )
        })?;
    let fetch_started = std::time::Instant::now();
    let fetches = plans
        .segments
        .iter_mut()
        .map(|plan| fetch_segment(&conns, &req.backups, cluster, req.master, log, plan));
    let mut bufs: Vec<Bytes> = futures::stream::iter(fetches)
        .buffered(FETCHES_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let fetch_ms = fetch_started.elapsed().as_millis() as u64;
    let replay_started = std::time::Instant::now();
    // Replay; a segment with a corrupt entry is fetched again from its next
    // holder (each retry consumes a holder, so this ends).
    let report = loop {
        let corrupt = match install(state, &req, range, &bufs).await? {
            Ok(report) => break report,
            Err(corrupt) => corrupt,
        };
        let mut bad: BTreeMap<usize, String> = BTreeMap::new();
        for c in &corrupt {
            bad.entry(c.segment)
                .or_insert_with(|| format!("offset {}: {}", c.offset, c.reason));
        }
        for (si, why) in bad {
            let plan = &mut plans.segments[si];
            let used = plan.holders[plan.next];
            tracing::warn!(
                shard = state.index,
                table = req.table,
                master = req.master,
                log,
                segment = plan.segment,
                backup = %req.backups[used.backup],
                "corrupt entry in a replica ({why}); trying another holder"
            );
            plan.next += 1;
            if plan.next >= plan.holders.len() {
                return Err((
                    Status::DataLost,
                    format!(
                        "segment {} of log {log} of master {} (tablet {}/{:#x}): every replica \
                         holds a corrupt entry (last: {why}); not recovering it with its tail missing",
                        plan.segment, req.master, req.table, req.start_hash
                    ),
                ));
            }
            bufs[si] = fetch_segment(&conns, &req.backups, cluster, req.master, log, plan).await?;
        }
    };
    let bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    tracing::info!(
        shard = state.index,
        table = req.table,
        start_hash = req.start_hash,
        master = req.master,
        log,
        segments = bufs.len(),
        bytes,
        objects = report.objects_loaded,
        map_version = req.map_version,
        list_ms,
        fetch_ms,
        replay_ms = replay_started.elapsed().as_millis() as u64,
        "tablet recovered from replicas; held Receiving until the coordinator activates it"
    );
    Ok(Recovered {
        objects: report.objects_loaded,
        segments: bufs.len() as u64,
        bytes,
    })
}

/// Refuse if the tablet serves here (a recovery must never replace live
/// data); a copy that serves nothing (a leftover of an earlier failed
/// attempt, or a moved-out copy) is replaced at install time.
fn check_not_serving(state: &ShardState, table: u64, start_hash: u64) -> Result<(), Refusal> {
    match state.tablets.borrow().get(&(table, start_hash)) {
        Some(m) if m.serves_reads() => Err((
            Status::BadRequest,
            format!(
                "tablet {table}/{start_hash:#x} already serves on this shard; not recovering over it"
            ),
        )),
        _ => Ok(()),
    }
}
