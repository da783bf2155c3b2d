//! Moving a tablet between servers (`MoveTablet`). Finishing or undoing a
//! move that stopped half-way is in `reconcile.rs`.

use insitu_protocol::{Request, Response, Status, TabletState};
use tracing::{error, info, warn};

use crate::model::{MAP_VERSION, MoveRecord, Op};
use crate::reconcile::Finish;
use crate::service::{Coordinator, Reject, Reply, no_live_server, unknown_table};
use crate::shards::{CONTROL_TIMEOUT, MIGRATE_TIMEOUT};

impl Coordinator {
    /// Move one tablet to another server. See the crate docs for the protocol.
    pub(crate) async fn move_tablet(
        &self,
        table_name: String,
        index: u32,
        dest_server: u64,
    ) -> Reply {
        let _move_guard = self.move_lock.lock().await;

        // Plan from a snapshot of the model; re-checked before committing.
        let (table, old, src_addr, dest_shard, dest_addr) = {
            let model = self.model();
            let id = *model
                .by_name
                .get(&table_name)
                .ok_or_else(|| unknown_table(&table_name))?;
            let table = model
                .tables
                .get(&id)
                .ok_or_else(|| unknown_table(&table_name))?;
            let old = table.tablets.get(index as usize).cloned().ok_or_else(|| {
                Reject::bad(format!(
                    "table {table_name:?} has {} tablets (indexes 0..={}); there is no tablet {index}",
                    table.tablets.len(),
                    table.tablets.len().saturating_sub(1)
                ))
            })?;
            if old.is_orphaned() || !model.is_live(old.server_id) {
                return Err(no_live_server(index as usize, &table_name));
            }
            crate::lost::refuse_lost_move(&model, id, index, &table_name)?;
            if model.moves.contains_key(&(id, index)) {
                return Err(Reject::new(
                    Status::Retry,
                    format!(
                        "an earlier move of tablet {index} of table {table_name:?} is still being finished or undone; try again shortly"
                    ),
                ));
            }
            if !model.is_live(dest_server) {
                let why = if model.servers.contains_key(&dest_server) {
                    format!("server {dest_server} is dead")
                } else {
                    format!(
                        "no server with id {dest_server} is on record: never enlisted, or dead and forgotten once its tablets were recovered (`insitu status` lists the servers)"
                    )
                };
                return Err(Reject::new(Status::UnknownServer, why));
            }
            if old.server_id == dest_server {
                return model
                    .table_info(id)
                    .map(Response::Table)
                    .ok_or_else(|| unknown_table(&table_name));
            }
            let loads = model.shard_loads(dest_server);
            let dest_shard = loads
                .iter()
                .enumerate()
                .min_by_key(|(_, load)| **load)
                .map(|(s, _)| s as u32)
                .unwrap_or(0);
            let src_addr = model
                .shard_addr(old.server_id, old.shard)
                .ok_or_else(|| {
                    Reject::internal(format!(
                        "the tablet's owner, server {} shard {}, is unknown",
                        old.server_id, old.shard
                    ))
                })?
                .to_string();
            let dest_addr = model
                .shard_addr(dest_server, dest_shard)
                .ok_or_else(|| {
                    Reject::internal(format!("server {dest_server} has no shard {dest_shard}"))
                })?
                .to_string();
            if src_addr == dest_addr {
                return Err(Reject::bad(format!(
                    "server {dest_server} shard {dest_shard} has the same address ({dest_addr}) as the tablet's current owner, server {} shard {}",
                    old.server_id, old.shard
                )));
            }
            (id, old, src_addr, dest_shard, dest_addr)
        };
        let start_hash = old.start_hash;
        info!(table = %table_name, table_id = table, index, from_server = old.server_id, from_shard = old.shard,
            to_server = dest_server, to_shard = dest_shard, "moving tablet");

        // (0) Record the move before its first step, so a coordinator that
        // stops anywhere below finishes or undoes it when it starts again.
        let mut record = MoveRecord {
            old: old.clone(),
            dest_server,
            dest_shard,
            committed_version: 0,
        };
        {
            let guard = self.meta_lock.lock().await;
            self.commit(
                &guard,
                vec![Op::PutMove {
                    table,
                    index,
                    record: record.clone(),
                }],
            )
            .await?;
        }

        // (1) The destination prepares an empty, not-yet-serving copy that
        // accepts only this attempt's batches (`migration`). Not recorded: a
        // restarted coordinator never resumes a copy, it undoes or finishes
        // the move, so the id only has to differ from every other attempt's.
        let migration = move_id(table, index);
        let receive = Request::TakeTablet {
            table,
            start_hash,
            end_hash: old.end_hash,
            map_version: old.map_version,
            state: TabletState::Receiving,
            migration,
        };
        if let Err(e) = self
            .shards
            .call(&dest_addr, &receive, CONTROL_TIMEOUT)
            .await
        {
            warn!(table = %table_name, index, "move aborted: destination {dest_addr} did not take the tablet: {e}");
            return Err(self
                .aborted(
                    table,
                    index,
                    &record,
                    format!("the destination shard {dest_addr} did not take the tablet: {e}"),
                )
                .await);
        }

        // (2) The source freezes writes and streams the objects; it replies when
        // the destination holds them all, and from then on answers nothing
        // for this tablet (it is "moved out"). On its own connection, so that
        // an abort or any other control request is never queued behind it.
        let migrate = Request::MigrateTablet {
            table,
            start_hash,
            dest_addr: dest_addr.clone(),
            migration,
        };
        if let Err(e) = self
            .shards
            .call_alone(&src_addr, &migrate, MIGRATE_TIMEOUT)
            .await
        {
            warn!(table = %table_name, index, "move aborted: migration from {src_addr} to {dest_addr} failed: {e}");
            return Err(self
                .aborted(
                    table,
                    index,
                    &record,
                    format!("migrating the tablet from {src_addr} to {dest_addr} failed: {e}"),
                )
                .await);
        }

        // (3) Record the new owner under a new map version, and the move as
        // committed (a restart now finishes it), in one transaction.
        let guard = self.meta_lock.lock().await;
        let (still_there, dest_alive, version) = {
            let model = self.model();
            let current = model
                .tables
                .get(&table)
                .and_then(|t| t.tablets.get(index as usize));
            (
                // A dead source's tablet is recovered instead (see death.rs).
                current == Some(&old) && model.is_live(old.server_id),
                model.shard_addr(dest_server, dest_shard) == Some(dest_addr.as_str()),
                model.map_version + 1,
            )
        };
        if !still_there {
            drop(guard);
            // Moves are serialized, so only a drop of the table or the
            // death of the source server changes it under us; either way
            // the source's copy is not to be served again.
            self.drop_tablets(table, std::iter::once((start_hash, dest_addr.as_str())))
                .await;
            if let Err(e) = self.forget_move(table, index).await {
                warn!(table = %table_name, index, "{e}; the reconciler retries");
                self.reconcile_wake.notify_one();
            }
            warn!(table = %table_name, index, "move abandoned: the table was dropped or its server retired meanwhile");
            return Err(if self.model().tables.contains_key(&table) {
                Reject::internal(format!(
                    "move abandoned: the server of tablet {index} of table {table_name:?} was retired during the move"
                ))
            } else {
                Reject::new(
                    Status::UnknownTable,
                    format!("table {table_name:?} was dropped during the move"),
                )
            });
        }
        if !dest_alive {
            drop(guard);
            // The destination server was retired meanwhile (a new process
            // enlisted on its address): the source keeps the tablet.
            warn!(table = %table_name, index, "move abandoned: the destination server was retired meanwhile");
            return Err(self
                .aborted(
                    table,
                    index,
                    &record,
                    format!("the destination server {dest_server} was retired during the move"),
                )
                .await);
        }
        let moved = old.placed(dest_server, dest_shard, version);
        record.committed_version = version;
        if let Err(e) = self
            .commit(
                &guard,
                vec![
                    Op::PutTablet {
                        table,
                        index,
                        tablet: moved,
                    },
                    Op::Counter(MAP_VERSION, version),
                    Op::PutMove {
                        table,
                        index,
                        record: record.clone(),
                    },
                ],
            )
            .await
        {
            drop(guard);
            record.committed_version = 0;
            return Err(self
                .aborted(
                    table,
                    index,
                    &record,
                    format!("committing the new owner failed: {}", e.message),
                )
                .await);
        }
        drop(guard);

        // (4) The destination starts serving under the new version;
        // (5) the source forgets its moved-out copy.
        match self.finish_move(table, index, &record).await {
            Finish::Done => {
                info!(table = %table_name, table_id = table, index, to_server = dest_server, to_shard = dest_shard, map_version = version, "tablet moved");
            }
            Finish::SourceNotDropped(e) => {
                // The source answers nothing for the tablet any more (moved
                // out), so this only holds memory there until the retry.
                warn!(table = %table_name, index, "the tablet moved, but DropTablet on the old owner {src_addr} failed; retrying in the background: {e}");
                self.reconcile_wake.notify_one();
            }
            Finish::NotActivated(e) => {
                error!(table = %table_name, index, "ActivateTablet on {dest_addr} is not confirmed after the owner changed; retrying in the background: {e}");
                self.reconcile_wake.notify_one();
                return Err(Reject::internal(format!(
                    "the move is committed (the map names {dest_addr}), but activating the tablet there is not confirmed yet ({e}); \
                     the coordinator keeps retrying in the background: check `insitu status`"
                )));
            }
            Finish::RolledBack(reject) => return Err(reject),
        }
        self.model()
            .table_info(table)
            .map(Response::Table)
            .ok_or_else(|| unknown_table(&table_name))
    }

    /// A step before the commit failed: undo the move (the source serves
    /// again, the destination's copy is dropped) and build the reply. If the
    /// undo cannot complete now, the reconciler keeps at it, and the reply
    /// says so.
    async fn aborted(&self, table: u64, index: u32, record: &MoveRecord, why: String) -> Reject {
        match self.undo_move(table, index, record).await {
            Ok(()) => Reject::internal(format!("move aborted: {why}")),
            Err(e) => {
                self.reconcile_wake.notify_one();
                Reject::internal(format!(
                    "move aborted: {why}; undoing it is not complete yet ({e}), the coordinator keeps retrying in the background"
                ))
            }
        }
    }
}

/// A fresh id for one move attempt: random (the process's hasher keys are
/// random and each `RandomState` differs), nonzero, so two attempts, even by
/// coordinators before and after a restart, collide with odds of 2^-64.
fn move_id(table: u64, index: u32) -> u64 {
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now();
    std::collections::hash_map::RandomState::new().hash_one((table, index, now)) | 1
}
