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

use std::collections::BTreeMap;
use std::time::Duration;

mod plan;
use plan::{SegmentPlan, check_digest, plan_segments};

use bytes::Bytes;
use futures::StreamExt;
use futures::future::join_all;
use insitu_client::rpc::RpcConn;
use insitu_engine::{CorruptEntry, EngineError, HashRange, ReplayBuild, ReplayReport};
use insitu_protocol::{LogDigest, ReplicaInfo, Request, Response, Status, TabletState};

use crate::handler::engine_status;
use crate::shard::{ShardState, TabletMeta};

/// Connecting to one backup must succeed within this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One backup's `BackupList` must be answered within this, or it is skipped.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// One `BackupRead` chunk (at most `READ_CHUNK_BYTES`) must arrive within this.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes asked for per `BackupRead`: a whole segment of the default size
/// (2 MiB) in one round trip, and under a frame's 4 MiB body limit. Why
/// whole segments: a backup reads and verifies the whole replica file for
/// every `BackupRead`, so a segment fetched in two chunks was read twice.
pub const READ_CHUNK_BYTES: u32 = insitu_backup::service::MAX_READ_BYTES;
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
    let (conns, listed, digests) = list_all(state, &req.backups, cluster, req.master).await;
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

/// Winners a replay appends between two yields to the shard's other work:
/// about 0.2 ms (an object of 1 KB takes ~150 ns to append), so a recovery
/// delays a request on the shard by about that much, not by the whole
/// tablet's replay (hundreds of milliseconds for 128 MB). Segments are
/// resolved one per turn (~0.1-0.3 ms for 2 MiB).
const REPLAY_STEP_ENTRIES: usize = 1024;

/// A replay being built on this shard; dropped unfinished (an error, or the
/// recovery's future dropped at a yield), it gives the engine back its
/// memory. No engine borrow is held at a yield, so the drop can take one.
struct Building<'a, 's> {
    state: &'a ShardState,
    build: Option<ReplayBuild<'s>>,
}

impl Drop for Building<'_, '_> {
    fn drop(&mut self) {
        if let Some(build) = self.build.take() {
            build.abandon(&mut self.state.engine.borrow_mut());
        }
    }
}

/// Replay `bufs` into a new tablet and register it `Receiving`, replacing a
/// copy that serves nothing; `Ok(Err(corrupt))`, with nothing built, if a
/// segment holds a corrupt entry. The replay runs in steps with the shard's
/// other work between them (`REPLAY_STEP_ENTRIES`); whether the tablet
/// serves here is checked again before it is added.
async fn install(
    state: &ShardState,
    req: &RecoverTablet,
    range: HashRange,
    bufs: &[Bytes],
) -> Result<Result<ReplayReport, Vec<CorruptEntry>>, Refusal> {
    check_not_serving(state, req.table, req.start_hash)?;
    let key = (req.table, req.start_hash);
    if state.tablets.borrow_mut().remove(&key).is_some() {
        state
            .engine
            .borrow_mut()
            .drop_tablet(req.table, req.start_hash);
        state.recount_unusual();
        tracing::info!(
            shard = state.index,
            table = req.table,
            start_hash = req.start_hash,
            "replacing a copy of the tablet that serves nothing (an earlier attempt's leftover)"
        );
    }
    let refusal = |e: EngineError| {
        (
            engine_status(&e),
            format!("replaying tablet {}/{:#x}: {e}", req.table, req.start_hash),
        )
    };
    let mut resolver = state
        .engine
        .borrow()
        .replay_in_steps(req.table, range)
        .map_err(refusal)?;
    for buf in bufs {
        resolver.feed(&buf[..]).map_err(refusal)?;
        tokio::task::yield_now().await;
    }
    if !resolver.report().corrupt.is_empty() {
        return Ok(Err(resolver.report().corrupt.clone()));
    }
    let build = resolver
        .build(&mut state.engine.borrow_mut())
        .map_err(refusal)?;
    let mut building = Building {
        state,
        build: Some(build),
    };
    loop {
        let build = building.build.as_mut().expect("building");
        let done = build
            .step(&mut state.engine.borrow_mut(), REPLAY_STEP_ENTRIES)
            .map_err(refusal)?;
        if done {
            break;
        }
        tokio::task::yield_now().await;
    }
    // Other requests ran between the steps: the tablet must still not serve
    // here (the engine's own check refuses any tablet in the range).
    check_not_serving(state, req.table, req.start_hash)?;
    let build = building.build.take().expect("building");
    let report = build.finish(&mut state.engine.borrow_mut()).map_err(|e| {
        (
            Status::Retry,
            format!(
                "tablet {}/{:#x}: its range was taken while it was replayed: {e}",
                req.table, req.start_hash
            ),
        )
    })?;
    state.recount_unusual();
    debug_assert!(report.corrupt.is_empty());
    state.tablets.borrow_mut().insert(
        key,
        TabletMeta::new(req.map_version, TabletState::Receiving),
    );
    state.recount_unusual();
    // Transactions caught mid-commit: their parts lock again and their
    // decisions are known again before the tablet serves anything.
    // Its objects' replaced versions were not kept here (`versions.rs`),
    // and the dead server's commits are not known: no bound is carried.
    state
        .versions
        .borrow_mut()
        .arrive(req.table, (range.start, range.end), None);
    let records = crate::txn_durable::restore_tablet(state, req.table, req.start_hash);
    if records > 0 {
        tracing::info!(
            shard = state.index,
            table = req.table,
            start_hash = req.start_hash,
            records,
            "took back the transaction records of a recovered tablet"
        );
    }
    Ok(Ok(report))
}

