//! Recovering a dead server's tablets from its replicas on the live backups.
//!
//! `recover_server(coord, dead)` is called once a server is declared dead
//! (and so fenced: every backup refuses its writes from the first
//! `BackupList{fence: true}` on). It
//! 1. orphans every tablet the dead server still owns, remembering the dead
//!    master per tablet (`lost_from`), in one transaction under a new map
//!    version: from then on `OpenTable`/`TableMap` answer `Retry` ("being
//!    recovered"), and enlistments never re-create these tablets empty;
//! 2. for every tablet lost from `dead`, round-robin over the live servers'
//!    shards (those holding the fewest tablets first, then shard 0 of each
//!    server first; one tablet at a time per shard, all shards in parallel): reserves a map version, sends
//!    `RecoverTablet` (the shard reads the replicas, replays them and holds
//!    the tablet `Receiving`), and on success commits the new owner under a
//!    new map version; then activates it for reads, and for writes once its
//!    replay is held by the new owner's backups (`recovery/finish.rs`), and
//!    only then deletes the tablet's `lost_from` row. A shard that fails is
//!    left for the next one;
//! 3. once no tablet is lost from `dead` any more, sends
//!    `BackupForget{master: dead}` to every live backup and removes the
//!    server from the metadata.
//!
//! Every step is idempotent and the state lives in redb, so the function may
//! be called again after an error or a coordinator restart: tablets already
//! committed to a live owner are only (re)activated, those still orphaned are
//! recovered again. With R = 0 no backup holds anything and each tablet comes
//! back empty, as before replication existed.
//!
//! Recoveries hold the move lock: a move must not commit a dead server as a
//! tablet's owner after its tablets were orphaned (that tablet would never be
//! recovered), and the reconciler must not act on a tablet half-recovered.
//!
//! Step 2 for one tablet on one shard (the `RecoverTablet` call, the owner's
//! commit) is `recovery/tablet.rs`, its activations `recovery/finish.rs`.

use std::collections::HashMap;

use anyhow::bail;
use futures::future::join_all;
use insitu_protocol::{Request, ServerState, Status};
use tracing::{info, warn};

use crate::model::{MAP_VERSION, Op, Tablet};
use crate::service::{Coordinator, Reject};
use crate::shards::CONTROL_TIMEOUT;

mod finish;
mod tablet;
use finish::finish;
pub(crate) use finish::finish_held;
use tablet::{Failed, recover_tablet};

/// What one `recover_server` call did.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecoverySummary {
    /// Tablets recovered from replicas (and activated) by this call.
    pub tablets: usize,
    /// Objects, segments and segment bytes those recoveries replayed.
    pub objects: u64,
    pub segments: u64,
    pub bytes: u64,
    /// Tablets recovered by an earlier call whose activations this call confirmed.
    pub activated: usize,
    /// Live backups that did not confirm `BackupForget` (they keep the dead
    /// master's replicas: disk space only, never read again).
    pub forget_failures: usize,
}

/// The `Retry` reply for a table whose tablet `index` is being recovered;
/// `note`: why it is not recovered yet (its last attempt's failure, or
/// what it waits for), if known.
pub(crate) fn being_recovered(
    index: usize,
    table: &str,
    master: u64,
    note: Option<&str>,
) -> Reject {
    let last = note.map(|n| format!(" ({n})")).unwrap_or_default();
    Reject::new(
        Status::Retry,
        format!(
            "tablet {index} of table {table:?} is being recovered from the replicas of dead server {master}{last}; try again shortly"
        ),
    )
}

/// Where tablets can be recovered and whose replicas can be read.
struct Targets {
    /// (server, shard, address) of every live shard: shard 0 of every
    /// server (by id), then shard 1, ...
    slots: Vec<(u64, u32, String)>,
    /// Backup service address of every live server that has one.
    backups: Vec<String>,
}

fn targets(coord: &Coordinator, dead: u64) -> Targets {
    let model = coord.model();
    let live: Vec<_> = model
        .server_infos()
        .into_iter()
        .filter(|s| s.id != dead && s.state == ServerState::Up)
        .collect();
    let mut slots: Vec<(u64, u32, String)> = model
        .placement_slots()
        .into_iter()
        .filter(|(server, _)| live.iter().any(|s| s.id == *server))
        .filter_map(|(server, shard)| {
            Some((server, shard, model.shard_addr(server, shard)?.to_string()))
        })
        .collect();
    // Shards holding the fewest tablets first (stable: shard 0 of each
    // server first among equals). Why: each dead server's tablets are dealt
    // from the first slot, so several recoveries in a row (a restarted
    // `insitu up` forgets all its servers) piled up on the same shards.
    let mut owned: HashMap<(u64, u32), usize> = HashMap::new();
    for t in model.tables.values().flat_map(|t| &t.tablets) {
        *owned.entry((t.server_id, t.shard)).or_default() += 1;
    }
    slots.sort_by_key(|(server, shard, _)| owned.get(&(*server, *shard)).copied().unwrap_or(0));
    let backups = live
        .into_iter()
        .filter(|s| !s.backup_addr.is_empty())
        .map(|s| s.backup_addr)
        .collect();
    Targets { slots, backups }
}

