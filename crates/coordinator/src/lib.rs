//! The insitu coordinator: cluster membership, tables and the tablet map.
//!
//! Start it with [`start`] on a bound listener; it serves the metadata
//! requests of `insitu_protocol` (Enlist, CreateTable, DropTable, OpenTable,
//! TableMap, ListTables, ListServers, MoveTablet, RemoveServer, Ping), hands
//! out timestamps (Timestamps, `oracle.rs`) and drives storage shards with
//! the control requests (TakeTablet, DropTablet, MigrateTablet,
//! ActivateTablet, ServerDown).
//!
//! Metadata is durable in `DIR/coordinator.redb`; the layout is documented in
//! the `store` module. Every change is one redb write transaction, committed
//! before the reply. The global map version increases on every create, drop
//! and move (and never goes back, across restarts too); each tablet records the
//! version of its last assignment.
//!
//! # Placement
//! A new table's hash space is split evenly; tablet `i` goes to slot
//! `i % slots`, where the slots are shard 0 of every server (by id), then
//! shard 1 of every server, and so on.
//!
//! # Moving a tablet (MoveTablet), one move at a time
//! 0. Record the move in redb (`moves` row, uncommitted).
//! 1. `TakeTablet{state: Receiving, map_version: old}` on the destination shard
//!    (the destination server's shard with the fewest tablets).
//! 2. `MigrateTablet{dest_addr}` on the source shard, on a connection of its
//!    own: it freezes writes to the tablet (clients get `Retry`), streams its
//!    objects to the destination (each batch with a timeout) and replies once
//!    the destination holds them all. From then on the source is *moved out*:
//!    it answers `UnknownTablet` to every read, write and scan of the tablet,
//!    so a client with an old map refreshes it and never reads an older value
//!    than one the destination acknowledged. A failed migration un-freezes
//!    the source by itself.
//! 3. Bump the global map version, commit the new owner and mark the move
//!    record committed, in one transaction.
//! 4. `ActivateTablet{map_version: new}` on the destination.
//! 5. `DropTablet{only_if_not_serving}` on the source; delete the record.
//!
//! If a step before 3 fails, the move is undone: the source serves again
//! (`TakeTablet{state: Active, map_version: old}`, which a shard treats as
//! "un-freeze / serve this again"), the destination's copy is dropped. If 4
//! is refused, the owner goes back to the source under a new version (the
//! destination never served, so the moved-out copy is complete); if 4 gets no
//! reply, the reply says the move is committed but not yet confirmed. Whatever
//! is left unconfirmed (and every move recorded when a coordinator starts) is
//! finished (committed) or undone (not committed) by the reconciler in the
//! background (`reconcile.rs`). The reply to a move is the table's new map
//! (`Response::Table`).
//!
//! # Dead servers, failure detection and recovery
//! A server is *dead* once the coordinator says so, durably (`dead_servers`
//! in redb): then nothing is routed to it, its tablets answer `Retry` in
//! `OpenTable`/`TableMap` (clients back off), every live shard gets
//! `ServerDown{id}`, and the recovery driver (`death.rs`) calls
//! `recovery::recover_server`, retrying with back-off, once at least one
//! server (and `rehome_after_servers`) is live. Recovery gives each tablet
//! to a live shard and forgets the server. A server is declared dead
//! - by the failure detector (`failure.rs`): no reply to pings of its backup
//!   address (shard 0's if it has none) for `failure_timeout`;
//! - by `RemoveServer` (`insitu server remove ID`);
//! - on `Enlist` (*retirement*), when a live server has the enlisting one's
//!   identity (the same server restarted), or shares a shard address with it
//!   and has no identity on record or the new one says `replace`;
//! - at start with [`CoordinatorConfig::forget_servers`] (`insitu up`, whose
//!   servers lived in the previous coordinator process), every server.
//!
//! A dead server never comes back: a process that answers again must enlist,
//! and gets a new id. A known live server with another identity on the same
//! address is not retired: the enlistment is refused (unless `replace`).
//!
//! *Orphaned* tablets (owner id 0) are left only by an older coordinator
//! version, the interim recovery (which re-creates tablets empty) or a failed
//! re-homing; every `Enlist` re-homes them, EMPTY, round-robin over the live
//! shards. Every step is one redb transaction, so a coordinator stopped
//! mid-way restarts with its dead servers still dead and recovers them then.