/// `BackupList{fence: true}` on every backup in parallel: a connection, the
/// replicas and the log digests of each backup that answered (`None`:
/// skipped, logged).
async fn list_all(
    state: &ShardState,
    backups: &[String],
    cluster: u64,
    master: u64,
) -> (
    Vec<Option<RpcConn>>,
    Vec<Vec<ReplicaInfo>>,
    Vec<Vec<LogDigest>>,
) {
    let answers = join_all(
        backups
            .iter()
            .map(|addr| list_one(state, addr, cluster, master)),
    )
    .await;
    let mut conns = Vec::with_capacity(backups.len());
    let mut listed = Vec::with_capacity(backups.len());
    let mut digests = Vec::with_capacity(backups.len());
    for (addr, answer) in backups.iter().zip(answers) {
        match answer {
            Ok((conn, replicas, d)) => {
                conns.push(Some(conn));
                listed.push(replicas);
                digests.push(d);
            }
            Err(e) => {
                tracing::warn!(backup = %addr, master, "skipping a backup during recovery: {e}");
                conns.push(None);
                listed.push(Vec::new());
                digests.push(Vec::new());
            }
        }
    }
    (conns, listed, digests)
}

async fn list_one(
    state: &ShardState,
    addr: &str,
    cluster: u64,
    master: u64,
) -> Result<(RpcConn, Vec<ReplicaInfo>, Vec<LogDigest>), String> {
    let conn = tokio::time::timeout(CONNECT_TIMEOUT, RpcConn::open(addr, state.gate.as_member()))
        .await
        .map_err(|_| format!("cannot connect to {addr}: timed out after {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let request = Request::BackupList {
        cluster,
        master,
        fence: true,
    };
    let reply = conn
        .call_timeout(&request, LIST_TIMEOUT)
        .await
        .map_err(|e| format!("listing replicas at {addr}: {e}"))?;
    if !reply.status.is_ok() {
        return Err(format!(
            "{addr} refused to list replicas: {}: {}",
            reply.status,
            reply.error_message()
        ));
    }
    match reply.decode() {
        Ok(Response::BackupReplicas { replicas, digests }) => Ok((conn, replicas, digests)),
        Ok(other) => Err(format!("{addr}: unexpected reply to BackupList: {other:?}")),
        Err(e) => Err(format!(
            "{addr}: cannot decode the reply to BackupList: {e}"
        )),
    }
}

/// The bytes of one segment from its holder `plan.next` or, failing that,
/// the next ones (`plan.next` is left at the holder that delivered).
async fn fetch_segment(
    conns: &[Option<RpcConn>],
    backups: &[String],
    cluster: u64,
    master: u64,
    log: u64,
    plan: &mut SegmentPlan,
) -> Result<Bytes, Refusal> {
    let mut errors = Vec::new();
    while let Some(holder) = plan.holders.get(plan.next).copied() {
        let addr = &backups[holder.backup];
        let result = match &conns[holder.backup] {
            Some(conn) => {
                read_replica(conn, cluster, master, log, plan.segment, holder.bytes).await
            }
            None => Err("not connected".to_string()),
        };
        match result {
            Ok(bytes) => {
                if plan.next > 0 && holder.bytes < plan.holders[0].bytes {
                    tracing::warn!(
                        master,
                        log,
                        segment = plan.segment,
                        backup = %addr,
                        bytes = holder.bytes,
                        best_bytes = plan.holders[0].bytes,
                        "using a shorter replica: the longer ones could not be read"
                    );
                }
                return Ok(bytes);
            }
            Err(e) => {
                tracing::warn!(master, log, segment = plan.segment, backup = %addr,
                    "cannot read a replica, trying another holder: {e}");
                errors.push(format!("{addr}: {e}"));
                plan.next += 1;
            }
        }
    }
    Err((
        Status::Internal,
        format!(
            "segment {} of log {log} of master {master}: no backup could deliver it ({})",
            plan.segment,
            if errors.is_empty() {
                "no holder left".to_string()
            } else {
                errors.join("; ")
            }
        ),
    ))
}

/// Read `len` bytes of a replica in chunks; anything but exactly `len` bytes
/// (an error, a short read, more than asked) is an error. A replica that
/// comes in one chunk is returned as a view of the reply (no copy). Public
/// for the process-level test of both paths (`tests/backup_service.rs`).
pub async fn read_replica(
    conn: &RpcConn,
    cluster: u64,
    master: u64,
    log: u64,
    segment: u64,
    len: u64,
) -> Result<Bytes, String> {
    let len_usize =
        usize::try_from(len).map_err(|_| format!("{len} bytes do not fit in memory"))?;
    let mut buf = Vec::new();
    while (buf.len() as u64) < len {
        let want = (len - buf.len() as u64).min(READ_CHUNK_BYTES as u64) as u32;
        let request = Request::BackupRead {
            cluster,
            master,
            log,
            segment,
            offset: buf.len() as u64,
            max_bytes: want,
        };
        let reply = conn
            .call_timeout(&request, READ_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        if !reply.status.is_ok() {
            return Err(format!(
                "refused at offset {}: {}: {}",
                buf.len(),
                reply.status,
                reply.error_message()
            ));
        }
        let (bytes, end) = match reply.decode() {
            Ok(Response::BackupBytes { bytes, end }) => (bytes, end),
            Ok(other) => return Err(format!("unexpected reply to BackupRead: {other:?}")),
            Err(e) => return Err(format!("cannot decode the reply to BackupRead: {e}")),
        };
        if bytes.len() > want as usize {
            return Err(format!(
                "sent {} bytes at offset {} where at most {want} were asked for",
                bytes.len(),
                buf.len()
            ));
        }
        if buf.is_empty() && bytes.len() == len_usize && within(&reply.body, bytes) {
            return Ok(reply.body.slice_ref(bytes));
        }
        if buf.is_empty() {
            buf.try_reserve_exact(len_usize)
                .map_err(|_| format!("cannot allocate {len} bytes"))?;
        }
        buf.extend_from_slice(bytes);
        if (buf.len() as u64) < len && (end || bytes.is_empty()) {
            return Err(format!(
                "short read: {} of the {len} bytes it listed",
                buf.len()
            ));
        }
    }
    Ok(Bytes::from(buf))
}

/// Whether `part` lies inside `whole`'s memory (`Bytes::slice_ref` panics
/// otherwise; a decoder that borrows from its input always passes).
fn within(whole: &Bytes, part: &[u8]) -> bool {
    let (w, p) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    p >= w && p + part.len() <= w + whole.len()
}
