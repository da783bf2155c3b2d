//! Replication of this shard's log segments to R backups, and the durable
//! mark replies wait for (ARCHITECTURE.md, "Replication").
//!
//! One task per shard (`run`) drives rounds. A round walks the engine's log
//! view under one borrow (`Book::plan`: the new bytes are copied out), sends
//! one `BackupWrite` per backup (split to fit a frame) to all of them at once,
//! awaits every `Done`, and if everything went through marks the walk's
//! `log_changes()` value durable and wakes the connections waiting for it.
//! One round is in flight at a time; the next starts as soon as the previous
//! ends if more changes are pending, so every write that arrived meanwhile
//! shares its round trip (group commit).
//!
//! Failures: a backup that errors, times out or is full gets its segments of
//! that round moved to another backup and resent from offset 0; the round
//! does not count and the next one starts after a back-off; replies keep
//! waiting. `Fenced` means the coordinator declared this server dead: it must
//! stop serving at once (`ServerReplication::fence`).

mod book;
mod servers;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use insitu_auth::Gate;
use insitu_client::rpc::RpcConn;
use insitu_protocol::{Request, Response, Status};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::backup_job::JobBody;
use crate::shard::ShardState;
pub use book::Book;
pub(crate) use book::OwnedOp;
use book::{BackupBatch, request};

/// Timing and limits of replication (one set per server).
#[derive(Clone, Debug)]
pub struct ReplicationConfig {
    /// Deadline of every call to a backup or the coordinator. 5 s: far above
    /// a loaded backup's fsync, so a slow disk is not mistaken for a dead
    /// one (which would resend whole segments elsewhere).
    pub call_timeout: Duration,
    /// How often the server list is fetched again to learn of new servers.
    pub refresh_interval: Duration,
    /// First pause after a failed round; doubles up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// Most segment bytes one round copies out of the engine (bounds the
    /// memory of a resend after a failure; the rest follows in later rounds).
    /// The copy runs under one engine borrow, so this also bounds how long a
    /// round's plan holds the shard: 4 MiB of fresh buffers took 3-6 ms in a
    /// recovery (64 MiB took up to 25 ms, the longest hold of a recovery
    /// master's shard after the replay's sort; BENCHMARKS.md).
    pub max_round_bytes: usize,
    /// On `Fenced`, exit the process (code 70) as a dead server must. False
    /// only for in-process servers (`insitu up`, tests): the server stops
    /// serving instead.
    pub exit_on_fence: bool,
    /// Whether this server's own backup may hold its replicas, as a last
    /// resort when fewer other backups are live than R (default: yes, so a
    /// one-server cluster is durable on its own disk). Off: replicas only
    /// ever go to other servers (a copy on the same machine does not survive
    /// losing that machine).
    pub own_backup: bool,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            call_timeout: Duration::from_secs(5),
            refresh_interval: Duration::from_secs(1),
            retry_min: Duration::from_millis(50),
            retry_max: Duration::from_secs(2),
            max_round_bytes: 4 << 20,
            exit_on_fence: true,
            own_backup: true,
        }
    }
}

/// Who this server is in its cluster, known once it has enlisted.
#[derive(Clone, Debug)]
pub struct ClusterIdentity {
    pub server_id: u64,
    pub cluster_id: u64,
    /// Replicas per segment (R); 0 = no replication, no waiting.
    pub replicas: u32,
    /// Where to fetch the server list.
    pub coordinator: String,
    /// This server's own backup service ("" = none): the last-resort backup.
    pub backup_addr: String,
    /// The same backup, called in-process (`backup_local.rs`): a batch for
    /// `backup_addr` goes through it rather than the backup port.
    pub own_backup: Option<crate::backup_service::LocalBackup>,
}

