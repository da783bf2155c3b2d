//! The backup service every storage server runs: its own port, its own
//! thread (a current-thread tokio runtime), and a `BackupService` over the
//! replica files under `DIR/replicas/`.
//!
//! The port is bound before the server enlists (so `Enlist` carries its
//! address) and answers `Ping` at once (the coordinator's failure detector
//! pings it). The store is opened only once the cluster id is known (after
//! `Enlisted`); until then backup requests get `Retry`.
//!
//! Group commit: connections hand their complete backup requests to one
//! committer task; it takes every request waiting, applies them all, and
//! (under `--sync always`) makes them durable with one flush before any is
//! answered. The store work runs on the blocking pool, so pings and reads of
//! the next requests go on during an fsync, and whatever arrives meanwhile
//! forms the next group (a small group under `--sync interval`, which never
//! fsyncs, runs on this thread: `run_group`). Under `--sync interval` a timer flushes every
//! `sync_interval`. Shutdown flushes before the thread ends.
//!
//! Bounded like a shard's connections (`ConnLimits`): the frame header is
//! checked before a body byte is buffered, a frame bigger than the base
//! buffer first takes its size from a frame budget, a frame must complete
//! within `stall_timeout`, a silent connection closes after `idle_timeout`,
//! and at the connection limit the longest-idle one is closed.

use std::cell::Cell;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use bytes::{Buf, BytesMut};
use insitu_auth::{Admission, Gate, Session};
use insitu_backup::service::{Outcome, answer_without_store};
use insitu_backup::store::Flush;
use insitu_backup::{BackupConfig, BackupService, BackupStore, FsIo, SyncDone, SyncMode};
use insitu_protocol::frame::HEADER_BYTES;
use insitu_protocol::{
    BackupOp, FrameKind, Request, Response, Status, decode_request, encode_error, encode_response,
};
use insitu_tls::{ServerTls, Stream};
use tokio::sync::{mpsc, oneshot, watch};

pub(crate) use crate::backup_job::Job;
use crate::backup_job::{JobBody, answer_group, malformed_request};
pub use crate::backup_local::LocalBackup;
use crate::conn::{Front, split_frame};
use crate::inbox::{IdleList, Inbox, Port};
use crate::limits::{Closed, ConnLimits, FrameBudget, MAX_FRAME_BYTES};

/// Bytes of partly received big frames the backup port holds at once:
/// sixteen max-size replication batches; further ones wait for room (until
/// their stall deadline), so a flood of masters cannot exhaust memory.
const FRAME_BUDGET_BYTES: usize = 16 * MAX_FRAME_BYTES;
/// Bytes of accepted records kept in memory (interval mode) before they are
/// written out (unsynced) early: bounds a burst between two timer flushes.
const BUFFER_BUDGET_BYTES: usize = 64 << 20;
/// Most jobs (connections' batches) in one group: bounds one group's work
/// so that its replies are not held back behind an unbounded drain.
const MAX_GROUP_JOBS: usize = 1024;
/// Interval mode: a group of at most this many frame bytes is applied on
/// this thread instead of the blocking pool (`run_group` says why).
const INLINE_GROUP_BYTES: usize = 256 * 1024;
/// Name of the replica directory inside the server's data directory.
pub const REPLICA_DIR: &str = "replicas";

/// How the backup service keeps replicas.
#[derive(Clone, Debug)]
pub struct BackupSettings {
    pub sync: SyncMode,
    /// Interval mode: acknowledged data is on disk within this.
    pub sync_interval: Duration,
    /// Disk bytes the replica files may take (u64::MAX: only the disk limits).
    pub disk_budget_bytes: u64,
    pub limits: ConnLimits,
    /// Who may connect (backup requests need the cluster credential).
    pub gate: Gate,
    /// TLS on every connection accepted; None: plain TCP.
    pub tls: Option<ServerTls>,
}

type Service = BackupService<FsIo>;

/// Hands the opened store to the running service (once).
pub struct Installer(oneshot::Sender<Service>);

