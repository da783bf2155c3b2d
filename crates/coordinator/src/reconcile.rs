//! Finishing or undoing a tablet move that stopped half-way.
//!
//! Every move is recorded in redb (`Op::PutMove`) before its first step. A
//! record with `committed_version == 0` means the map still names the source:
//! the move is *undone* (the source serves again with `TakeTablet{Active}`, the
//! destination's copy is dropped). A committed record means the map names the
//! destination: the move is *finished* (`ActivateTablet` on the destination,
//! `DropTablet` on the source). Each step is idempotent on the shard, so it is
//! safe to repeat after a restart; the record is deleted only when every step
//! is confirmed. The move itself runs these, and the reconciler task (started
//! with the coordinator, woken when a move leaves a record behind) retries
//! them with back-off until they succeed or the servers involved are retired.

use std::sync::Arc;
use std::time::Duration;

use insitu_protocol::{Request, TabletState};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::model::{MAP_VERSION, MoveRecord, ORPHANED, Op, Tablet};
use crate::service::{Coordinator, Reject};
use crate::shards::{CONTROL_TIMEOUT, CallError};

/// First pause of the reconciler after a round that left records behind.
const FIRST_RETRY: Duration = Duration::from_millis(200);
/// Longest pause between reconciler rounds.
const MAX_RETRY: Duration = Duration::from_secs(10);

/// How far `finish_move` got.
pub(crate) enum Finish {
    /// Activated on the destination, dropped on the source, record deleted.
    Done,
    /// Activated; dropping the source's (moved-out, silent) copy or deleting
    /// the record is not confirmed yet.
    SourceNotDropped(String),
    /// No reply from the destination to `ActivateTablet`: it may or may not
    /// serve; the map names it, the source stays moved out.
    NotActivated(String),
    /// The destination refused to activate: the tablet went back to the
    /// source (or was orphaned); the reply for the operator.
    RolledBack(Reject),
}

impl Coordinator {
    /// Undo an uncommitted move: the source serves again (if the map still
    /// names it as `record.old`), the destination's copy is dropped (if the
    /// destination is still registered), then the record is deleted.
    pub(crate) async fn undo_move(
        &self,
        table: u64,
        index: u32,
        record: &MoveRecord,
    ) -> Result<(), String> {
        assert_eq!(record.committed_version, 0, "undo of a committed move");
        let (src_addr, dest_addr) = {
            let model = self.model();
            let current = model
                .tables
                .get(&table)
                .and_then(|t| t.tablets.get(index as usize));
            let src = (current == Some(&record.old))
                .then(|| model.shard_addr(record.old.server_id, record.old.shard))
                .flatten()
                .map(str::to_string);
            // Unless the destination shard owns the tablet by now (e.g. it
            // was re-homed there), its copy is a leftover of this move.
            let dest_owns = current
                .is_some_and(|t| (t.server_id, t.shard) == (record.dest_server, record.dest_shard));
            let dest = (!dest_owns)
                .then(|| model.shard_addr(record.dest_server, record.dest_shard))
                .flatten()
                .map(str::to_string);
            (src, dest)
        };
        // The source first: serving again is what matters to clients, and it
        // is safe before the destination's copy is gone, because an
        // uncommitted destination is never activated.
        if let Some(src) = &src_addr {
            let unfreeze = Request::TakeTablet {
                table,
                start_hash: record.old.start_hash,
                end_hash: record.old.end_hash,
                map_version: record.old.map_version,
                state: TabletState::Active,
                migration: 0,
            };
            self.call_with_retries(src, &unfreeze, CONTROL_TIMEOUT)
                .await
                .map_err(|e| format!("cannot make the source {src} serve the tablet again: {e}"))?;
        }
        if let Some(dest) = dest_addr
            .as_deref()
            .filter(|d| Some(*d) != src_addr.as_deref())
        {
            let drop_copy = Request::DropTablet {
                table,
                start_hash: record.old.start_hash,
                only_if_not_serving: true,
            };
            self.call_with_retries(dest, &drop_copy, CONTROL_TIMEOUT)
                .await
                .map_err(|e| format!("cannot drop the copy on the destination {dest}: {e}"))?;
        }
        self.forget_move(table, index).await
    }