/// Shared by every shard of one server (across threads).
pub struct ServerReplication {
    pub config: ReplicationConfig,
    /// Who may connect to this server and what it presents to its peers
    /// (the cluster credential, on every connection to a backup). Kept here
    /// because this is the one object every shard and the backup service
    /// share.
    pub gate: Gate,
    /// Set once after enlisting; shards wait for it before replicating.
    identity: watch::Sender<Option<Arc<ClusterIdentity>>>,
    /// Set when a backup answered `Fenced` (and the process did not exit):
    /// every shard stops serving.
    fenced: watch::Sender<bool>,
}

impl ServerReplication {
    pub fn new(config: ReplicationConfig, gate: Gate) -> Arc<ServerReplication> {
        Arc::new(ServerReplication {
            config,
            gate,
            identity: watch::channel(None).0,
            fenced: watch::channel(false).0,
        })
    }

    pub fn set_identity(&self, identity: ClusterIdentity) {
        self.identity.send_replace(Some(Arc::new(identity)));
    }

    pub fn is_fenced(&self) -> bool {
        *self.fenced.borrow()
    }

    /// A receiver that changes when the server is fenced.
    pub fn fenced_watch(&self) -> watch::Receiver<bool> {
        self.fenced.subscribe()
    }

    /// The coordinator declared this server dead: it must not serve.
    fn fence(&self, shard: usize) {
        tracing::error!(
            shard,
            "this server was declared dead by the coordinator; exiting"
        );
        if self.config.exit_on_fence {
            std::process::exit(70);
        }
        self.fenced.send_replace(true);
    }
}

/// The server was fenced while a reply waited: the connection must close.
#[derive(Debug)]
pub struct Fenced;

/// One shard's replicator state (in `ShardState`).
pub struct Replicator {
    shared: Arc<ServerReplication>,
    /// `log_changes()` value whose bytes R backups hold; `u64::MAX` when
    /// R = 0, so the connections' check is one compare that never waits.
    durable: Cell<u64>,
    /// Woken when `durable` advances.
    advanced: Notify,
    /// Wakes the replicator task: a connection waits, or a server went down.
    kick: Notify,
    /// Woken on `ServerDown`, so a round's call to that backup is abandoned.
    down: Notify,
    /// The bookkeeping; `None` until the identity is known (and with R = 0).
    book: RefCell<Option<Book>>,
    /// Cached connections to backups and the coordinator, by address.
    conns: RefCell<HashMap<Rc<str>, RpcConn>>,
    /// Asks the list refresher (`servers::refresher`) to fetch the server list now.
    want_list: Notify,
    /// (walk, mark) of rounds whose appends are held but whose mark waits
    /// for owed frees (see the end of `round`), oldest first.
    completed: RefCell<std::collections::VecDeque<(u64, u64)>>,
}

impl Replicator {
    /// The cluster id from enlisting (0 before it), which every backup
    /// request carries (recovery's reads too).
    pub fn cluster_id(&self) -> u64 {
        self.shared
            .identity
            .borrow()
            .as_ref()
            .map_or(0, |i| i.cluster_id)
    }

    /// This server's id, once enlisted (the Redis port names its node by it).
    pub fn server_id(&self) -> Option<u64> {
        self.shared.identity.borrow().as_ref().map(|i| i.server_id)
    }

    /// The coordinator's address, once enlisted (transactions find the
    /// owners of their anchors through it).
    pub fn coordinator(&self) -> Option<String> {
        self.shared
            .identity
            .borrow()
            .as_ref()
            .map(|i| i.coordinator.clone())
    }

    pub fn new(shared: Arc<ServerReplication>) -> Replicator {
        Replicator {
            shared,
            durable: Cell::new(0),
            advanced: Notify::new(),
            kick: Notify::new(),
            down: Notify::new(),
            book: RefCell::new(None),
            conns: RefCell::new(HashMap::new()),
            completed: RefCell::new(std::collections::VecDeque::new()),
            want_list: Notify::new(),
        }
    }

    /// The engine's log changes held by R backups so far.
    pub fn durable_mark(&self) -> u64 {
        self.durable.get()
    }