impl Installer {
    pub fn install(self, service: Service) -> anyhow::Result<()> {
        self.0
            .send(service)
            .map_err(|_| anyhow::anyhow!("the backup service thread has stopped"))
    }
}

/// What `start` gives back: the bound address, the store's installer, the
/// service thread, and the in-process door to it for this server's shards.
pub type Started = (SocketAddr, Installer, JoinHandle<()>, LocalBackup);

/// Bind the backup port on `host:port` (0: any free port) and start the
/// service thread; it runs until `stop` turns true.
pub fn start(
    host: &str,
    port: u16,
    settings: BackupSettings,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Started> {
    anyhow::ensure!(
        !settings.sync_interval.is_zero(),
        "the sync interval must be positive"
    );
    let addr = format!("{host}:{port}");
    let listener = std::net::TcpListener::bind(&addr)
        .with_context(|| format!("backup service: cannot listen on {addr}"))?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let (install_tx, install_rx) = oneshot::channel();
    // Made here, not on the thread, so the shards' in-process door exists
    // before the thread runs.
    let (jobs_tx, jobs_rx) = mpsc::unbounded_channel();
    let door = LocalBackup::new(jobs_tx.clone());
    let thread = std::thread::Builder::new()
        .name("insitu-backup".into())
        .spawn(move || run(listener, settings, install_rx, stop, (jobs_tx, jobs_rx)))
        .context("cannot start the backup service thread")?;
    Ok((local, Installer(install_tx), thread, door))
}

/// Open the replica store of cluster `cluster` under `dir`, logging what it
/// found; replicas of another cluster are an error (use another --dir).
pub fn open_store(dir: &Path, cluster: u64, settings: &BackupSettings) -> anyhow::Result<Service> {
    let config = BackupConfig {
        dir: dir.to_path_buf(),
        cluster,
        disk_budget_bytes: settings.disk_budget_bytes,
        buffer_budget_bytes: BUFFER_BUDGET_BYTES,
        record_slice_bytes: insitu_backup::RECORD_SLICE_BYTES,
        sync: settings.sync,
    };
    let (store, report) = BackupStore::open(config, FsIo::default())
        .with_context(|| format!("cannot open the replica store in {}", dir.display()))?;
    for problem in &report.problems {
        tracing::warn!(dir = %dir.display(), "replica store: {problem}");
    }
    tracing::info!(
        dir = %dir.display(),
        replicas = report.replicas,
        fenced_masters = report.fenced,
        problems = report.problems.len(),
        disk_bytes = store.disk_bytes(),
        "replica store opened"
    );
    Ok(BackupService::new(store))
}

/// What the connections of the backup port share (all on its thread).
struct Shared {
    limits: ConnLimits,
    /// Only cluster members may send backup requests (`insitu_auth`).
    gate: Gate,
    /// Handshake on accept when set.
    tls: Option<ServerTls>,
    budget: FrameBudget,
    jobs: mpsc::UnboundedSender<Job>,
    connections: Cell<usize>,
    /// Idle connections; the connection limit evicts the longest idle.
    idle: IdleList,
}

impl Port for Shared {
    fn limits(&self) -> &ConnLimits {
        &self.limits
    }
    fn frame_budget(&self) -> &FrameBudget {
        &self.budget
    }
    fn idle(&self) -> &IdleList {
        &self.idle
    }
}

fn run(
    listener: std::net::TcpListener,
    settings: BackupSettings,
    install: oneshot::Receiver<Service>,
    stop: watch::Receiver<bool>,
    (jobs_tx, jobs_rx): (mpsc::UnboundedSender<Job>, mpsc::UnboundedReceiver<Job>),
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("backup service: cannot build runtime: {e}");
            return;
        }
    };
    let shared = Rc::new(Shared {
        limits: settings.limits.clone(),
        gate: settings.gate.clone(),
        tls: settings.tls.clone(),
        budget: FrameBudget::new(FRAME_BUDGET_BYTES),
        jobs: jobs_tx,
        connections: Cell::new(0),
        idle: IdleList::default(),
    });
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let committer = tokio::task::spawn_local(commit_loop(
            jobs_rx,
            install,
            settings.clone(),
            stop.clone(),
        ));
        accept_loop(listener, shared, stop).await;
        // The committer stops on the same signal, after a last flush.
        let _ = committer.await;
    });
}