/// Recover every tablet of dead server `dead`; see the module docs.
#[cfg_attr(not(test), allow(dead_code))] // called by failure handling once it lands
pub(crate) async fn recover_server(
    coord: &Coordinator,
    dead: u64,
) -> anyhow::Result<RecoverySummary> {
    let _moves = coord.move_lock.lock().await;
    orphan_tablets_of(coord, dead).await?;
    let targets = targets(coord, dead);
    let pending: Vec<(u64, u32, Tablet)> = {
        let model = coord.model();
        model
            .lost_from
            .iter()
            .filter(|(_, master)| **master == dead)
            .filter_map(|(&(table, index), _)| {
                let t = model.tables.get(&table)?.tablets.get(index as usize)?;
                Some((table, index, t.clone()))
            })
            .collect()
    };
    if !pending.is_empty() {
        info!(
            server_id = dead,
            tablets = pending.len(),
            shards = targets.slots.len(),
            backups = targets.backups.len(),
            "recovering a dead server's tablets"
        );
    }
    // One queue per live shard, tablets dealt round-robin; the queues run in
    // parallel, each shard recovering one tablet of its queue at a time (so
    // the segment bytes a shard holds at once stay bounded). A tablet whose
    // shard fails is tried on the next shards in turn.
    let mut queues: Vec<Vec<(u64, u32, Tablet)>> = vec![Vec::new(); targets.slots.len().max(1)];
    let n = queues.len();
    for (i, p) in pending.into_iter().enumerate() {
        queues[i % n].push(p);
    }
    let done = join_all(
        queues
            .into_iter()
            .enumerate()
            .map(|(first, tablets)| recover_queue(coord, dead, &targets, first, tablets)),
    )
    .await;
    let mut summary = RecoverySummary::default();
    let mut left: Vec<String> = Vec::new();
    for (s, l) in done {
        summary.tablets += s.tablets;
        summary.objects += s.objects;
        summary.segments += s.segments;
        summary.bytes += s.bytes;
        summary.activated += s.activated;
        left.extend(l);
    }
    if !left.is_empty() {
        bail!(
            "recovery of server {dead} is incomplete ({} tablets left, they stay unavailable until it is retried): {}",
            left.len(),
            left.join(" | ")
        );
    }
    summary.forget_failures = forget_server(coord, dead, &targets.backups).await?;
    Ok(summary)
}

/// Recover `tablets` one after another, each first on slot `first`, then
/// on the following slots. Returns what was done and what is left (why).
///
/// A tablet is finished (`finish.rs`: reads, then writes once its replay is
/// held) before the next one is replayed on the queue's shards, so every
/// tablet serves reads from its commit on, not from when its replay is
/// held. Why not replay the next tablet meanwhile: measured on 2 cores
/// (BENCHMARKS.md, "Reads before the replay is held"), the next replay then
/// competes with the replication of the last one for the same cores: reads
/// came back later than this way, writes later still.
async fn recover_queue(
    coord: &Coordinator,
    dead: u64,
    targets: &Targets,
    first: usize,
    tablets: Vec<(u64, u32, Tablet)>,
) -> (RecoverySummary, Vec<String>) {
    let mut summary = RecoverySummary::default();
    let mut left = Vec::new();
    for (table, index, tablet) in tablets {
        if !tablet.is_orphaned() {
            // Committed by an earlier call; its activations were not confirmed.
            match finish(coord, dead, table, index, &tablet).await {
                Ok(()) => summary.activated += 1,
                Err((_, e)) => {
                    let note = format!("the last attempt failed: {e}");
                    coord.recovery_notes().insert((table, index), note);
                    left.push(format!("table {table} tablet {index}: {e}"));
                }
            }
            continue;
        }
        let mut errors = Vec::new();
        // None: recovered and finished, or taken by another change.
        let mut failed = Some(String::from("no live shard to recover it on"));
        for attempt in 0..targets.slots.len() {
            let slot = &targets.slots[(first + attempt) % targets.slots.len()];
            match recover_tablet(coord, dead, table, index, &tablet, slot, &targets.backups).await {
                Ok(((objects, segments, bytes), owned)) => {
                    // Committed: a failure to finish is left to the next
                    // round, which resumes from the tablet's row.
                    failed = match finish(coord, dead, table, index, &owned).await {
                        Ok(()) => {
                            summary.tablets += 1;
                            summary.objects += objects;
                            summary.segments += segments;
                            summary.bytes += bytes;
                            None
                        }
                        Err((_, e)) => Some(e),
                    };
                    break;
                }
                Err(Failed::Gone) => {
                    failed = None;
                    break;
                }
                Err(Failed::Shard(e)) => {
                    warn!(server_id = dead, table, index, shard = %slot.2,
                        "recovering a tablet failed on this shard; trying another: {e}");
                    errors.push(format!("{}: {e}", slot.2));
                    failed = Some(format!("every live shard failed ({})", errors.join("; ")));
                }
            }
        }
        match failed {
            None => {
                coord.recovery_notes().remove(&(table, index));
            }
            Some(e) => {
                let note = format!("the last attempt failed: {e}");
                coord.recovery_notes().insert((table, index), note);
                left.push(format!("table {table} tablet {index}: {e}"));
            }
        }
    }
    (summary, left)
}

