//! Request dispatch, the shared state of the coordinator, and helpers used by
//! tables (`tables.rs`), membership (`membership.rs`) and moves (`moves.rs`).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use insitu_protocol::{Request, Response, Status};
use tracing::{error, warn};

use crate::model::{Model, Op};
use crate::oracle::Oracle;
use crate::shards::{CallError, ShardPool};
use crate::store::Store;

pub const MAX_NAME_BYTES: usize = 256;
pub const MAX_TABLETS: u32 = 1024;
pub const MAX_SHARDS_PER_SERVER: usize = 1024;
pub const MAX_ADDR_BYTES: usize = 256;
/// Longest server identity accepted (servers send 32 hex digits).
pub const MAX_IDENTITY_BYTES: usize = 128;

/// An error reply: header status plus a message for humans.
#[derive(Debug, Clone)]
pub struct Reject {
    pub status: Status,
    pub message: String,
}

impl Reject {
    pub fn new(status: Status, message: impl Into<String>) -> Reject {
        Reject {
            status,
            message: message.into(),
        }
    }
    pub(crate) fn bad(message: impl Into<String>) -> Reject {
        Reject::new(Status::BadRequest, message)
    }
    pub(crate) fn internal(message: impl Into<String>) -> Reject {
        Reject::new(Status::Internal, message)
    }
}

pub(crate) type Reply = Result<Response<'static>, Reject>;

pub struct Coordinator {
    /// `None` only after `close`.
    pub(crate) store: Mutex<Option<Arc<Store>>>,
    pub(crate) model: Mutex<Model>,
    /// Held by every metadata change from the moment it reads the model until
    /// its change is committed and applied, so changes never interleave.
    pub(crate) meta_lock: tokio::sync::Mutex<()>,
    /// Moves run one at a time (a move holds `meta_lock` only to commit).
    pub(crate) move_lock: tokio::sync::Mutex<()>,
    pub(crate) shards: ShardPool,
    /// Orphaned tablets are re-homed only once this many servers are
    /// registered (`CoordinatorConfig::rehome_after_servers`).
    pub(crate) rehome_after_servers: usize,
    /// Wakes the reconciler (`reconcile.rs`) when a move leaves a record
    /// behind that it could not finish or undo itself.
    pub(crate) reconcile_wake: tokio::sync::Notify,
    /// Wakes the recovery driver (`death.rs`): a server died, or one
    /// enlisted (recovery may have been waiting for live servers).
    pub(crate) recovery_wake: tokio::sync::Notify,
    /// Dead servers the operator removed (`insitu server remove`) in this
    /// coordinator's lifetime: their disks are not coming back, so recovering
    /// other servers no longer waits for their replicas (`death.rs`).
    pub(crate) operator_removed: Mutex<std::collections::HashSet<u64>>,
    /// The timestamp oracle (`oracle.rs`): its own lock, so handing out
    /// timestamps never waits for a metadata change.
    pub(crate) oracle: Oracle,
    /// Why the last attempt to recover a tablet failed, by (table, index),
    /// until it is recovered: added to the `Retry` its clients get, so a
    /// recovery that cannot finish (a segment no backup holds, no memory)
    /// says why instead of only "try again". In memory only: a restarted
    /// coordinator tries again and learns it anew.
    pub(crate) recovery_notes: Mutex<RecoveryNotes>,
}

/// (table, tablet index) -> why its last recovery attempt failed.
pub(crate) type RecoveryNotes = std::collections::HashMap<(u64, u32), String>;

pub(crate) type MetaGuard<'a> = tokio::sync::MutexGuard<'a, ()>;

impl Coordinator {
    /// `member`: what the coordinator presents to servers (the cluster
    /// credential, the TLS trust). `timestamp_reservation`: the oracle's
    /// reservation on record (`Opened::timestamp_reservation`).
    pub fn new(
        store: Store,
        model: Model,
        rehome_after_servers: usize,
        member: insitu_auth::Credentials,
        timestamp_reservation: u64,
    ) -> Coordinator {
        Coordinator {
            oracle: Oracle::new(timestamp_reservation),
            rehome_after_servers,
            reconcile_wake: tokio::sync::Notify::new(),
            recovery_wake: tokio::sync::Notify::new(),
            operator_removed: Mutex::new(Default::default()),
            recovery_notes: Mutex::new(Default::default()),
            store: Mutex::new(Some(Arc::new(store))),
            model: Mutex::new(model),
            meta_lock: tokio::sync::Mutex::new(()),
            move_lock: tokio::sync::Mutex::new(()),
            shards: ShardPool::new(member),
        }
    }

