//! The last steps of one recovered tablet, once its new owner is committed:
//! it serves reads first, writes once its replay is held by the owner's
//! backups and that is on record.
//!
//! Why two steps: about half of a tablet's recovery is the replication of its
//! rebuilt log to the new owner's backups. Reads need not wait for it (every
//! replayed entry is on the dead master's replicas); writes must, and they
//! must not be acknowledged while the coordinator would still recover the
//! tablet from the dead master's replicas alone. The stages, by the tablet's
//! `lost_from` row (redb):
//!
//! | row | owner's tablet | a recovery of the tablet reads |
//! |---|---|---|
//! | `dead` (orphaned) | none | the dead master's replicas |
//! | `dead` (owner committed) | `Receiving`, then reads only | the dead master's replicas |
//! | the owner | reads only, then reads and writes | the owner's replicas |
//! | none | reads and writes | the owner's replicas |
//!
//! 1. `ActivateTablet { writes: false }` on a connection of its own: the
//!    tablet serves reads, and the reply leaves once the owner's whole log,
//!    the replay included, is held by its backups.
//! 2. The row becomes the owner (`PutLostFrom`): the dead master's replicas
//!    are no longer needed for it (`forget_server` waits for no row naming
//!    the dead master).
//! 3. `ActivateTablet { writes: true }`: writes are taken.
//! 4. The row is deleted.
//!
//! Crash cases. The owner dies before step 2: no write was taken (writes
//! are refused until step 3), its replicas may hold part of the replay, and
//! `Model::lose_tablets_ops` keeps the row naming the dead master, so the
//! tablet is recovered from the dead master's replicas again. The owner
//! dies after step 2: its replicas hold the replay and every write it
//! acknowledged (a write's reply waits for the log up to it); the row
//! becomes its own, as for any dead server. The coordinator stops anywhere:
//! a row naming a dead master with its owner committed resumes at step 1
//! (`recover_queue`), a row naming a live owner at step 3 (`finish_held`,
//! each round of the recovery driver).

use insitu_protocol::Request;
use tracing::{info, warn};

use super::tablet::RECOVER_TIMEOUT;
use crate::model::{MAP_VERSION, Op, Tablet, orphan_op};
use crate::service::Coordinator;
use crate::shards::{CONTROL_TIMEOUT, CallError};

/// Finishing short of success: `(true, why)` when the owner refused (the
/// tablet is orphaned again, to be recovered anew); `(false, why)` when it
/// stays committed to its owner for the next round.
pub(super) type Unfinished = (bool, String);

/// Steps 1 to 4 for tablet `index` of `table`, recovered from `dead` and
/// committed as `owned`. Ok also when a change took the tablet meanwhile
/// (nothing left to do here).
pub(super) async fn finish(
    coord: &Coordinator,
    dead: u64,
    table: u64,
    index: u32,
    owned: &Tablet,
) -> Result<(), Unfinished> {
    let addr = owner_addr(coord, owned)?;
    let row = coord.model().lost_from.get(&(table, index)).copied();
    if row == Some(dead) && !reads_held(coord, dead, (table, index), owned, &addr).await? {
        return Ok(());
    }
    take_writes(coord, (table, index), owned, &addr).await
}

/// Step 3 and 4 for every tablet whose row names its live owner: what a
/// coordinator that stopped between step 2 and step 4 left. Returns whether
/// one failed (to be retried).
pub(crate) async fn finish_held(coord: &Coordinator) -> bool {
    let held: Vec<(u64, u32, Tablet)> = {
        let model = coord.model();
        model
            .lost_from
            .iter()
            .filter_map(|(&(table, index), &master)| {
                let t = model.tables.get(&table)?.tablets.get(index as usize)?;
                let own = !t.is_orphaned() && t.server_id == master && model.is_live(master);
                own.then(|| (table, index, t.clone()))
            })
            .collect()
    };
    if held.is_empty() {
        return false;
    }
    let _moves = coord.move_lock.lock().await;
    let mut failed = false;
    for (table, index, owned) in held {
        let done = match owner_addr(coord, &owned) {
            Ok(addr) => take_writes(coord, (table, index), &owned, &addr).await,
            Err(e) => Err(e),
        };
        if let Err((_, e)) = done {
            warn!(table, index, "a recovered tablet still refuses writes: {e}");
            failed = true;
        }
    }
    failed
}

