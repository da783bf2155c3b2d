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
//!    new map version; then `ActivateTablet`, and only once that is
//!    confirmed deletes the tablet's `lost_from` row. A shard that fails is
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

use std::collections::HashMap;
use std::time::Duration;

use anyhow::bail;
use futures::future::join_all;
use insitu_client::rpc::RpcConn;
use insitu_protocol::{Request, Response, ServerState, Status};
use tracing::{info, warn};

use crate::model::{MAP_VERSION, Op, Tablet, orphan_op};
use crate::service::{Coordinator, Reject};
use crate::shards::{CONNECT_TIMEOUT, CONTROL_TIMEOUT, CallError};

/// A recovery reads and replays a whole tablet: give it time.
pub(crate) const RECOVER_TIMEOUT: Duration = Duration::from_secs(120);

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
    /// Tablets recovered by an earlier call whose activation this call confirmed.
    pub activated: usize,
    /// Live backups that did not confirm `BackupForget` (they keep the dead
    /// master's replicas: disk space only, never read again).
    pub forget_failures: usize,
}

/// The `Retry` reply for a table whose tablet `index` is being recovered;
/// `note`: why its last attempt failed, if one did.
pub(crate) fn being_recovered(
    index: usize,
    table: &str,
    master: u64,
    note: Option<&str>,
) -> Reject {
    let last = note
        .map(|n| format!(" (the last attempt failed: {n})"))
        .unwrap_or_default();
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

/// How recovering one tablet on one shard ended, short of success.
enum Failed {
    /// Try another shard.
    Shard(String),
    /// The tablet is no longer lost from this master (its table was dropped,
    /// or another change took it): nothing left to do for it.
    Gone,
    /// The new owner is committed but its activation is not confirmed: the
    /// next call retries it (never on another shard).
    NotActivated(String),
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
            // Committed by an earlier call; its activation was not confirmed.
            match activate(coord, dead, table, index, &tablet).await {
                Ok(()) => summary.activated += 1,
                Err((_, e)) => left.push(format!("table {table} tablet {index}: {e}")),
            }
            continue;
        }
        if targets.slots.is_empty() {
            left.push(format!(
                "table {table} tablet {index}: no live shard to recover it on"
            ));
            continue;
        }
        let mut errors = Vec::new();
        let mut done = false;
        for attempt in 0..targets.slots.len() {
            let slot = &targets.slots[(first + attempt) % targets.slots.len()];
            match recover_tablet(coord, dead, table, index, &tablet, slot, &targets.backups).await {
                Ok(r) => {
                    summary.tablets += 1;
                    summary.objects += r.0;
                    summary.segments += r.1;
                    summary.bytes += r.2;
                    done = true;
                    break;
                }
                Err(Failed::Gone) => {
                    done = true;
                    break;
                }
                Err(Failed::NotActivated(e)) => {
                    errors.push(format!("{}: {e}", slot.2));
                    break;
                }
                Err(Failed::Shard(e)) => {
                    warn!(server_id = dead, table, index, shard = %slot.2,
                        "recovering a tablet failed on this shard; trying another: {e}");
                    errors.push(format!("{}: {e}", slot.2));
                }
            }
        }
        if done {
            coord.recovery_notes().remove(&(table, index));
        } else {
            coord
                .recovery_notes()
                .insert((table, index), errors.join("; "));
            left.push(format!(
                "table {table} tablet {index}: every live shard failed ({})",
                errors.join("; ")
            ));
        }
    }
    (summary, left)
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