    pub(crate) fn recovery_notes(&self) -> MutexGuard<'_, RecoveryNotes> {
        // Only inserts and removes happen under it: whole after a panic too.
        self.recovery_notes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn model(&self) -> MutexGuard<'_, Model> {
        // Nothing panics while holding it; if something did, the model is still whole.
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commit `ops` durably, then apply them to the in-memory model.
    /// The guard proves the caller holds the metadata lock.
    pub(crate) async fn commit(&self, _guard: &MetaGuard<'_>, ops: Vec<Op>) -> Result<(), Reject> {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(store) = store else {
            return Err(Reject::internal("the coordinator is shutting down"));
        };
        let ops = tokio::task::spawn_blocking(move || store.commit(&ops).map(|()| ops))
            .await
            .map_err(|e| Reject::internal(format!("metadata commit task failed: {e}")))?
            .map_err(|e| {
                error!("metadata commit failed: {e:#}");
                Reject::internal(format!("cannot persist metadata: {e:#}"))
            })?;
        self.model().apply(&ops);
        Ok(())
    }

    /// Close the database (after every connection is done). Blocking work runs
    /// on a blocking thread.
    pub async fn close(&self) {
        let _guard = self.meta_lock.lock().await;
        // No reservation write holds the store while it is closed.
        let _oracle = self.oracle.pause().await;
        self.shards.clear();
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(store) = store else { return };
        match Arc::try_unwrap(store) {
            Ok(store) => match tokio::task::spawn_blocking(move || store.close()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => error!("closing the metadata database: {e:#}"),
                Err(e) => error!("closing the metadata database: {e}"),
            },
            // Cannot happen (commits hold a clone only while running, under the
            // lock we hold); the last clone closes it when dropped.
            Err(_) => warn!("metadata database still in use at shutdown; it closes when released"),
        }
    }

    pub async fn handle(&self, request: Request<'_>) -> Reply {
        match request {
            Request::Ping => Ok(Response::Pong),
            Request::Enlist {
                shard_addrs,
                identity,
                replace,
                backup_addr,
            } => {
                self.enlist(shard_addrs, identity, replace, backup_addr)
                    .await
            }
            Request::RemoveServer { server_id } => self.remove_server(server_id).await,
            Request::AckLoss { table } => self.ack_loss(table).await,
            Request::AcceptLoss { table } => self.accept_loss(table).await,
            Request::CreateTable {
                name,
                tablets,
                schema,
                by_slot,
            } => self.create_table(name, tablets, schema, by_slot).await,
            Request::DropTable { name } => self.drop_table(name).await,
            Request::CreateIndex { table, column } => self.set_index(table, column, true).await,
            Request::DropIndex { table, column } => self.set_index(table, column, false).await,
            Request::OpenTable { name } => {
                let model = self.model();
                let id = *model
                    .by_name
                    .get(&name)
                    .ok_or_else(|| unknown_table(&name))?;
                usable_map(&model, id, &self.recovery_notes())
                    .ok_or_else(|| unknown_table(&name))?
            }
            Request::TableMap { table } => usable_map(&self.model(), table, &self.recovery_notes())
                .ok_or_else(|| {
                    Reject::new(Status::UnknownTable, format!("no table with id {table}"))
                })?,
            Request::ListTables => {
                let model = self.model();
                Ok(Response::Tables(
                    model
                        .tables
                        .keys()
                        .filter_map(|id| model.table_info(*id))
                        .collect(),
                ))
            }
            Request::ListServers => Ok(Response::Servers(self.model().server_infos())),
            Request::MoveTablet {
                table,
                tablet_index,
                server_id,
            } => {
                let moved = self.move_tablet(table, tablet_index, server_id).await;
                let outcome = if moved.is_ok() { "moved" } else { "failed" };
                metrics::counter!("insitu_tablet_moves_total", "outcome" => outcome).increment(1);
                moved
            }
            Request::Timestamps { count } => self.timestamps(count).await,
            other => Err(Reject::bad(format!(
                "{} is not a coordinator request",
                other.name()
            ))),
        }
    }

    /// Retry transport failures a few times (the control requests used here are
    /// idempotent on the shard); a refusal is final.
    pub(crate) async fn call_with_retries(
        &self,
        addr: &str,
        request: &Request<'_>,
        timeout: Duration,
    ) -> Result<(), CallError> {
        let mut attempt = 0;
        loop {
            match self.shards.call(addr, request, timeout).await {
                Err(CallError::Transport(e)) if attempt < 2 => {
                    attempt += 1;
                    warn!(addr, attempt, "control call failed, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                other => return other,
            }
        }
    }
}

/// The reply to OpenTable / TableMap of table `id` (`None`: no such table).
///
/// A table with a tablet no live server holds (orphaned, or owned by a dead
/// server whose tablets are being recovered) gets `Status::Retry` with
/// "tablet N of table T has no live server yet" instead of a map: the client backs off and asks again within
/// its operation timeout (a server that enlists meanwhile gets the tablet),
/// and then fails with that message rather than hanging on an empty address.
/// `ListTables` still lists such a table, its orphaned tablets with server id
/// 0 and an empty address. `notes`: why a tablet's last recovery failed.
pub(crate) fn usable_map(model: &Model, id: u64, notes: &RecoveryNotes) -> Option<Reply> {
    let info = model.table_info(id)?;
    Some(match model.first_orphan(id) {
        None => Ok(Response::Table(info)),
        Some(index) => Err(match model.lost_from.get(&(id, index as u32)) {
            Some(master) => crate::recovery::being_recovered(
                index,
                &info.name,
                *master,
                notes.get(&(id, index as u32)).map(String::as_str),
            ),
            None => no_live_server(index, &info.name),
        }),
    })
}

pub(crate) fn no_live_server(index: usize, table: &str) -> Reject {
    Reject::new(
        Status::Retry,
        format!(
            "tablet {index} of table {table:?} has no live server yet (its server is gone; \
             it is recovered, or re-created empty if it has no replicas, once a storage server is up)"
        ),
    )
}

pub(crate) fn unknown_table(name: &str) -> Reject {
    Reject::new(Status::UnknownTable, format!("no table named {name:?}"))
}

pub(crate) fn validate_name(name: &str) -> Result<(), Reject> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(Reject::bad(format!(
            "a table name must be 1 to {MAX_NAME_BYTES} bytes long, got {}",
            name.len()
        )));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(Reject::bad(format!(
            "a table name must be printable; {name:?} contains {c:?}"
        )));
    }
    Ok(())
}

pub(crate) fn validate_addr(addr: &str) -> Result<(), String> {
    if addr.is_empty() || addr.len() > MAX_ADDR_BYTES {
        return Err(format!("must be 1 to {MAX_ADDR_BYTES} bytes"));
    }
    if addr.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("contains whitespace or control characters".into());
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0) => {
            Ok(())
        }
        _ => Err("expected host:port with a non-zero port".into()),
    }
}