mod conn;
mod death;
mod failure;
mod lost;
mod membership;
mod metrics;
mod model;
mod moves;
mod oracle;
mod reconcile;
mod recovery;
mod service;
mod shards;
mod status_page;
mod store;
mod tables;
#[cfg(test)]
mod test_dir;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::BytesMut;
use insitu_protocol::{Status, encode_error};
use insitu_tls::{ServerTls, Stream};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::service::Coordinator;
use crate::store::Store;

pub use crate::conn::ConnLimits;
pub use crate::store::DB_FILE;
pub use insitu_auth::Gate;

#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// Directory of the metadata database (`coordinator.redb`); created if missing.
    pub dir: std::path::PathBuf,
    /// Retire every stored server at start: all their tablets become orphaned
    /// and are re-homed, empty, onto the servers that enlist next. For a
    /// coordinator whose servers cannot have outlived it (`insitu up` runs them
    /// in its own process). Default `false`.
    pub forget_servers: bool,
    /// Re-home orphaned tablets only once at least this many servers are
    /// registered, so they spread over all of them (`insitu up` sets it to
    /// its number of servers). Default 0: re-home at every enlistment.
    pub rehome_after_servers: usize,
    /// Connection limits: count, idle and stall timeouts, frame budget.
    pub limits: ConnLimits,
    /// Replicas per log segment (R) the servers keep on other servers'
    /// backups; 0 = in-memory only (a server crash loses its objects).
    /// Persisted; the configured value wins at every start. Default 2.
    pub replicas: u32,
    /// How often every live server is pinged (`failure.rs`). Default 100 ms.
    pub ping_interval: Duration,
    /// A live server that has answered no ping for this long (and missed at
    /// least two) is declared dead. Default 500 ms.
    pub failure_timeout: Duration,
    /// Which tokens the coordinator accepts, and the cluster credential it
    /// presents to servers. `Gate::open()` (the default): no authentication.
    /// Its dial credentials carry the TLS trust (`Gate::with_dial_tls`).
    pub gate: Gate,
    /// TLS on the coordinator's port; None: plain TCP.
    pub tls: Option<ServerTls>,
}

/// Most replicas per segment a coordinator accepts: more would multiply
/// every write for no practical gain, and a typo (`--replicas 20`) should fail.
pub const MAX_REPLICAS: u32 = 8;

impl CoordinatorConfig {
    /// Metadata in `dir`, every other setting at its default.
    pub fn new(dir: impl Into<PathBuf>) -> CoordinatorConfig {
        CoordinatorConfig {
            dir: dir.into(),
            forget_servers: false,
            rehome_after_servers: 0,
            limits: ConnLimits::default(),
            replicas: 2,
            ping_interval: Duration::from_millis(100),
            failure_timeout: Duration::from_millis(500),
            gate: Gate::open(),
            tls: None,
        }
    }

    /// Refuse settings that cannot work, naming the setting.
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.replicas <= MAX_REPLICAS,
            "replicas must be 0 to {MAX_REPLICAS}, got {}",
            self.replicas
        );
        anyhow::ensure!(
            !self.ping_interval.is_zero(),
            "the ping interval must be positive"
        );
        anyhow::ensure!(
            self.failure_timeout > self.ping_interval,
            "the failure timeout ({:?}) must be longer than the ping interval ({:?})",
            self.failure_timeout,
            self.ping_interval
        );
        Ok(())
    }
}

pub struct CoordinatorHandle {
    addr: SocketAddr,
    coordinator: Arc<Coordinator>,
    /// What the connections share (limits, frame budget), for reporting.
    conns: Arc<conn::Shared>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    /// Finishes or undoes interrupted tablet moves (`reconcile.rs`).
    reconciler: JoinHandle<()>,
    /// Pings every live server, declares the silent ones dead (`failure.rs`).
    detector: JoinHandle<()>,
    /// Recovers the tablets of dead servers (`death.rs`).
    recoverer: JoinHandle<()>,
    /// Copies the cluster's shape into the metrics recorder (`metrics.rs`).
    publisher: JoinHandle<()>,
    /// Request-rate readings of the status page (`status_page.rs`).
    rates: Arc<status_page::Rates>,
}