/// Recover one orphaned tablet on one shard, commit the owner, activate it.
/// Ok: (objects, segments, bytes).
async fn recover_tablet(
    coord: &Coordinator,
    dead: u64,
    table: u64,
    index: u32,
    tablet: &Tablet,
    (server, shard, addr): &(u64, u32, String),
    backups: &[String],
) -> Result<(u64, u64, u64), Failed> {
    // A version of its own for the shard's Receiving copy: never reused,
    // even if this coordinator restarts before committing anything else.
    let reserved = {
        let guard = coord.meta_lock.lock().await;
        let version = coord.model().map_version + 1;
        coord
            .commit(&guard, vec![Op::Counter(MAP_VERSION, version)])
            .await
            .map_err(|e| Failed::Shard(format!("reserving a map version: {}", e.message)))?;
        version
    };
    let request = Request::RecoverTablet {
        table,
        start_hash: tablet.start_hash,
        end_hash: tablet.end_hash,
        map_version: reserved,
        master: dead,
        backups: backups.to_vec(),
        // An operator gave up what no backup holds (`accept_loss`): the
        // tablet is recorded in `data_lost`, so it is marked lost below.
        accept_missing: coord.model().data_lost.contains_key(&(table, index)),
    };
    let recovered = match call_recover(coord, addr, &request).await {
        Ok(r) => r,
        Err(e) => {
            // It may have installed a Receiving copy (no reply, or a late
            // one): clear it; a later recovery there replaces it anyway.
            drop_leftover(coord, table, tablet.start_hash, addr).await;
            return Err(Failed::Shard(e));
        }
    };
    // Commit the new owner if the tablet is still lost from `dead` and the
    // shard's server still lives.
    let guard = coord.meta_lock.lock().await;
    let (current, version) = {
        let model = coord.model();
        let current = model
            .tables
            .get(&table)
            .and_then(|t| t.tablets.get(index as usize))
            .filter(|t| {
                t.is_orphaned()
                    && t.start_hash == tablet.start_hash
                    && t.end_hash == tablet.end_hash
                    && model.lost_from.get(&(table, index)) == Some(&dead)
            })
            .cloned();
        let alive = model.shard_addr(*server, *shard) == Some(addr.as_str());
        (current.filter(|_| alive), model.map_version + 1)
    };
    let Some(current) = current else {
        drop(guard);
        drop_leftover(coord, table, tablet.start_hash, addr).await;
        let still_lost = coord.model().lost_from.get(&(table, index)) == Some(&dead);
        return Err(if still_lost {
            Failed::Shard("its server is no longer registered".into())
        } else {
            Failed::Gone
        });
    };
    let owned = current.placed(*server, *shard, version);
    let ops = vec![
        Op::PutTablet {
            table,
            index,
            tablet: owned.clone(),
        },
        Op::Counter(MAP_VERSION, version),
    ];
    if let Err(e) = coord.commit(&guard, ops).await {
        drop(guard);
        drop_leftover(coord, table, tablet.start_hash, addr).await;
        return Err(Failed::Shard(format!(
            "committing the new owner: {}",
            e.message
        )));
    }
    drop(guard);
    info!(
        server_id = dead,
        table,
        index,
        to_server = server,
        to_shard = shard,
        map_version = version,
        objects = recovered.0,
        segments = recovered.1,
        bytes = recovered.2,
        "tablet recovered"
    );
    // The owner is committed: a failed activation is retried by the next
    // call (the tablet stays in `lost_from`), never recovered elsewhere.
    match activate(coord, dead, table, index, &owned).await {
        Ok(()) => Ok(recovered),
        Err((true, e)) => Err(Failed::Shard(format!(
            "activating the recovered tablet: {e}"
        ))),
        Err((false, e)) => Err(Failed::NotActivated(format!(
            "activating the recovered tablet: {e}"
        ))),
    }
}