/// Say why the tablets lost from `dead` wait (the note their `Retry`
/// carries) when no attempt is made: a note left by an earlier attempt
/// would name a cause that no longer holds.
pub(crate) fn note_waiting(coord: &Coordinator, dead: u64, why: &str) {
    let waiting: Vec<(u64, u32)> = {
        let model = coord.model();
        model
            .lost_from
            .iter()
            .filter(|&(_, &master)| master == dead)
            .map(|(&key, _)| key)
            .collect()
    };
    let mut notes = coord.recovery_notes();
    for key in waiting {
        notes.insert(key, why.to_string());
    }
}

/// Step 1: orphan every tablet `dead` owns and record it in `lost_from`, in
/// one transaction under a new map version.
async fn orphan_tablets_of(coord: &Coordinator, dead: u64) -> anyhow::Result<()> {
    let guard = coord.meta_lock.lock().await;
    let (ops, addrs) = {
        let model = coord.model();
        let version = model.map_version + 1;
        let mut ops = model.lose_tablets_ops(dead, version);
        if !ops.is_empty() {
            ops.push(Op::Counter(MAP_VERSION, version));
        }
        let addrs = model.servers.get(&dead).cloned().unwrap_or_default();
        (ops, addrs)
    };
    // A cached connection to the dead server's shards leads nowhere.
    for addr in &addrs {
        coord.shards.forget(addr);
    }
    if ops.is_empty() {
        return Ok(());
    }
    let tablets = ops
        .iter()
        .filter(|op| matches!(op, Op::PutTablet { .. }))
        .count();
    coord.commit(&guard, ops).await.map_err(|e| {
        anyhow::anyhow!("orphaning the tablets of dead server {dead}: {}", e.message)
    })?;
    info!(
        server_id = dead,
        tablets, "a dead server's tablets are unavailable until recovered from its replicas"
    );
    Ok(())
}

/// Step 3: every tablet of `dead` is recovered: its replicas may go, and so
/// may the server. Returns how many backups did not confirm the forget.
async fn forget_server(
    coord: &Coordinator,
    dead: u64,
    backups: &[String],
) -> anyhow::Result<usize> {
    let cluster = coord.model().cluster_id;
    let request = Request::BackupForget {
        cluster,
        master: dead,
    };
    let calls = backups.iter().map(|addr| {
        let request = &request;
        async move {
            let r = coord.shards.call(addr, request, CONTROL_TIMEOUT).await;
            if let Err(e) = &r {
                warn!(server_id = dead, backup = %addr,
                    "BackupForget failed; that backup keeps the dead server's replicas: {e}");
            }
            r.is_err()
        }
    });
    let failures = join_all(calls).await.into_iter().filter(|f| *f).count();
    let guard = coord.meta_lock.lock().await;
    let known = coord.model().servers.contains_key(&dead);
    if known {
        coord
            .commit(&guard, vec![Op::DeleteServer { id: dead }])
            .await
            .map_err(|e| anyhow::anyhow!("forgetting dead server {dead}: {}", e.message))?;
        info!(server_id = dead, "dead server recovered and forgotten");
    }
    Ok(failures)
}

impl Coordinator {
    /// Dead masters with tablets still to recover (or to activate): what a
    /// coordinator that starts must call `recover_server` for.
    #[allow(dead_code)] // called by failure handling once it lands
    pub(crate) fn masters_being_recovered(&self) -> Vec<u64> {
        let model = self.model();
        // A row naming the tablet's own owner is a recovered tablet whose
        // owner's replicas hold it, awaiting its writes
        // (`recovery/finish.rs`), not a master to recover from.
        let mut masters: Vec<u64> = model
            .lost_from
            .iter()
            .filter(|&(&(table, index), &master)| {
                let owner = model
                    .tables
                    .get(&table)
                    .and_then(|t| t.tablets.get(index as usize));
                !owner.is_some_and(|t| !t.is_orphaned() && t.server_id == master)
            })
            .map(|(_, &master)| master)
            .collect();
        masters.sort_unstable();
        masters.dedup();
        masters
    }
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