async fn accept_loop(
    listener: std::net::TcpListener,
    shared: Rc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("backup service: cannot register listener: {e}");
            return;
        }
    };
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("backup service: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        if shared.connections.get() >= shared.limits.max_connections && !shared.idle.evict_oldest()
        {
            tracing::warn!(%peer, "backup service: connection limit reached and none is idle; refusing");
            continue;
        }
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        shared.connections.set(shared.connections.get() + 1);
        tokio::task::spawn_local(async move {
            let stream = match &shared.tls {
                Some(tls) => tls.accept(stream, shared.limits.stall_timeout).await,
                None => Ok(Stream::Plain(stream)),
            };
            let served = match stream {
                Ok(stream) => serve(stream, &shared).await,
                Err(e) => Err(e),
            };
            match served {
                Ok(None) => {}
                Ok(Some(why)) => {
                    tracing::debug!(%peer, ?why, "backup connection closed by the server")
                }
                Err(e) => tracing::debug!(%peer, "backup connection closed: {e}"),
            }
            shared.connections.set(shared.connections.get() - 1);
        });
    }
}

/// Take groups of jobs and answer them; flush on the timer (interval mode);
/// flush once more when stopped.
async fn commit_loop(
    mut jobs: mpsc::UnboundedReceiver<Job>,
    mut install: oneshot::Receiver<Service>,
    settings: BackupSettings,
    mut stop: watch::Receiver<bool>,
) {
    let mut service: Option<Service> = None;
    // The install channel has delivered (or was dropped): do not poll it again.
    let mut install_done = false;
    let mut ticker = tokio::time::interval(settings.sync_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timer_flushes = settings.sync == SyncMode::Interval;
    // A timer flush's fsyncs, on the blocking pool while the store goes on
    // answering (`begin_timer_flush`); at most one at a time.
    let mut syncing: Option<(Flush, tokio::task::JoinHandle<SyncDone>)> = None;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            s = &mut install, if !install_done => {
                install_done = true;
                service = s.ok();
            }
            job = jobs.recv() => {
                let Some(job) = job else { break };
                let mut group = vec![job];
                while group.len() < MAX_GROUP_JOBS {
                    match jobs.try_recv() {
                        Ok(j) => group.push(j),
                        Err(_) => break,
                    }
                }
                service = run_group(service, group, settings.sync).await;
            }
            _ = ticker.tick(), if timer_flushes && service.is_some() && syncing.is_none() => {
                syncing = service.as_mut().and_then(begin_timer_flush);
            }
            done = async { (&mut syncing.as_mut().expect("guarded by the condition").1).await },
                if syncing.is_some() =>
            {
                let (flush, _) = syncing.take().expect("guarded by the condition");
                finish_timer_flush(service.as_mut(), flush, done);
            }
        }
    }
    if let Some((flush, handle)) = syncing.take() {
        let done = handle.await;
        finish_timer_flush(service.as_mut(), flush, done);
    }
    if let Some(mut svc) = service {
        log_flush(&mut svc, "shutdown");
    }
}

/// Run `f` on the service on the blocking pool (disk work must not stall
/// this thread's sockets), and get the service back.
async fn on_blocking_pool<T: Send + 'static>(
    service: Option<Service>,
    f: impl FnOnce(&mut Service) -> T + Send + 'static,
) -> (Option<Service>, Option<T>) {
    let Some(mut svc) = service else {
        return (None, None);
    };
    match tokio::task::spawn_blocking(move || {
        let out = f(&mut svc);
        (svc, out)
    })
    .await
    {
        Ok((svc, out)) => (Some(svc), Some(out)),
        Err(e) => {
            // A panic there aborts a server process; in tests, stop serving.
            tracing::error!("backup service: store task failed: {e}");
            (None, None)
        }
    }
}