/// `RecoverTablet` on a connection of its own (it takes long, and a shard
/// answers one connection's requests in order).
async fn call_recover(
    coord: &Coordinator,
    addr: &str,
    request: &Request<'_>,
) -> Result<(u64, u64, u64), String> {
    let conn = tokio::time::timeout(
        CONNECT_TIMEOUT,
        RpcConn::open(addr, coord.shards.credentials()),
    )
    .await
    .map_err(|_| format!("cannot connect to {addr}: timed out after {CONNECT_TIMEOUT:?}"))?
    .map_err(|e| e.to_string())?;
    let reply = conn
        .call_timeout(request, RECOVER_TIMEOUT)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    if !reply.status.is_ok() {
        return Err(format!(
            "refused: {}: {}",
            reply.status,
            reply.error_message()
        ));
    }
    match reply.decode() {
        Ok(Response::Recovered {
            objects,
            segments,
            bytes,
        }) => Ok((objects, segments, bytes)),
        Ok(other) => Err(format!("unexpected reply to RecoverTablet: {other:?}")),
        Err(e) => Err(format!("cannot decode the reply to RecoverTablet: {e}")),
    }
}

/// Best effort: drop a copy of the tablet that serves nothing on `addr`.
async fn drop_leftover(coord: &Coordinator, table: u64, start_hash: u64, addr: &str) {
    let request = Request::DropTablet {
        table,
        start_hash,
        only_if_not_serving: true,
    };
    if let Err(e) = coord.shards.call(addr, &request, CONTROL_TIMEOUT).await {
        warn!(
            table,
            start_hash, addr, "dropping a failed recovery's copy failed: {e}"
        );
    }
}

/// `ActivateTablet` on the committed owner, then delete the `lost_from` row.
/// A refusal (the shard does not hold the tablet) orphans it again, to be
/// recovered anew (error `(true, why)`); no reply leaves it committed for
/// the next call (`(false, why)`).
async fn activate(
    coord: &Coordinator,
    dead: u64,
    table: u64,
    index: u32,
    owned: &Tablet,
) -> Result<(), (bool, String)> {
    let addr = coord
        .model()
        .shard_addr(owned.server_id, owned.shard)
        .map(str::to_string);
    let Some(addr) = addr else {
        // Its new owner is gone too; that server's own recovery takes it over.
        return Err((
            false,
            format!(
                "its new owner, server {} shard {}, is no longer registered",
                owned.server_id, owned.shard
            ),
        ));
    };
    let request = Request::ActivateTablet {
        table,
        start_hash: owned.start_hash,
        map_version: owned.map_version,
    };
    // A tablet re-created empty (R = 0) is marked lost, with its version
    // floor, before it serves (`lost.rs`).
    let lost = coord.model().data_lost.get(&(table, index)).copied();
    let mut result = match lost {
        Some(master) => {
            coord
                .mark_lost_on(&addr, table, owned.start_hash, master)
                .await
        }
        None => Ok(()),
    };
    if result.is_ok() {
        result = coord
            .call_with_retries(&addr, &request, CONTROL_TIMEOUT)
            .await;
    }
    let guard = coord.meta_lock.lock().await;
    let (unchanged, version) = {
        let model = coord.model();
        let current = model
            .tables
            .get(&table)
            .and_then(|t| t.tablets.get(index as usize));
        (
            current == Some(owned) && model.lost_from.get(&(table, index)) == Some(&dead),
            model.map_version + 1,
        )
    };
    if !unchanged {
        return Ok(()); // dropped, or taken over by another change: nothing left here
    }
    match result {
        Ok(()) => coord
            .commit(&guard, vec![Op::DeleteLostFrom { table, index }])
            .await
            .map_err(|e| (false, format!("recording the activation: {}", e.message))),
        Err(CallError::Rejected(status, message)) => {
            coord
                .commit(
                    &guard,
                    vec![
                        orphan_op(table, index, owned, version),
                        Op::Counter(MAP_VERSION, version),
                    ],
                )
                .await
                .map_err(|e| (false, format!("orphaning it again: {}", e.message)))?;
            Err((
                true,
                format!(
                    "{addr} refused to activate it ({status}: {message}); it is orphaned again, to be recovered anew"
                ),
            ))
        }
        Err(CallError::Transport(e)) => Err((false, format!("no reply from {addr}: {e}"))),
    }
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
        let mut masters: Vec<u64> = self.model().lost_from.values().copied().collect();
        masters.sort_unstable();
        masters.dedup();
        masters
    }
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;
