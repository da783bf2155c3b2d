//! One shard: a thread with a single-threaded tokio runtime that owns an
//! `Engine` and every connection made to its port.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

use insitu_engine::{Engine, EngineConfig};
use insitu_protocol::TabletState;
use insitu_tls::{ServerTls, Stream};
use tokio::sync::watch;

use crate::limits::{ConnLimits, FrameBudget};
use crate::replicate::ServerReplication;

/// What the shard knows about a tablet beyond what the engine stores.
#[derive(Clone, Copy, Debug)]
pub struct TabletMeta {
    /// Map version of the assignment; requests naming another are refused (pushdown ops).
    pub map_version: u64,
    pub state: TabletState,
    /// Writes are refused with Retry while the tablet is being copied away,
    /// and while a recovered tablet serves reads only (`ActivateTablet`
    /// with `writes` false).
    pub frozen: bool,
    /// A migration out of this shard completed: the destination holds every
    /// object and may accept writes as soon as the coordinator activates it,
    /// so this copy never answers a read, write or scan again (it answers
    /// `UnknownTablet`, which makes a client with an old map refresh it). Only
    /// an aborted move (`TakeTablet{Active}`) makes it serve again;
    /// `DropTablet` frees it.
    pub moved_out: bool,
    /// Id of the migration that froze the tablet (0: none), so a migration
    /// that was aborted meanwhile neither marks the tablet moved out nor
    /// un-freezes a state that an abort or a newer migration set.
    pub migration: u64,
    /// For a `Receiving` copy made for a move: that move's id (see
    /// `Request::TakeTablet`); only its batches are installed. 0 for a
    /// recovery's receiving copy and for every other state.
    pub receiving: u64,
    /// Scans and updates holding the tablet still (`hold.rs`): writes get Retry.
    pub write_holds: u32,
    /// An update holds the tablet (exclusive: other updates and moves wait).
    pub updating: bool,
    /// 0, or the server this tablet's objects were lost with (`MarkLost`,
    /// `lost.rs`): missing keys answer `DataLost` until it is cleared.
    pub lost_from: u64,
    /// For a copy receiving a move: the bound on the tablet's commits its
    /// batches carried (`commit_bound.rs`), its snapshot floor once
    /// activated. None: not known (a recovery's copy, or an old source).
    pub carried_commit_ts: Option<u64>,
}

impl TabletMeta {
    /// A plain assignment: `state`, not frozen, not moved out.
    pub fn new(map_version: u64, state: TabletState) -> TabletMeta {
        TabletMeta {
            map_version,
            state,
            frozen: false,
            moved_out: false,
            migration: 0,
            receiving: 0,
            write_holds: 0,
            updating: false,
            lost_from: 0,
            carried_commit_ts: None,
        }
    }
    pub fn serves_reads(&self) -> bool {
        self.state == TabletState::Active && !self.moved_out
    }
    pub fn serves_writes(&self) -> bool {
        self.serves_reads() && !self.frozen && self.write_holds == 0
    }
    /// The status that refuses a read (`write` false) or a write, or `None`
    /// to go on: `UnknownTablet` once moved out (the client refreshes its map
    /// and finds the new owner), `Retry` while receiving, frozen or held.
    pub fn refusal(&self, write: bool) -> Option<insitu_protocol::Status> {
        if self.moved_out {
            Some(insitu_protocol::Status::UnknownTablet)
        } else if !self.serves_reads() || (write && !self.serves_writes()) {
            Some(insitu_protocol::Status::Retry)
        } else {
            None
        }
    }
}