/// Start a timer flush: buffered records are written out here (a few page
/// cache writes: the groups write their appends as they go), the fsyncs go
/// to the blocking pool, and the store keeps answering while they run. Why
/// not the whole flush on the pool with the store, as before: under a
/// steady stream of replicas the fsyncs took 0.4 s of every second (a
/// recovered server re-replicating 130 MB tablets), and every append, read
/// and listing of this backup waited behind them; a recovery's new owner
/// answered only once its tablet was re-replicated, so recoveries waited
/// too. `None` when nothing is left to wait for.
fn begin_timer_flush(svc: &mut Service) -> Option<(Flush, tokio::task::JoinHandle<SyncDone>)> {
    let (mut flush, failed) = svc.store_mut().begin_flush();
    log_failures(failed, "timer");
    match flush.take_job() {
        Some(job) => Some((flush, tokio::task::spawn_blocking(move || job.run()))),
        None => {
            let failed = svc.store_mut().finish_flush(flush, None);
            log_failures(failed, "timer");
            None
        }
    }
}

/// Finish a timer flush whose fsyncs ended (`done`); a sync task that
/// failed counts as a failed sync of every file (those replicas are dropped
/// and re-replicated by their masters).
fn finish_timer_flush(
    service: Option<&mut Service>,
    flush: Flush,
    done: Result<SyncDone, tokio::task::JoinError>,
) {
    let Some(svc) = service else { return };
    let done = match done {
        Ok(done) => done,
        Err(e) => {
            tracing::error!("backup service: sync task failed: {e}");
            SyncDone::failed(flush.files(), &format!("sync task failed: {e}"))
        }
    };
    let failed = svc.store_mut().finish_flush(flush, Some(done));
    log_failures(failed, "timer");
}

fn log_flush(svc: &mut Service, why: &'static str) {
    log_failures(svc.flush(), why);
}

fn log_failures(failed: Vec<(insitu_backup::ReplicaId, insitu_backup::BackupError)>, why: &str) {
    for (id, e) in failed {
        tracing::error!(
            ?id,
            why,
            "backup flush failed; replica dropped (its master will re-replicate): {e}"
        );
    }
}

/// Answer one group: apply everything, one flush (always mode), replies.
///
/// Why a small group runs inline in interval mode: it is a few `write` calls
/// into the page cache and no fsync, a few microseconds, while the trip to
/// the blocking pool and back costs two thread wake-ups on every replication
/// round, which is what a durable write waits for. Groups that fsync (always
/// mode), carry much data, or hold anything but appends still go to the
/// pool, so a ping or the next request's bytes are never held behind the
/// disk. (A `BackupRead` is a few bytes that read and verify a replica file
/// of megabytes; a `BackupForget` deletes every file of a dead master. When
/// they ran here, a ping waited 0.9-1.4 s during every 1 GB recovery on 2
/// cores, past the 500 ms failure timeout, and both surviving servers were
/// declared dead: BENCHMARKS.md, "The survivors were declared dead".)
async fn run_group(service: Option<Service>, group: Vec<Job>, sync: SyncMode) -> Option<Service> {
    let (frames, replies): (Vec<_>, Vec<_>) =
        group.into_iter().map(|j| (j.frames, j.reply)).unzip();
    if service.is_none() {
        for (frames, reply) in frames.iter().zip(replies) {
            let mut out = BytesMut::new();
            for (id, _) in frames {
                encode_error(
                    &mut out,
                    *id,
                    Status::Retry,
                    "the backup service opens its replica store once this server has enlisted; retry shortly",
                );
            }
            let _ = reply.send(out);
        }
        return None;
    }
    let (service, outs) = match service {
        Some(mut svc) if runs_inline(sync, &frames) => {
            let outs = answer_group(&mut svc, &frames);
            (Some(svc), Some(outs))
        }
        service => on_blocking_pool(service, move |svc| answer_group(svc, &frames)).await,
    };
    for (out, reply) in outs.unwrap_or_default().into_iter().zip(replies) {
        let _ = reply.send(out);
    }
    service
}