    /// Finish a committed move: activate the destination (if the map still
    /// names it at `record.committed_version`), drop the source's copy (if the
    /// source is still registered), delete the record.
    pub(crate) async fn finish_move(&self, table: u64, index: u32, record: &MoveRecord) -> Finish {
        assert_ne!(record.committed_version, 0, "finish of an uncommitted move");
        let (dest_addr, src_addr) = {
            let model = self.model();
            let current = model
                .tables
                .get(&table)
                .and_then(|t| t.tablets.get(index as usize));
            let dest_owns = current.is_some_and(|t| {
                t.server_id == record.dest_server
                    && t.shard == record.dest_shard
                    && t.map_version == record.committed_version
            });
            let dest = dest_owns
                .then(|| model.shard_addr(record.dest_server, record.dest_shard))
                .flatten()
                .map(str::to_string);
            // Unless the source shard owns the tablet again (e.g. re-homed
            // there after the destination died), its copy is moved out.
            let src_owns = current.is_some_and(|t| {
                (t.server_id, t.shard) == (record.old.server_id, record.old.shard)
            });
            let src = (!src_owns)
                .then(|| model.shard_addr(record.old.server_id, record.old.shard))
                .flatten()
                .map(str::to_string);
            (dest, src)
        };
        if let Some(dest) = &dest_addr {
            let activate = Request::ActivateTablet {
                table,
                start_hash: record.old.start_hash,
                map_version: record.committed_version,
                writes: true,
            };
            match self
                .call_with_retries(dest, &activate, CONTROL_TIMEOUT)
                .await
            {
                Ok(()) => {}
                Err(e @ CallError::Transport(_)) => return Finish::NotActivated(e.to_string()),
                Err(e @ CallError::Rejected(..)) => {
                    return Finish::RolledBack(
                        self.activation_refused(table, index, record, dest, e).await,
                    );
                }
            }
        }
        if let Some(src) = src_addr
            .as_deref()
            .filter(|s| Some(*s) != dest_addr.as_deref())
        {
            let drop_source = Request::DropTablet {
                table,
                start_hash: record.old.start_hash,
                only_if_not_serving: true,
            };
            if let Err(e) = self
                .call_with_retries(src, &drop_source, CONTROL_TIMEOUT)
                .await
            {
                return Finish::SourceNotDropped(format!("DropTablet on {src}: {e}"));
            }
        }
        match self.forget_move(table, index).await {
            Ok(()) => Finish::Done,
            Err(e) => Finish::SourceNotDropped(e),
        }
    }

    /// Delete the move record of tablet `index` of `table`, if any.
    pub(crate) async fn forget_move(&self, table: u64, index: u32) -> Result<(), String> {
        let guard = self.meta_lock.lock().await;
        if !self.model().moves.contains_key(&(table, index)) {
            return Ok(());
        }
        self.commit(&guard, vec![Op::DeleteMove { table, index }])
            .await
            .map_err(|e| format!("cannot delete the move record: {}", e.message))
    }

