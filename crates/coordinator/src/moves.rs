//! Moving a tablet between servers (`MoveTablet`), and undoing a move that
//! failed half-way.

use insitu_protocol::{Request, Response, Status, TabletState};
use tracing::{error, info, warn};

use crate::model::{MAP_VERSION, ORPHANED, Op, Tablet};
use crate::service::{Coordinator, Reject, Reply, no_live_server, unknown_table};
use crate::shards::{CONTROL_TIMEOUT, CallError, MIGRATE_TIMEOUT};

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
            if old.is_orphaned() {
                return Err(no_live_server(index as usize, &table_name));
            }
            if !model.servers.contains_key(&dest_server) {
                return Err(Reject::new(
                    Status::UnknownServer,
                    format!("no server with id {dest_server} has enlisted"),
                ));
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

        // (1) The destination prepares an empty, not-yet-serving copy.
        let receive = Request::TakeTablet {
            table,
            start_hash,
            end_hash: old.end_hash,
            map_version: old.map_version,
            state: TabletState::Receiving,
        };
        if let Err(e) = self
            .shards
            .call(&dest_addr, &receive, CONTROL_TIMEOUT)
            .await
        {
            // Whatever the destination did, it does not own this tablet: clear it.
            self.drop_tablets(table, std::iter::once((start_hash, dest_addr.as_str())))
                .await;
            warn!(table = %table_name, index, "move aborted: destination {dest_addr} did not take the tablet: {e}");
            return Err(Reject::internal(format!(
                "move aborted: the destination shard {dest_addr} did not take the tablet: {e}"
            )));
        }

        // (2) The source freezes writes and streams the objects; it replies when
        // the destination holds them all.
        let migrate = Request::MigrateTablet {
            table,
            start_hash,
            dest_addr: dest_addr.clone(),
        };
        if let Err(e) = self.shards.call(&src_addr, &migrate, MIGRATE_TIMEOUT).await {
            warn!(table = %table_name, index, "move aborted: migration from {src_addr} to {dest_addr} failed: {e}");
            self.abort_move(table, &old, &src_addr, &dest_addr).await;
            return Err(Reject::internal(format!(
                "move aborted: migrating the tablet from {src_addr} to {dest_addr} failed: {e}"
            )));
        }

        // (3) Record the new owner under a new map version.
        let guard = self.meta_lock.lock().await;
        let (still_there, dest_alive, version) = {
            let model = self.model();
            let current = model
                .tables
                .get(&table)
                .and_then(|t| t.tablets.get(index as usize));
            (
                current == Some(&old),
                model.shard_addr(dest_server, dest_shard) == Some(dest_addr.as_str()),
                model.map_version + 1,
            )
        };
        if !still_there {
            drop(guard);
            // Moves are serialized, so only a drop of the table or the
            // retirement of the source server changes it under us; either way
            // the source's copy is not to be served again.
            self.drop_tablets(table, std::iter::once((start_hash, dest_addr.as_str())))
                .await;
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
            self.abort_move(table, &old, &src_addr, &dest_addr).await;
            return Err(Reject::internal(format!(
                "move abandoned: the destination server {dest_server} was retired during the move"
            )));
        }
        let moved = Tablet {
            server_id: dest_server,
            shard: dest_shard,
            map_version: version,
            ..old.clone()
        };
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
                ],
            )
            .await
        {
            drop(guard);
            self.abort_move(table, &old, &src_addr, &dest_addr).await;
            return Err(e);
        }
        drop(guard);

        // (4) The destination starts serving under the new version.
        let activate = Request::ActivateTablet {
            table,
            start_hash,
            map_version: version,
        };
        if let Err(e) = self
            .call_with_retries(&dest_addr, &activate, CONTROL_TIMEOUT)
            .await
        {
            error!(table = %table_name, index, "ActivateTablet on {dest_addr} failed after the owner changed: {e}");
            return Err(self
                .activation_failed(
                    table,
                    &table_name,
                    index,
                    &old,
                    &src_addr,
                    &dest_addr,
                    version,
                    e,
                )
                .await);
        }

        // (5) The source forgets its (frozen) copy.
        let drop_source = Request::DropTablet { table, start_hash };
        if let Err(e) = self
            .call_with_retries(&src_addr, &drop_source, CONTROL_TIMEOUT)
            .await
        {
            warn!(table = %table_name, index, "the tablet moved, but DropTablet on the old owner {src_addr} failed: {e}");
        }
        info!(table = %table_name, table_id = table, index, to_server = dest_server, to_shard = dest_shard, map_version = version, "tablet moved");
        self.model()
            .table_info(table)
            .map(Response::Table)
            .ok_or_else(|| unknown_table(&table_name))
    }

    /// Undo steps (1)-(2): drop the destination's copy, let the source serve
    /// again (TakeTablet Active with its unchanged map version).
    pub(crate) async fn abort_move(
        &self,
        table: u64,
        old: &Tablet,
        src_addr: &str,
        dest_addr: &str,
    ) {
        self.drop_tablets(table, std::iter::once((old.start_hash, dest_addr)))
            .await;
        let unfreeze = Request::TakeTablet {
            table,
            start_hash: old.start_hash,
            end_hash: old.end_hash,
            map_version: old.map_version,
            state: TabletState::Active,
        };
        if let Err(e) = self
            .call_with_retries(src_addr, &unfreeze, CONTROL_TIMEOUT)
            .await
        {
            error!(
                table,
                start_hash = old.start_hash,
                "cannot un-freeze the tablet on {src_addr} after an aborted move: {e}"
            );
        }
    }

    /// Step (4) failed after the map already names the destination.
    ///
    /// If the destination positively refused, it never served the tablet, so no
    /// write reached it: the source's frozen copy is complete, and the tablet
    /// goes back to the source under a newer version. If the outcome is unknown
    /// (no reply), the destination may have accepted writes, so nothing is
    /// dropped anywhere: the map keeps naming the destination, the source keeps
    /// its frozen copy, and the operator is told.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn activation_failed(
        &self,
        table: u64,
        table_name: &str,
        index: u32,
        old: &Tablet,
        src_addr: &str,
        dest_addr: &str,
        moved_version: u64,
        e: CallError,
    ) -> Reject {
        if matches!(e, CallError::Transport(_)) {
            return Reject::internal(format!(
                "the tablet's map entry names {dest_addr}, but activating it there failed ({e}); \
                 the old owner {src_addr} keeps a frozen copy until this is resolved"
            ));
        }
        let guard = self.meta_lock.lock().await;
        let (unchanged, source_alive, version) = {
            let model = self.model();
            let current = model
                .tables
                .get(&table)
                .and_then(|t| t.tablets.get(index as usize));
            (
                current.map(|t| t.map_version) == Some(moved_version),
                model.shard_addr(old.server_id, old.shard) == Some(src_addr),
                model.map_version + 1,
            )
        };
        if !unchanged {
            return Reject::internal(format!(
                "activating the tablet on {dest_addr} failed ({e}) and the table changed meanwhile"
            ));
        }
        if !source_alive {
            // The source was retired meanwhile (its process is gone, and its
            // copy with it): nobody holds the objects any more. Orphan the
            // tablet; the next server to enlist gets it, empty.
            let orphan = Tablet {
                server_id: ORPHANED,
                shard: 0,
                map_version: version,
                ..old.clone()
            };
            let committed = self
                .commit(
                    &guard,
                    vec![
                        Op::PutTablet {
                            table,
                            index,
                            tablet: orphan,
                        },
                        Op::Counter(MAP_VERSION, version),
                    ],
                )
                .await;
            drop(guard);
            if let Err(commit) = committed {
                return Reject::internal(format!(
                    "activating the tablet on {dest_addr} failed ({e}), its source server was retired, and orphaning it failed: {}",
                    commit.message
                ));
            }
            self.drop_tablets(table, std::iter::once((old.start_hash, dest_addr)))
                .await;
            warn!(table = %table_name, index, "move failed and its source server was retired meanwhile: the tablet is orphaned");
            return Reject::internal(format!(
                "the destination {dest_addr} refused to activate the tablet ({e}) and the source server {} was retired meanwhile; the tablet is re-created empty when a server enlists",
                old.server_id
            ));
        }
        let back = Tablet {
            map_version: version,
            ..old.clone()
        };
        if let Err(commit) = self
            .commit(
                &guard,
                vec![
                    Op::PutTablet {
                        table,
                        index,
                        tablet: back,
                    },
                    Op::Counter(MAP_VERSION, version),
                ],
            )
            .await
        {
            return Reject::internal(format!(
                "activating the tablet on {dest_addr} failed ({e}); rolling back failed too: {}",
                commit.message
            ));
        }
        drop(guard);
        let unfreeze = Request::TakeTablet {
            table,
            start_hash: old.start_hash,
            end_hash: old.end_hash,
            map_version: version,
            state: TabletState::Active,
        };
        if let Err(e2) = self
            .call_with_retries(src_addr, &unfreeze, CONTROL_TIMEOUT)
            .await
        {
            error!(table = %table_name, index, "cannot re-activate the tablet on {src_addr} after a failed move: {e2}");
        }
        self.drop_tablets(table, std::iter::once((old.start_hash, dest_addr)))
            .await;
        warn!(table = %table_name, index, map_version = version, "move rolled back: the destination refused to activate");
        Reject::internal(format!(
            "move rolled back: the destination {dest_addr} refused to activate the tablet: {e}"
        ))
    }
}