impl CoordinatorHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The status page renderer, for the metrics port (`GET /`).
    pub fn status_page(&self) -> insitu_telemetry::http::StatusPage {
        let (coordinator, rates) = (self.coordinator.clone(), self.rates.clone());
        Arc::new(move || {
            let (coordinator, rates) = (coordinator.clone(), rates.clone());
            Box::pin(async move { status_page::render(&coordinator, &rates).await })
        })
    }

    /// Bytes held right now by partly received big frames (at most
    /// `ConnLimits::frame_budget_bytes`).
    pub fn buffered_frame_bytes(&self) -> usize {
        self.conns.buffered_frame_bytes()
    }

    /// Names of the tables (by id) that have a tablet no live server holds
    /// yet: its server was retired, and its objects are lost. Such a tablet
    /// is re-created empty when the next storage server enlists.
    pub fn orphaned_table_names(&self) -> Vec<String> {
        self.coordinator.orphaned_table_names()
    }

    /// Names of the tables (by id) that have a tablet waiting for recovery:
    /// owned by a dead server, or orphaned.
    pub fn awaiting_recovery_table_names(&self) -> Vec<String> {
        self.coordinator.model().awaiting_recovery_table_names()
    }

    /// The cluster's id (random, created with the metadata).
    pub fn cluster_id(&self) -> u64 {
        self.coordinator.model().cluster_id
    }

    /// Replicas per segment (R) the servers are told to keep.
    pub fn replicas(&self) -> u32 {
        self.coordinator.model().replicas
    }

    /// Stop accepting, close connections, flush metadata; resolves when done.
    ///
    /// A request being handled is finished first (its reply is sent), so a
    /// move in progress completes or is undone before this returns.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        // Every step of reconciliation, detection and recovery is safe to
        // stop and repeat.
        for task in [
            self.reconciler,
            self.detector,
            self.recoverer,
            self.publisher,
        ] {
            task.abort();
            let _ = task.await;
        }
        if let Err(e) = self.task.await {
            error!("coordinator task failed: {e}");
        }
    }

    /// For tests: stop as abruptly as a killed process, as far as the
    /// metadata is concerned. Every task stops at its next suspension point
    /// without finishing the request in hand (a move stops between two
    /// steps); nothing more is committed. Resolves once the database is
    /// released, so a new coordinator can open the same directory.
    #[doc(hidden)]
    pub async fn crash(self) {
        for task in [
            self.reconciler,
            self.detector,
            self.recoverer,
            self.publisher,
            self.task,
        ] {
            task.abort();
            let _ = task.await;
        }
        // Connection tasks are aborted with the accept loop's task set; they
        // release their reference when the runtime drops them.
        for _ in 0..500 {
            if Arc::strong_count(&self.coordinator) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if Arc::strong_count(&self.coordinator) != 1 {
            warn!("crash: coordinator state still referenced; its database stays open");
        }
    }
}