/// The owner's shard address, or why it has none.
fn owner_addr(coord: &Coordinator, owned: &Tablet) -> Result<String, Unfinished> {
    coord
        .model()
        .shard_addr(owned.server_id, owned.shard)
        .map(str::to_string)
        .ok_or_else(|| {
            // Its new owner is gone too; that server's own recovery (or the
            // dead master's, by the row) takes it over.
            let why = format!(
                "its new owner, server {} shard {}, is no longer registered",
                owned.server_id, owned.shard
            );
            (false, why)
        })
}

/// Steps 1 and 2. Ok(false): the tablet was taken by another change
/// meanwhile (dropped, or orphaned by its owner's death): nothing left here.
async fn reads_held(
    coord: &Coordinator,
    dead: u64,
    (table, index): (u64, u32),
    owned: &Tablet,
    addr: &str,
) -> Result<bool, Unfinished> {
    // A tablet re-created empty (R = 0) is marked lost, with its version
    // floor, before it serves (`lost.rs`).
    let lost = coord.model().data_lost.get(&(table, index)).copied();
    let mut result = match lost {
        Some(master) => {
            coord
                .mark_lost_on(addr, table, owned.start_hash, master)
                .await
        }
        None => Ok(()),
    };
    if result.is_ok() {
        let request = Request::ActivateTablet {
            table,
            start_hash: owned.start_hash,
            map_version: owned.map_version,
            writes: false,
        };
        // A connection of its own: the reply waits for the replay's
        // replication, and the pool's connection serves other calls.
        result = coord
            .shards
            .call_alone(addr, &request, RECOVER_TIMEOUT)
            .await;
    }
    let guard = coord.meta_lock.lock().await;
    let (unchanged, version) = {
        let model = coord.model();
        let current = model
            .tables
            .get(&table)
            .and_then(|t| t.tablets.get(index as usize));
        let unchanged =
            current == Some(owned) && model.lost_from.get(&(table, index)) == Some(&dead);
        (unchanged, model.map_version + 1)
    };
    if !unchanged {
        return Ok(false);
    }
    match result {
        Ok(()) => {
            let op = Op::PutLostFrom {
                table,
                index,
                master: owned.server_id,
            };
            coord
                .commit(&guard, vec![op])
                .await
                .map_err(|e| (false, format!("recording the replay held: {}", e.message)))?;
            info!(
                server_id = dead,
                table,
                index,
                owner = owned.server_id,
                "a recovered tablet's replay is held by its new owner's backups"
            );
            Ok(true)
        }
        Err(CallError::Rejected(status, message)) => {
            let ops = vec![
                orphan_op(table, index, owned, version),
                Op::Counter(MAP_VERSION, version),
            ];
            coord
                .commit(&guard, ops)
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

/// Steps 3 and 4.
async fn take_writes(
    coord: &Coordinator,
    (table, index): (u64, u32),
    owned: &Tablet,
    addr: &str,
) -> Result<(), Unfinished> {
    let request = Request::ActivateTablet {
        table,
        start_hash: owned.start_hash,
        map_version: owned.map_version,
        writes: true,
    };
    let result = coord
        .call_with_retries(addr, &request, CONTROL_TIMEOUT)
        .await;
    let guard = coord.meta_lock.lock().await;
    let unchanged = {
        let model = coord.model();
        let current = model
            .tables
            .get(&table)
            .and_then(|t| t.tablets.get(index as usize));
        current == Some(owned) && model.lost_from.get(&(table, index)) == Some(&owned.server_id)
    };
    if !unchanged {
        return Ok(());
    }
    // A refusal says the owner no longer holds it: a restarted owner is
    // retired and its tablets recovered from its replicas (the row names
    // it), so the row is left for that.
    result.map_err(|e| (false, format!("activating writes on {addr}: {e}")))?;
    coord
        .commit(&guard, vec![Op::DeleteLostFrom { table, index }])
        .await
        .map_err(|e| (false, format!("recording the activation: {}", e.message)))
}