    /// Whether replies made after the engine reached `changes` must wait.
    #[inline]
    pub fn behind(&self, changes: u64) -> bool {
        changes > self.durable.get()
    }

    /// Wait until the changes up to `target` are held by R backups.
    pub async fn wait_durable(&self, target: u64) -> Result<(), Fenced> {
        loop {
            let advanced = self.advanced.notified();
            if self.shared.is_fenced() {
                return Err(Fenced);
            }
            if self.durable.get() >= target {
                return Ok(());
            }
            self.kick.notify_one();
            advanced.await;
        }
    }

    /// Changes were made that nobody waits for (the expiry sweep's
    /// tombstones): ship them with the next round.
    pub fn kick(&self) {
        self.kick.notify_one();
    }

    /// `ServerDown`: stop using that server's backup and re-replicate
    /// every segment it held.
    pub fn server_down(&self, server_id: u64) {
        let addr = self
            .book
            .borrow_mut()
            .as_mut()
            .and_then(|book| book.server_down(server_id));
        if let Some(addr) = addr {
            self.conns.borrow_mut().remove(&addr);
        }
        self.want_list.notify_one();
        self.down.notify_waiters();
        self.kick.notify_one();
    }

    fn set_durable(&self, mark: u64) {
        if mark > self.durable.get() {
            self.durable.set(mark);
        }
        self.advanced.notify_waiters();
    }
}

/// The shard's replication task: runs until the shard stops.
pub async fn run(state: Rc<ShardState>) {
    let repl = &state.repl;
    let mut identity = repl.shared.identity.subscribe();
    let identity = match identity.wait_for(|i| i.is_some()).await {
        Ok(i) => i.clone().expect("waited for Some"),
        Err(_) => return, // the server is going away
    };
    if identity.replicas == 0 {
        // Cache mode: nothing to send, nothing to wait for.
        repl.set_durable(u64::MAX);
        return;
    }
    let rng = fastrand::Rng::new();
    *repl.book.borrow_mut() = Some(Book::new(
        identity.replicas as usize,
        &identity.backup_addr,
        rng,
    ));
    let config = repl.shared.config.clone();
    // The list is fetched beside the rounds, so a slow coordinator never
    // holds a round (and the replies waiting for it) back.
    tokio::task::spawn_local(servers::refresher(state.clone(), identity.clone()));
    let mut pause = config.retry_min;
    loop {
        // Registered before the check, so a kick in between is not lost.
        let kicked = repl.kick.notified();
        let changed = repl.behind(state.engine.borrow().log_changes());
        let more = with_book(repl, |b| b.has_work(Instant::now()));
        if !(changed || more) {
            kicked.await;
            continue;
        }
        let started = Instant::now();
        match round(&state, &identity).await {
            Outcome::Durable | Outcome::Partial => {
                state.metrics.replication_round(started.elapsed());
                pause = config.retry_min;
            }
            Outcome::Waiting => {
                tokio::select! {
                    _ = tokio::time::sleep(config.retry_min) => {}
                    _ = repl.kick.notified() => {}
                }
            }
            Outcome::Failed => {
                repl.want_list.notify_one();
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(config.retry_max);
            }
            Outcome::Fenced => {
                repl.shared.fence(state.index);
                repl.advanced.notify_waiters();
                return;
            }
        }
    }
}

fn with_book<T: Default>(repl: &Replicator, f: impl FnOnce(&mut Book) -> T) -> T {
    repl.book.borrow_mut().as_mut().map(f).unwrap_or_default()
}

/// How a round ended.
enum Outcome {
    /// Everything up to the walk's mark is held by R backups.
    Durable,
    /// Every call succeeded but not everything was sent (byte cap).
    Partial,
    /// A backup failed, or a segment lacks backups: retry after a pause.
    Failed,
    /// A backup answered `Fenced`.
    Fenced,
    /// Nothing could be sent and the mark still waits for owed frees that
    /// are not sendable yet (ordering, a backup's pause): look again shortly
    /// rather than spin.
    Waiting,
}