/// Open the metadata in `config.dir` and serve on `listener` in background
/// tasks on the current tokio runtime.
pub async fn start(
    config: CoordinatorConfig,
    listener: TcpListener,
) -> anyhow::Result<CoordinatorHandle> {
    let addr = listener
        .local_addr()
        .context("coordinator listener has no local address")?;
    config.check()?;
    let conns = Arc::new(conn::Shared::new(
        config.limits.clone(),
        config.gate.clone(),
    )?);
    let dir: PathBuf = config.dir.clone();
    let replicas = config.replicas;
    let (store, model, opened) = tokio::task::spawn_blocking(move || Store::open(&dir, replicas))
        .await
        .context("opening the metadata database")??;
    info!(
        %addr,
        tables = model.tables.len(),
        servers = model.servers.len(),
        dead_servers = model.dead.len(),
        map_version = model.map_version,
        cluster_id = format_args!("{:016x}", model.cluster_id),
        new_cluster = opened.new_cluster,
        replicas = model.replicas,
        timestamp_reservation = opened.timestamp_reservation,
        "coordinator started"
    );
    if model.replicas == 0 {
        warn!("replicas = 0: objects are in memory only; a server crash loses its objects");
    }
    if let Some(previous) = opened.previous_replicas.filter(|p| *p != model.replicas) {
        warn!(
            previous,
            now = model.replicas,
            "replicas per segment changed by configuration; segments replicated from now on get the new count"
        );
    }
    let coordinator = Arc::new(Coordinator::new(
        store,
        model,
        config.rehome_after_servers,
        config.gate.as_member().clone(),
        opened.timestamp_reservation,
    ));
    if config.forget_servers {
        // Committed before the first request is served.
        let dead = coordinator.declare_all_dead().await.map_err(|e| {
            anyhow::anyhow!(
                "declaring the servers of the previous run dead: {}",
                e.message
            )
        })?;
        if dead > 0 {
            warn!(
                servers = dead,
                tables = ?coordinator.model().awaiting_recovery_table_names(),
                "the storage servers of the previous run are gone: their tablets are recovered from replicas once the servers enlist"
            );
        }
    }
    let shutdown = CancellationToken::new();
    // Moves interrupted by a previous stop are finished or undone in the
    // background (a round starts at once); new moves wait for it.
    let reconciler = tokio::spawn(reconcile::run_reconciler(
        coordinator.clone(),
        shutdown.clone(),
    ));
    let detector = tokio::spawn(failure::run_detector(
        coordinator.clone(),
        failure::Timing {
            ping_interval: config.ping_interval,
            failure_timeout: config.failure_timeout,
        },
        shutdown.clone(),
    ));
    // Dead servers on record (from a previous run or `forget_servers`) are
    // recovered as soon as enough servers are live.
    let recoverer = tokio::spawn(death::run_recoverer(coordinator.clone(), shutdown.clone()));
    let publisher = tokio::spawn(metrics::publish(coordinator.clone(), shutdown.clone()));
    let task = tokio::spawn(accept_loop(
        listener,
        config.tls.clone(),
        coordinator.clone(),
        conns.clone(),
        shutdown.clone(),
    ));
    Ok(CoordinatorHandle {
        addr,
        coordinator,
        conns,
        shutdown,
        task,
        reconciler,
        detector,
        recoverer,
        publisher,
        rates: Arc::default(),
    })
}

/// A connection slot: a free one, or the one the longest-idle connection
/// gives up (it closes at once when told; waited for briefly, so a
/// connection busy finishing a request does not stall accepting for long).
async fn admit(
    permits: &Arc<Semaphore>,
    conns: &conn::Shared,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(p) = permits.clone().try_acquire_owned() {
        return Some(p);
    }
    if !conns.evict_oldest_idle() {
        return None;
    }
    tokio::time::timeout(Duration::from_secs(1), permits.clone().acquire_owned())
        .await
        .ok()?
        .ok()
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<ServerTls>,
    coordinator: Arc<Coordinator>,
    conns: Arc<conn::Shared>,
    shutdown: CancellationToken,
) {
    let max_connections = conns.limits.max_connections;
    let permits = Arc::new(Semaphore::new(max_connections));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                if let Err(e) = done {
                    error!("a connection task failed: {e}");
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match admit(&permits, &conns).await {
                    Some(permit) => {
                        let coordinator = coordinator.clone();
                        let shutdown = shutdown.clone();
                        let conns = conns.clone();
                        let tls = tls.clone();
                        connections.spawn(async move {
                            // The handshake runs here, off the accept loop,
                            // and may take no longer than a stalled frame.
                            let stream = match &tls {
                                Some(tls) => tls.accept(stream, conns.limits.stall_timeout).await,
                                None => Ok(Stream::Plain(stream)),
                            };
                            match stream {
                                Ok(stream) => conn::serve(coordinator, conns, stream, shutdown).await,
                                Err(e) => debug!(%peer, "connection closed: {e}"),
                            }
                            drop(permit);
                        });
                    }
                    None => {
                        warn!(%peer, "refusing a connection: {max_connections} connections are open and none is idle");
                        let mut out = BytesMut::new();
                        encode_error(&mut out, 0, Status::Retry, format!("too many connections (limit {max_connections})"));
                        // Best effort, never blocks: the socket buffer takes
                        // a small frame (a TLS peer could not read it).
                        if tls.is_none() {
                            let _ = stream.try_write(&out);
                        }
                        drop(stream);
                    }
                },
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    // Connections see the cancellation, finish the request in hand and close.
    while let Some(done) = connections.join_next().await {
        if let Err(e) = done {
            error!("a connection task failed: {e}");
        }
    }
    coordinator.close().await;
    info!("coordinator stopped");
}