/// Everything one shard owns. Shared by its connection tasks through `Rc`:
/// they all run on this thread, and no borrow is held across an `.await`.
pub struct ShardState {
    pub index: usize,
    pub engine: RefCell<Engine>,
    /// (table, start_hash) -> meta.
    pub tablets: RefCell<HashMap<(u64, u64), TabletMeta>>,
    /// Tablets not plainly serving (receiving, frozen or held). While zero,
    /// the hot path skips the per-request state check.
    pub unusual_tablets: Cell<usize>,
    /// Tablets marked lost (`lost.rs`): 0 keeps the check off the read path.
    pub lost_tablets: Cell<usize>,
    pub connections: Cell<usize>,
    /// Enumerations in progress, so each batch costs O(batch) (enumerate.rs).
    pub enumerate: RefCell<crate::enumerate::EnumerateCache>,
    /// Typed-query answers whose pages the clients are still fetching (held.rs).
    pub held: RefCell<crate::held::HeldQueries>,
    /// Secondary indexes of this shard's typed tablets (`sindex/`).
    pub sindex: RefCell<crate::sindex::SecondaryIndexes>,
    /// Last migration id handed out on this shard (see `TabletMeta::migration`).
    pub migrations: Cell<u64>,
    /// Woken whenever a hold is released (`hold.rs`): scans, updates and moves
    /// waiting for a tablet re-check it.
    pub holds_released: tokio::sync::Notify,
    pub limits: ConnLimits,
    /// Bytes of big frames being received, shared by this shard's connections.
    pub frame_budget: Arc<FrameBudget>,
    /// Connections waiting idle (both ports): the connection limit evicts
    /// the longest idle.
    idle: crate::inbox::IdleList,
    /// Tablets being recovered here (`recover.rs`), so a repeated
    /// `RecoverTablet` does not race the one in progress.
    pub recovering: RefCell<HashSet<(u64, u64)>>,
    /// Replication to backups and the durable mark replies wait for.
    pub repl: crate::replicate::Replicator,
    /// Transactions prepared here, their locks and the decisions kept (`txn.rs`).
    pub txns: crate::txn::ShardTxns,
    /// Older versions kept for snapshot reads while they are read (`versions.rs`).
    pub versions: RefCell<crate::versions::Versions>,
    /// Who may send what here (`insitu_auth`); checked on every request.
    pub gate: insitu_auth::Gate,
    /// Request counters and latency for the metrics port (`metrics.rs`).
    pub metrics: crate::metrics::ShardMetrics,
    /// The server's Redis protocol port (0: none), told to the other
    /// servers in `ShardStats` so they can send cluster clients here.
    pub resp_port: u16,
}

impl crate::inbox::Port for ShardState {
    fn limits(&self) -> &ConnLimits {
        &self.limits
    }
    fn frame_budget(&self) -> &FrameBudget {
        &self.frame_budget
    }
    fn idle(&self) -> &crate::inbox::IdleList {
        &self.idle
    }
}

impl ShardState {
    pub fn recount_unusual(&self) {
        let tablets = self.tablets.borrow();
        let n = tablets.values().filter(|m| !m.serves_writes()).count();
        self.unusual_tablets.set(n);
        let lost = tablets.values().filter(|m| m.lost_from != 0).count();
        self.lost_tablets.set(lost);
    }
}

/// What a shard listens on.
pub struct Listen {
    /// Bound (and non-blocking) by the server before the shard starts, so
    /// its address is known and published first.
    pub listener: std::net::TcpListener,
    /// TLS on every connection accepted (both ports); None: plain TCP.
    pub tls: Option<ServerTls>,
    /// The Redis protocol port, shared by every shard (`resp/`).
    pub resp: Option<crate::resp::RespListen>,
}

