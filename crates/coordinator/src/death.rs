//! Dead servers: declaring a server dead (failure detection, `RemoveServer`,
//! retirement on enlist, `forget_servers`), telling the live shards
//! (`ServerDown`), and the recovery driver that recovers every dead server's
//! tablets (`recovery::recover_server`), retrying with back-off.
//!
//! A death is one redb transaction (`Op::MarkDead`): from its commit on, no
//! request is routed to the server and its tablets answer `Retry` in
//! `OpenTable`/`TableMap`. Everything after it (the broadcast, recovery) is
//! safe to repeat, so a coordinator that stops half-way finds the server in
//! `dead_servers` at its next start and recovers it then.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use insitu_protocol::{Request, Response, Status};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::model::Op;
use crate::recovery;
use crate::service::{Coordinator, Reject, Reply};
use crate::shards::CallError;

/// `ServerDown` is a notice: a shard that does not take it within this long
/// is itself slow or gone (and the failure detector deals with it).
const SERVER_DOWN_TIMEOUT: Duration = Duration::from_secs(1);
/// First pause before retrying a failed recovery; doubles up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

impl Coordinator {
    /// Declare the live servers among `ids` dead (durably, in one
    /// transaction), then tell the live shards and wake recovery. `why` is
    /// for the log. Returns the servers that were newly declared dead.
    pub(crate) async fn declare_dead(&self, ids: &[u64], why: &str) -> Result<Vec<u64>, Reject> {
        let guard = self.meta_lock.lock().await;
        let newly: Vec<u64> = {
            let model = self.model();
            ids.iter()
                .copied()
                .filter(|id| model.is_live(*id))
                .collect()
        };
        if newly.is_empty() {
            return Ok(newly);
        }
        let ops = newly.iter().map(|id| Op::MarkDead { id: *id }).collect();
        self.commit(&guard, ops).await?;
        drop(guard);
        for id in &newly {
            warn!(
                server_id = id,
                "server declared dead ({why}); its tablets are recovered"
            );
        }
        self.after_death(&newly).await;
        Ok(newly)
    }

    /// Declare every live server dead, for `CoordinatorConfig::forget_servers`
    /// (`insitu up`: the previous run's servers lived in its process). No
    /// shard is told: none is live. Returns how many were declared dead.
    pub(crate) async fn declare_all_dead(&self) -> Result<usize, Reject> {
        let guard = self.meta_lock.lock().await;
        let ids = self.model().live_servers();
        if ids.is_empty() {
            return Ok(0);
        }
        let ops = ids.iter().map(|id| Op::MarkDead { id: *id }).collect();
        self.commit(&guard, ops).await?;
        Ok(ids.len())
    }

    /// What follows the (committed) death of `dead`: forget cached
    /// connections to their shards, send `ServerDown` for each to every shard
    /// of every live server (in parallel, best effort, logged: the shards'
    /// replicators re-replicate what had a replica there), then wake the
    /// reconciler (a recorded move may involve a dead server) and recovery.
    pub(crate) async fn after_death(&self, dead: &[u64]) {
        let (dead_addrs, live_addrs) = {
            let model = self.model();
            let dead_addrs: Vec<String> = dead
                .iter()
                .filter_map(|id| model.servers.get(id))
                .flatten()
                .cloned()
                .collect();
            let live_addrs: Vec<String> = model
                .live_servers()
                .iter()
                .filter_map(|id| model.servers.get(id))
                .flatten()
                .cloned()
                .collect();
            (dead_addrs, live_addrs)
        };
        for addr in &dead_addrs {
            self.shards.forget(addr);
        }
        let calls = dead.iter().flat_map(|&server_id| {
            live_addrs.iter().map(move |addr| async move {
                let request = Request::ServerDown { server_id };
                // The bound covers connecting too (the pool's connect timeout is longer).
                let call = self.shards.call(addr, &request, SERVER_DOWN_TIMEOUT);
                let result = tokio::time::timeout(SERVER_DOWN_TIMEOUT, call)
                    .await
                    .unwrap_or_else(|_| {
                        Err(CallError::Transport(format!(
                            "no reply within {SERVER_DOWN_TIMEOUT:?}"
                        )))
                    });
                (server_id, addr, result)
            })
        });
        let mut told = 0usize;
        for (server_id, addr, result) in join_all(calls).await {
            match result {
                Ok(()) => told += 1,
                Err(e) => warn!(server_id, addr, "ServerDown not delivered: {e}"),
            }
        }
        info!(dead = ?dead, shards = told, "live shards told of the death");
        self.reconcile_wake.notify_one();
        self.recovery_wake.notify_one();
    }

    /// `RemoveServer`: the operator says server `id` is gone: declare it dead
    /// now (its tablets are then recovered). Removing a dead server again is
    /// not an error.
    pub(crate) async fn remove_server(&self, id: u64) -> Reply {
        if !self.model().servers.contains_key(&id) {
            return Err(Reject::new(
                Status::UnknownServer,
                format!("no server with id {id} is on record (`insitu status` lists the servers)"),
            ));
        }
        self.operator_removed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
        self.declare_dead(&[id], "removed by the operator").await?;
        // Recovery of others may have been waiting for this server's disk.
        self.recovery_wake.notify_one();
        Ok(Response::Done)
    }