/// A `BackupWrite` that deletes no whole log: its work is bounded by its
/// bytes (and a `Free` is one file). A `FreeLog` deletes every replica
/// file of a log, hundreds for a large tablet moved away.
fn is_append(r: &Request) -> bool {
    let is_free_log = |op: &BackupOp| matches!(op, BackupOp::FreeLog { .. });
    matches!(r, Request::BackupWrite { ops, .. } if !ops.iter().any(is_free_log))
}

/// Whether a group runs on this thread (`run_group` says why): interval
/// mode, appends only, at most `INLINE_GROUP_BYTES`.
fn runs_inline(sync: SyncMode, frames: &[Vec<(u64, JobBody)>]) -> bool {
    let mut bodies = frames.iter().flatten().map(|(_, body)| body);
    let bytes: usize = bodies.clone().map(JobBody::len).sum();
    sync == SyncMode::Interval && bodies.all(JobBody::is_append) && bytes <= INLINE_GROUP_BYTES
}

/// One connection: answer `Ping` and refusals here, hand backup requests to
/// the committer and wait for their replies, then read on.
async fn serve(mut stream: Stream, shared: &Shared) -> std::io::Result<Option<Closed>> {
    let limits = &shared.limits;
    let mut inbox = Inbox::new();
    let mut wbuf = BytesMut::new();
    // What the connection authenticated as (see `insitu_auth::Gate`).
    let mut session = Session::default();
    loop {
        let mut job = Vec::new();
        let mut consumed = false;
        let need = loop {
            let (header, mut body) = match split_frame(&mut inbox.buf, &mut wbuf) {
                Front::Frame(header, frame) => (header, frame),
                Front::Partial(total) => break total,
                Front::Malformed => {
                    crate::conn::write(&mut stream, &wbuf, limits.stall_timeout).await?;
                    return Ok(None);
                }
            };
            body.advance(HEADER_BYTES);
            consumed = true;
            let mut append = false;
            let local = if header.kind != FrameKind::Request {
                Some(Outcome::Refused {
                    status: Status::BadRequest,
                    message: "expected a request frame".into(),
                })
            } else {
                match decode_request(&body) {
                    Ok(r) => match shared.gate.admit(&mut session, &r) {
                        Admission::Proceed => {
                            append = is_append(&r);
                            answer_without_store(&r)
                        }
                        Admission::Welcome { member } => {
                            let welcome = Response::Welcome { member };
                            // A two-byte body always fits a frame.
                            let _ =
                                encode_response(&mut wbuf, header.request_id, Status::Ok, &welcome);
                            continue;
                        }
                        Admission::Refuse {
                            status,
                            message,
                            close,
                        } => {
                            encode_error(&mut wbuf, header.request_id, status, message);
                            if close {
                                crate::conn::write(&mut stream, &wbuf, limits.stall_timeout)
                                    .await?;
                                return Ok(Some(Closed::Unauthenticated));
                            }
                            continue;
                        }
                    },
                    Err(e) => Some(malformed_request(e)),
                }
            };
            match local {
                Some(outcome) => outcome.encode(header.request_id, &mut wbuf),
                None => job.push((header.request_id, JobBody::Encoded { body, append })),
            }
        };
        if !job.is_empty() {
            let (tx, rx) = oneshot::channel();
            if shared
                .jobs
                .send(Job {
                    frames: job,
                    reply: tx,
                })
                .is_err()
            {
                return Ok(None); // shutting down
            }
            match rx.await {
                // Taken as it is when nothing else waits to be written
                // (a replica read's reply is megabytes: not copied again).
                Ok(out) if wbuf.is_empty() => wbuf = out,
                Ok(out) => wbuf.extend_from_slice(&out),
                Err(_) => return Ok(None),
            }
        }
        if !wbuf.is_empty() {
            crate::conn::write(&mut stream, &wbuf, limits.stall_timeout).await?;
            wbuf = BytesMut::new();
        }
        if consumed {
            inbox.consumed();
        }
        let wait = inbox.fill(shared, &mut stream, need).await?;
        if let Some(end) =
            crate::conn::end_of_wait(wait, &mut stream, &mut wbuf, "backup", need, limits).await?
        {
            return Ok(end);
        }
    }
}

#[cfg(test)]
#[path = "backup_service_tests.rs"]
mod tests;