/// One replication round (see the module comment).
async fn round(state: &ShardState, identity: &ClusterIdentity) -> Outcome {
    let repl = &state.repl;
    let config = &repl.shared.config;
    let (plan, replaced) = {
        let engine = state.engine.borrow();
        let mut book = repl.book.borrow_mut();
        let Some(book) = book.as_mut() else {
            return Outcome::Failed;
        };
        let plan = book.plan(&engine, config.max_round_bytes, Instant::now());
        // Per segment, what this walk saw: a read of an entry it saw waits
        // for this walk's mark only (`Engine::read_held`).
        engine.note_walk(plan.mark);
        (plan, book.replaced)
    };
    let sends = plan
        .batches
        .iter()
        .map(|batch| send_batch(repl, identity, batch));
    let results = futures::future::join_all(sends).await;
    let mut all_ok = true;
    for (batch, result) in plan.batches.iter().zip(results) {
        match result {
            Ok(()) => with_book(repl, |b| b.acknowledged(batch)),
            Err(SendError::Fenced) => return Outcome::Fenced,
            Err(SendError::Failed(why)) => {
                // Frees alone do not make anything durable: their failure
                // (queued again for later) does not hold the round back.
                all_ok &= batch.expect.is_empty();
                tracing::warn!(
                    shard = state.index,
                    backup = %batch.addr,
                    "replication to a backup failed; its segments go to another backup: {why}"
                );
                repl.conns.borrow_mut().remove(&batch.addr);
                with_book(repl, |b| b.failed(batch, Instant::now()));
            }
        }
    }
    let mut guard = repl.book.borrow_mut();
    let Some(book) = guard.as_mut() else {
        return Outcome::Failed;
    };
    if !all_ok {
        return Outcome::Failed;
    }
    if book.replaced != replaced {
        // A server went down during the round: its replicas are replaced
        // by the next round; this one cannot vouch for them.
        return Outcome::Partial;
    }
    if !plan.complete {
        if book
            .segs
            .values()
            .any(|s| s.replicas.len() < book.target_replicas())
        {
            tracing::warn!(
                shard = state.index,
                replicas = book.r,
                backups = book.live.len(),
                "not enough backups for every segment; writes wait"
            );
            return Outcome::Failed;
        }
        return Outcome::Partial; // the byte cap left some for the next round
    }
    // Until the digests are settled (see `Book::digests_settled`), the
    // walk waits in `completed` like one with frees owed.
    let settled = book.round_complete(plan.walk);
    // A walk's mark is published only once every free it (or an earlier
    // walk) found owed is acknowledged too. Why: a segment can be sealed and
    // cleaned between two walks, and the cleaner then drops a tombstone that
    // never reached a backup, together with the segment that held the key's
    // older version. Were the remove answered while that older segment's
    // replica still existed, a crash would bring the removed key back. The
    // frees of walk W go out in the round after W, so under a steady load
    // the published mark trails by one round.
    // Frees re-queued after their backup failed (`after` 0) do not hold the
    // mark: that backup may stay unreachable until the coordinator declares
    // it dead, and writes must not stall on it meanwhile (known gap: until
    // then its stale copy could be read by a recovery).
    let pending_after = book
        .frees
        .iter()
        .map(|f| f.after)
        .filter(|&after| after > 0)
        .min();
    drop(guard);
    let mut walks = repl.completed.borrow_mut();
    walks.push_back((plan.walk, plan.mark));
    let mut publish = None;
    while let Some(&(walk, mark)) = walks.front() {
        if !settled || pending_after.is_some_and(|after| after <= walk) {
            break;
        }
        publish = Some(mark);
        walks.pop_front();
    }
    drop(walks);
    match publish {
        Some(mark) => {
            repl.set_durable(mark);
            Outcome::Durable
        }
        None if plan.batches.is_empty() => Outcome::Waiting,
        None => Outcome::Durable,
    }
}