    /// One round of recovery: every dead server on record, if enough servers
    /// are live (at least one, and `rehome_after_servers`, so the tablets
    /// spread over all of the expected servers). Returns whether a recovery
    /// failed (to be retried after a back-off).
    pub(crate) async fn recover_dead_servers(&self) -> bool {
        // Recovered tablets a stopped coordinator left refusing writes.
        let mut failed = recovery::finish_held(self).await;
        let (dead, live) = {
            let model = self.model();
            let dead: Vec<u64> = model.dead.iter().copied().collect();
            (dead, model.live_servers().len())
        };
        if dead.is_empty() {
            return failed;
        }
        if live == 0 || live < self.rehome_after_servers {
            let why = format!(
                "it waits for live servers to recover it on ({live} live, {} needed)",
                self.rehome_after_servers.max(1)
            );
            for &id in &dead {
                recovery::note_waiting(self, id, &why);
            }
            info!(
                dead = ?dead,
                live,
                waiting_for = self.rehome_after_servers.max(1),
                "recovery waits for more live servers"
            );
            return failed;
        }
        // Passes until one recovers nothing more: a server recovered (and
        // forgotten) may be what another one was waiting for.
        let mut dead = dead;
        loop {
            let (mut recovered, mut waiting) = (false, false);
            for id in dead {
                let waiting_for = self.replicas_elsewhere(id);
                if !waiting_for.is_empty() {
                    waiting = true;
                    let why = format!(
                        "it waits for the disks of dead servers {waiting_for:?}, which may hold \
                         replicas no live backup holds: restart them on their --dir, or \
                         `insitu server remove ID` to give them up"
                    );
                    recovery::note_waiting(self, id, &why);
                    warn!(
                        server_id = id,
                        waiting_for = ?waiting_for,
                        "recovery waits for the disks of other dead servers, which may hold some of \
                         this server's only replicas: restart them on their --dir, or `insitu server \
                         remove ID` to give their replicas up"
                    );
                    continue;
                }
                match recovery::recover_server(self, id).await {
                    Ok(_summary) => {
                        recovered = true;
                        metrics::counter!("insitu_recoveries_total").increment(1);
                        info!(server_id = id, "dead server's tablets recovered");
                    }
                    Err(e) => {
                        failed = true;
                        metrics::counter!("insitu_recovery_failures_total").increment(1);
                        warn!(
                            server_id = id,
                            "recovering the tablets of dead server failed, will retry: {e:#}"
                        );
                    }
                }
            }
            if !(recovered && waiting) {
                break;
            }
            dead = self.model().dead.iter().copied().collect();
        }
        failed
    }
}

impl Coordinator {
    /// The other dead servers whose backups may hold replicas of `dead` that
    /// no live backup holds: those not yet back (no live server enlisted
    /// with their identity, i.e. on their `--dir`) and not given up by the
    /// operator. Why wait: a recovery reads the newest log of each tablet from
    /// whatever backups answer, and nothing tells it that a segment is
    /// missing, so starting it while some replicas are out of reach could
    /// silently lose objects (after a whole-cluster restart, every server is
    /// one of these until its successor enlists).
    fn replicas_elsewhere(&self, dead: u64) -> Vec<u64> {
        let removed = self
            .operator_removed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let model = self.model();
        let live_identities: std::collections::HashSet<&str> = model
            .live_servers()
            .iter()
            .filter_map(|id| model.identities.get(id).map(String::as_str))
            .collect();
        model
            .dead
            .iter()
            .copied()
            .filter(|&other| other != dead && !removed.contains(&other))
            .filter(|other| {
                model
                    .identities
                    .get(other)
                    // Without an identity (an old or hand-made enlistment)
                    // its return cannot be recognised: it does not block.
                    .is_some_and(|ident| {
                        !ident.is_empty() && !live_identities.contains(ident.as_str())
                    })
            })
            .collect()
    }
}

/// The recovery driver: a round at start (servers already dead), then
/// whenever woken (a death, an enlistment), and again with back-off while a
/// recovery fails; ends with `shutdown`.
pub(crate) async fn run_recoverer(coordinator: Arc<Coordinator>, shutdown: CancellationToken) {
    let mut pause = FIRST_RETRY;
    loop {
        let failed = tokio::select! {
            _ = shutdown.cancelled() => return,
            failed = coordinator.recover_dead_servers() => failed,
        };
        let retry = if failed {
            let p = pause;
            pause = (pause * 2).min(MAX_RETRY);
            p
        } else {
            pause = FIRST_RETRY;
            Duration::from_secs(24 * 3600)
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = coordinator.recovery_wake.notified() => {}
            _ = tokio::time::sleep(retry) => {}
        }
    }
}