    /// The destination refused `ActivateTablet` after the map named it.
    ///
    /// A refusal means it never served the tablet, so no write reached it:
    /// the source's moved-out copy is complete, and the tablet goes back to
    /// the source under a newer version (recorded as a new, uncommitted move
    /// and undone: the source serves again, the destination's copy is
    /// dropped). If the source server was retired meanwhile, nobody holds the
    /// objects: the tablet is orphaned (re-created empty at the next enlist).
    async fn activation_refused(
        &self,
        table: u64,
        index: u32,
        record: &MoveRecord,
        dest_addr: &str,
        e: CallError,
    ) -> Reject {
        let guard = self.meta_lock.lock().await;
        let (unchanged, source_alive, version) = {
            let model = self.model();
            let current = model
                .tables
                .get(&table)
                .and_then(|t| t.tablets.get(index as usize));
            (
                current.map(|t| t.map_version) == Some(record.committed_version),
                model
                    .shard_addr(record.old.server_id, record.old.shard)
                    .is_some(),
                model.map_version + 1,
            )
        };
        if !unchanged {
            drop(guard);
            let _ = self.forget_move(table, index).await;
            return Reject::internal(format!(
                "activating the tablet on {dest_addr} failed ({e}) and the table changed meanwhile"
            ));
        }
        let back = Tablet {
            map_version: version,
            ..record.old.clone()
        };
        let (owner, undo) = if source_alive {
            let undo = MoveRecord {
                old: back.clone(),
                committed_version: 0,
                ..record.clone()
            };
            (back, Some(undo))
        } else {
            let orphan = Tablet {
                server_id: ORPHANED,
                shard: 0,
                ..back
            };
            (orphan, None)
        };
        let mut ops = vec![
            Op::PutTablet {
                table,
                index,
                tablet: owner,
            },
            Op::Counter(MAP_VERSION, version),
        ];
        ops.push(match &undo {
            Some(r) => Op::PutMove {
                table,
                index,
                record: r.clone(),
            },
            None => Op::DeleteMove { table, index },
        });
        let committed = self.commit(&guard, ops).await;
        drop(guard);
        if let Err(commit) = committed {
            // The record still says "committed": the reconciler tries again.
            return Reject::internal(format!(
                "activating the tablet on {dest_addr} failed ({e}); rolling back failed too: {}",
                commit.message
            ));
        }
        let Some(undo) = undo else {
            self.drop_tablets(table, std::iter::once((record.old.start_hash, dest_addr)))
                .await;
            warn!(
                table,
                index,
                "move failed and its source server was retired meanwhile: the tablet is orphaned"
            );
            return Reject::internal(format!(
                "the destination {dest_addr} refused to activate the tablet ({e}) and the source server {} was retired meanwhile; the tablet is re-created empty when a server enlists",
                record.old.server_id
            ));
        };
        if let Err(e2) = self.undo_move(table, index, &undo).await {
            self.reconcile_wake.notify_one();
            warn!(
                table,
                index, "rolling back a refused activation is not complete yet: {e2}"
            );
        }
        warn!(
            table,
            index,
            map_version = version,
            "move rolled back: the destination refused to activate"
        );
        Reject::internal(format!(
            "move rolled back: the destination {dest_addr} refused to activate the tablet: {e}"
        ))
    }

    /// One round over every recorded move (with the move lock, so never
    /// under a move in progress). Returns how many records remain.
    pub(crate) async fn reconcile_moves(&self) -> usize {
        let _move_guard = self.move_lock.lock().await;
        let records: Vec<((u64, u32), MoveRecord)> = self
            .model()
            .moves
            .iter()
            .map(|(k, r)| (*k, r.clone()))
            .collect();
        let mut left = 0;
        for ((table, index), record) in records {
            let outcome = if record.committed_version == 0 {
                self.undo_move(table, index, &record).await.err()
            } else {
                match self.finish_move(table, index, &record).await {
                    Finish::Done | Finish::RolledBack(_) => None,
                    Finish::SourceNotDropped(e) | Finish::NotActivated(e) => Some(e),
                }
            };
            match outcome {
                None => info!(
                    table,
                    index,
                    committed = record.committed_version != 0,
                    "interrupted tablet move reconciled"
                ),
                Some(e) => {
                    left += 1;
                    warn!(
                        table,
                        index, "interrupted tablet move not reconciled yet, will retry: {e}"
                    );
                }
            }
        }
        left
    }
}

/// The reconciler: a round at start, then whenever woken, and again with
/// back-off while records remain; ends with `shutdown`.
pub(crate) async fn run_reconciler(coordinator: Arc<Coordinator>, shutdown: CancellationToken) {
    let mut pause = FIRST_RETRY;
    loop {
        let left = tokio::select! {
            _ = shutdown.cancelled() => return,
            left = coordinator.reconcile_moves() => left,
        };
        let retry = if left == 0 {
            pause = FIRST_RETRY;
            Duration::MAX
        } else {
            let p = pause;
            pause = (pause * 2).min(MAX_RETRY);
            p
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = coordinator.reconcile_wake.notified() => pause = FIRST_RETRY,
            _ = tokio::time::sleep(retry.min(Duration::from_secs(24 * 3600))) => {}
        }
    }
}