pub fn run_shard(
    index: usize,
    listen: Listen,
    engine_config: EngineConfig,
    limits: ConnLimits,
    frame_budget: Arc<FrameBudget>,
    replication: Arc<ServerReplication>,
    mut stop: watch::Receiver<bool>,
) {
    let Listen {
        listener,
        tls,
        resp,
    } = listen;
    let mut fenced = replication.fenced_watch();
    let gate = replication.gate.clone();
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| format!("shard-{index}"));
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(shard = index, "cannot build runtime: {e}");
            return;
        }
    };
    let engine = match Engine::new(engine_config) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(shard = index, "cannot create engine: {e}");
            return;
        }
    };
    let state = Rc::new(ShardState {
        index,
        engine: RefCell::new(engine),
        tablets: RefCell::new(HashMap::new()),
        unusual_tablets: Cell::new(0),
        lost_tablets: Cell::new(0),
        connections: Cell::new(0),
        enumerate: RefCell::new(crate::enumerate::EnumerateCache::default()),
        held: RefCell::new(crate::held::HeldQueries::default()),
        sindex: RefCell::new(crate::sindex::SecondaryIndexes::default()),
        migrations: Cell::new(0),
        holds_released: tokio::sync::Notify::new(),
        limits,
        frame_budget,
        idle: crate::inbox::IdleList::default(),
        recovering: RefCell::new(HashSet::new()),
        repl: crate::replicate::Replicator::new(replication),
        txns: crate::txn::ShardTxns::default(),
        versions: RefCell::new(crate::versions::Versions::default()),
        gate,
        metrics: crate::metrics::ShardMetrics::new(addr),
        resp_port: resp.as_ref().map_or(0, |r| r.config.port),
    });
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(shard = index, "cannot register listener: {e}");
                return;
            }
        };
        tokio::task::spawn_local(crate::replicate::run(state.clone()));
        tokio::task::spawn_local(crate::held::sweep(state.clone()));
        tokio::task::spawn_local(crate::sindex::keep_up(state.clone()));
        tokio::task::spawn_local(crate::txn_resolve::sweep(state.clone()));
        tokio::task::spawn_local(crate::expiry::sweep(state.clone()));
        tokio::task::spawn_local(crate::metrics::publish(state.clone()));
        let resp = match resp {
            Some(r) => match tokio::net::TcpListener::from_std(r.listener) {
                Ok(l) => Some((l, Rc::new(crate::resp::RespShard::new(r.config)))),
                Err(e) => {
                    tracing::error!(shard = index, "cannot register the RESP listener: {e}");
                    return;
                }
            },
            None => None,
        };
        let resp_accept = || async {
            match &resp {
                Some((l, shard)) => (l.accept().await, shard.clone()),
                None => std::future::pending().await,
            }
        };
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                (accepted, resp_shard) = resp_accept() => {
                    if let Some((stream, peer)) = admit_connection(&state, index, accepted).await {
                        spawn_connection(state.clone(), tls.clone(), stream, peer, Port::Resp(resp_shard));
                    }
                }
                // Declared dead: stop serving (dropping the tasks closes every connection).
                _ = fenced.wait_for(|f| *f) => break,
                accepted = listener.accept() => {
                    if let Some((stream, peer)) = admit_connection(&state, index, accepted).await {
                        spawn_connection(state.clone(), tls.clone(), stream, peer, Port::Native);
                    }
                }
            }
        }
    });
}

/// Which protocol a connection speaks.
enum Port {
    /// insitu's own (`conn.rs`).
    Native,
    /// Redis's (`resp/`), with the shard's RESP state.
    Resp(Rc<crate::resp::RespShard>),
}

/// Serve an admitted connection on its own task: the TLS handshake (if any)
/// runs there, off the accept loop, and may take no longer than a stalled
/// frame.
fn spawn_connection(
    state: Rc<ShardState>,
    tls: Option<ServerTls>,
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    port: Port,
) {
    tokio::task::spawn_local(async move {
        let index = state.index;
        let stream = match &tls {
            Some(tls) => tls.accept(stream, state.limits.stall_timeout).await,
            None => Ok(Stream::Plain(stream)),
        };
        let served = match (stream, &port) {
            (Ok(stream), Port::Native) => crate::conn::serve(stream, &state).await,
            (Ok(stream), Port::Resp(resp)) => crate::resp::serve(stream, &state, resp).await,
            (Err(e), _) => Err(e),
        };
        let resp = matches!(port, Port::Resp(_));
        match served {
            Ok(None) => {}
            Ok(Some(why)) => {
                tracing::debug!(shard = index, %peer, resp, ?why, "connection closed by the shard")
            }
            Err(e) => tracing::debug!(shard = index, %peer, resp, "connection closed: {e}"),
        }
        state.connections.set(state.connections.get() - 1);
    });
}

/// An accepted connection let in under the connection limit (the
/// longest-idle connection is closed to make room), counted, with
/// `TCP_NODELAY` set; None if the accept failed or no room could be made.
async fn admit_connection(
    state: &ShardState,
    index: usize,
    accepted: std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)>,
) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
    let (stream, peer) = match accepted {
        Ok(s) => s,
        Err(e) => {
            // EMFILE and friends: back off instead of spinning.
            tracing::warn!(shard = index, "accept failed: {e}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            return None;
        }
    };
    if state.connections.get() >= state.limits.max_connections {
        if state.idle.evict_oldest() {
            tracing::info!(shard = index, %peer, "connection limit reached; closing the longest-idle connection");
        } else {
            tracing::warn!(shard = index, %peer, "connection limit reached and no connection is idle; refusing");
            return None;
        }
    }
    let _ = stream.set_nodelay(true);
    state.connections.set(state.connections.get() + 1);
    Some((stream, peer))
}