enum SendError {
    Fenced,
    Failed(String),
}

/// Send one backup its frames (pipelined on one connection, so applied in
/// order) and await every `Done`; abandoned if the server goes down meanwhile.
async fn send_batch(
    repl: &Replicator,
    identity: &ClusterIdentity,
    batch: &BackupBatch,
) -> Result<(), SendError> {
    let calls = async {
        let timeout = repl.shared.config.call_timeout;
        let replies: Vec<Result<_, String>> = match &identity.own_backup {
            Some(own) if *batch.addr == *identity.backup_addr => {
                // The ops as they are (they share their bytes with the
                // other backups' sends): see `JobBody::Write`.
                let writes = batch
                    .frames
                    .iter()
                    .map(|ops| JobBody::Write {
                        cluster: identity.cluster_id,
                        master: identity.server_id,
                        ops: ops.clone(),
                    })
                    .collect();
                match tokio::time::timeout(timeout, own.call(writes)).await {
                    Ok(Ok(replies)) => replies.into_iter().map(Ok).collect(),
                    Ok(Err(why)) => return Err(SendError::Failed(why)),
                    Err(_) => {
                        return Err(SendError::Failed(format!(
                            "this server's backup did not answer in {} ms",
                            timeout.as_millis()
                        )));
                    }
                }
            }
            _ => {
                let requests: Vec<Request<'_>> = batch
                    .frames
                    .iter()
                    .map(|f| request(identity.cluster_id, identity.server_id, f))
                    .collect();
                // Each frame's segment bytes go to the socket from the
                // round's buffers, shared with the other backups' sends
                // (`RpcConn::call_sharing`), not copied into the frame.
                let shared: Vec<Vec<bytes::Bytes>> = batch
                    .frames
                    .iter()
                    .map(|ops| OwnedOp::shared(ops))
                    .collect();
                let conn = connect(repl, &batch.addr).await?;
                let calls = requests.iter().zip(&shared).map(|(r, shared)| async {
                    match tokio::time::timeout(timeout, conn.call_sharing(r, shared)).await {
                        Ok(reply) => reply.map_err(|e| e.to_string()),
                        Err(_) => Err(insitu_client::rpc::RpcError::Timeout(timeout).to_string()),
                    }
                });
                futures::future::join_all(calls).await
            }
        };
        for reply in replies {
            let reply = reply.map_err(SendError::Failed)?;
            match reply.status {
                Status::Ok => match reply.decode() {
                    Ok(Response::Done) => {}
                    other => {
                        return Err(SendError::Failed(format!(
                            "unexpected reply to BackupWrite: {other:?}"
                        )));
                    }
                },
                Status::Fenced => return Err(SendError::Fenced),
                status => {
                    return Err(SendError::Failed(format!(
                        "{status}: {}",
                        reply.error_message()
                    )));
                }
            }
        }
        Ok(())
    };
    let gone = async {
        loop {
            let down = repl.down.notified();
            if !with_book(repl, |b| b.is_live_addr(&batch.addr)) {
                return;
            }
            down.await;
        }
    };
    tokio::select! {
        r = calls => r,
        _ = gone => Err(SendError::Failed("its server was declared dead".into())),
    }
}

/// The cached connection to `addr`, or a new one.
async fn connect(repl: &Replicator, addr: &Rc<str>) -> Result<RpcConn, SendError> {
    if let Some(c) = repl.conns.borrow().get(addr).filter(|c| !c.is_closed()) {
        return Ok(c.clone());
    }
    let timeout = repl.shared.config.call_timeout;
    let member = repl.shared.gate.as_member();
    let conn = match tokio::time::timeout(timeout, RpcConn::open(addr, member)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(SendError::Failed(e.to_string())),
        Err(_) => {
            return Err(SendError::Failed(format!(
                "connecting timed out after {} ms",
                timeout.as_millis()
            )));
        }
    };
    repl.conns.borrow_mut().insert(addr.clone(), conn.clone());
    Ok(conn)
}
