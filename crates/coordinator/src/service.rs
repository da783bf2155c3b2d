//! Request handling: the metadata operations.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::join_all;
use insitu_keyhash::HashRange;
use insitu_protocol::{Request, Response, Status, TabletState};
use tracing::{error, info, warn};

use crate::model::{MAP_VERSION, Model, NEXT_SERVER_ID, NEXT_TABLE_ID, Op, Tablet};
use crate::shards::{CONTROL_TIMEOUT, CallError, MIGRATE_TIMEOUT, ShardPool};
use crate::store::Store;

pub const MAX_NAME_BYTES: usize = 256;
pub const MAX_TABLETS: u32 = 1024;
pub const MAX_SHARDS_PER_SERVER: usize = 1024;
pub const MAX_ADDR_BYTES: usize = 256;

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
    fn bad(message: impl Into<String>) -> Reject {
        Reject::new(Status::BadRequest, message)
    }
    fn internal(message: impl Into<String>) -> Reject {
        Reject::new(Status::Internal, message)
    }
}

type Reply = Result<Response<'static>, Reject>;

pub struct Coordinator {
    /// `None` only after `close`.
    store: Mutex<Option<Arc<Store>>>,
    model: Mutex<Model>,
    /// Held by every metadata change from the moment it reads the model until
    /// its change is committed and applied, so changes never interleave.
    meta_lock: tokio::sync::Mutex<()>,
    /// Moves run one at a time (a move holds `meta_lock` only to commit).
    move_lock: tokio::sync::Mutex<()>,
    shards: ShardPool,
}

type MetaGuard<'a> = tokio::sync::MutexGuard<'a, ()>;

impl Coordinator {
    pub fn new(store: Store, model: Model) -> Coordinator {
        Coordinator {
            store: Mutex::new(Some(Arc::new(store))),
            model: Mutex::new(model),
            meta_lock: tokio::sync::Mutex::new(()),
            move_lock: tokio::sync::Mutex::new(()),
            shards: ShardPool::default(),
        }
    }

    fn model(&self) -> MutexGuard<'_, Model> {
        // Nothing panics while holding it; if something did, the model is still whole.
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commit `ops` durably, then apply them to the in-memory model.
    /// The guard proves the caller holds the metadata lock.
    async fn commit(&self, _guard: &MetaGuard<'_>, ops: Vec<Op>) -> Result<(), Reject> {
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
            Request::Enlist { shard_addrs } => self.enlist(shard_addrs).await,
            Request::CreateTable { name, tablets } => self.create_table(name, tablets).await,
            Request::DropTable { name } => self.drop_table(name).await,
            Request::OpenTable { name } => {
                let model = self.model();
                let id = *model
                    .by_name
                    .get(&name)
                    .ok_or_else(|| unknown_table(&name))?;
                model
                    .table_info(id)
                    .map(Response::Table)
                    .ok_or_else(|| unknown_table(&name))
            }
            Request::TableMap { table } => self
                .model()
                .table_info(table)
                .map(Response::Table)
                .ok_or_else(|| {
                    Reject::new(Status::UnknownTable, format!("no table with id {table}"))
                }),
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
            } => self.move_tablet(table, tablet_index, server_id).await,
            other => Err(Reject::bad(format!(
                "{} is not a coordinator request",
                request_name(&other)
            ))),
        }
    }

    async fn enlist(&self, shard_addrs: Vec<String>) -> Reply {
        if shard_addrs.is_empty() || shard_addrs.len() > MAX_SHARDS_PER_SERVER {
            return Err(Reject::bad(format!(
                "a server must enlist with 1 to {MAX_SHARDS_PER_SERVER} shard addresses, got {}",
                shard_addrs.len()
            )));
        }
        for (i, addr) in shard_addrs.iter().enumerate() {
            validate_addr(addr)
                .map_err(|e| Reject::bad(format!("shard {i} address {addr:?}: {e}")))?;
        }
        let guard = self.meta_lock.lock().await;
        let id = self.model().next_server_id;
        let shards = shard_addrs.len();
        self.commit(
            &guard,
            vec![
                Op::PutServer {
                    id,
                    shard_addrs: shard_addrs.clone(),
                },
                Op::Counter(NEXT_SERVER_ID, id + 1),
            ],
        )
        .await?;
        drop(guard);
        info!(server_id = id, shards, addrs = ?shard_addrs, "server enlisted");
        Ok(Response::Enlisted { server_id: id })
    }

    async fn create_table(&self, name: String, count: u32) -> Reply {
        validate_name(&name)?;
        if count == 0 || count > MAX_TABLETS {
            return Err(Reject::bad(format!(
                "a table needs 1 to {MAX_TABLETS} tablets, got {count}"
            )));
        }
        let guard = self.meta_lock.lock().await;
        let (id, version, slots) = {
            let model = self.model();
            if model.by_name.contains_key(&name) {
                return Err(Reject::new(
                    Status::TableExists,
                    format!("table {name:?} already exists"),
                ));
            }
            let slots = model.placement_slots();
            if slots.is_empty() {
                return Err(Reject::new(
                    Status::NoServers,
                    "no storage servers have enlisted: start a server first",
                ));
            }
            (model.next_table_id, model.map_version + 1, slots)
        };
        // Reserve the id and the version first, so that even if this create
        // fails half-way (and a shard keeps a copy we could not drop), neither
        // is ever handed out again.
        self.commit(
            &guard,
            vec![
                Op::Counter(NEXT_TABLE_ID, id + 1),
                Op::Counter(MAP_VERSION, version),
            ],
        )
        .await?;

        let tablets: Vec<Tablet> = HashRange::split_even(u64::from(count))
            .into_iter()
            .enumerate()
            .map(|(i, range)| {
                let (server_id, shard) = slots[i % slots.len()];
                Tablet {
                    start_hash: range.start,
                    end_hash: range.end,
                    server_id,
                    shard,
                    map_version: version,
                }
            })
            .collect();
        let addrs = self.addrs_of(&tablets)?;

        let takes = tablets.iter().zip(&addrs).map(|(t, addr)| {
            let request = Request::TakeTablet {
                table: id,
                start_hash: t.start_hash,
                end_hash: t.end_hash,
                map_version: version,
                state: TabletState::Active,
            };
            async move { self.shards.call(addr, &request, CONTROL_TIMEOUT).await }
        });
        let results = join_all(takes).await;
        let failures: Vec<String> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                r.as_ref().err().map(|e| {
                    format!(
                        "tablet {i} on server {} shard {} ({}): {e}",
                        tablets[i].server_id, tablets[i].shard, addrs[i]
                    )
                })
            })
            .collect();
        if !failures.is_empty() {
            // A transport failure may still have created the tablet: drop everywhere
            // except where the shard positively refused.
            let undo: Vec<usize> = (0..tablets.len())
                .filter(|&i| !matches!(results[i], Err(CallError::Rejected(..))))
                .collect();
            self.drop_tablets(
                id,
                undo.iter()
                    .map(|&i| (tablets[i].start_hash, addrs[i].as_str())),
            )
            .await;
            warn!(table = %name, failures = ?failures, "create table failed: a shard did not take its tablet");
            return Err(Reject::internal(format!(
                "cannot create table {name:?}: {} of {count} tablets could not be placed; first: {}",
                failures.len(),
                failures[0]
            )));
        }

        let mut ops = vec![Op::PutTable {
            id,
            name: name.clone(),
        }];
        ops.extend(tablets.iter().enumerate().map(|(i, t)| Op::PutTablet {
            table: id,
            index: i as u32,
            tablet: t.clone(),
        }));
        if let Err(e) = self.commit(&guard, ops).await {
            self.drop_tablets(
                id,
                tablets
                    .iter()
                    .zip(&addrs)
                    .map(|(t, a)| (t.start_hash, a.as_str())),
            )
            .await;
            return Err(e);
        }
        let info = self
            .model()
            .table_info(id)
            .ok_or_else(|| Reject::internal("table vanished after create"))?;
        drop(guard);
        info!(table = %name, table_id = id, tablets = count, map_version = version, "table created");
        Ok(Response::Table(info))
    }

    async fn drop_table(&self, name: String) -> Reply {
        let guard = self.meta_lock.lock().await;
        let (id, owners, version) = {
            let model = self.model();
            let id = *model
                .by_name
                .get(&name)
                .ok_or_else(|| unknown_table(&name))?;
            let table = model.tables.get(&id).ok_or_else(|| unknown_table(&name))?;
            let owners: Vec<(u64, String)> = table
                .tablets
                .iter()
                .map(|t| {
                    (
                        t.start_hash,
                        model
                            .shard_addr(t.server_id, t.shard)
                            .unwrap_or_default()
                            .to_string(),
                    )
                })
                .collect();
            (id, owners, model.map_version + 1)
        };
        self.commit(
            &guard,
            vec![Op::DeleteTable { id }, Op::Counter(MAP_VERSION, version)],
        )
        .await?;
        drop(guard);
        info!(table = %name, table_id = id, map_version = version, "table dropped");
        self.drop_tablets(
            id,
            owners.iter().map(|(start, addr)| (*start, addr.as_str())),
        )
        .await;
        Ok(Response::Done)
    }

    /// Best effort: DropTablet on each (start_hash, shard address), in parallel; failures are logged.
    async fn drop_tablets<'a>(&self, table: u64, tablets: impl Iterator<Item = (u64, &'a str)>) {
        let calls = tablets.map(|(start_hash, addr)| async move {
            if let Err(e) = self
                .shards
                .call(
                    addr,
                    &Request::DropTablet { table, start_hash },
                    CONTROL_TIMEOUT,
                )
                .await
            {
                warn!(table, start_hash, addr, "DropTablet failed: {e}");
            }
        });
        join_all(calls).await;
    }

    fn addrs_of(&self, tablets: &[Tablet]) -> Result<Vec<String>, Reject> {
        let model = self.model();
        tablets
            .iter()
            .map(|t| {
                model
                    .shard_addr(t.server_id, t.shard)
                    .map(str::to_string)
                    .ok_or_else(|| {
                        Reject::internal(format!("server {} has no shard {}", t.server_id, t.shard))
                    })
            })
            .collect()
    }

    /// Move one tablet to another server. See the crate docs for the protocol.
    async fn move_tablet(&self, table_name: String, index: u32, dest_server: u64) -> Reply {
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
        let (still_there, version) = {
            let model = self.model();
            let current = model
                .tables
                .get(&table)
                .and_then(|t| t.tablets.get(index as usize));
            (current == Some(&old), model.map_version + 1)
        };
        if !still_there {
            drop(guard);
            // Only a drop of the table changes it under us (moves are serialized);
            // the drop already told the source to delete its copy.
            self.drop_tablets(table, std::iter::once((start_hash, dest_addr.as_str())))
                .await;
            warn!(table = %table_name, index, "move abandoned: the table was dropped or changed meanwhile");
            return Err(Reject::new(
                Status::UnknownTable,
                format!("table {table_name:?} was dropped during the move"),
            ));
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
    async fn abort_move(&self, table: u64, old: &Tablet, src_addr: &str, dest_addr: &str) {
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
    async fn activation_failed(
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
        let (unchanged, version) = {
            let model = self.model();
            let current = model
                .tables
                .get(&table)
                .and_then(|t| t.tablets.get(index as usize));
            (
                current.map(|t| t.map_version) == Some(moved_version),
                model.map_version + 1,
            )
        };
        if !unchanged {
            return Reject::internal(format!(
                "activating the tablet on {dest_addr} failed ({e}) and the table changed meanwhile"
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

    /// Retry transport failures a few times (the control requests used here are
    /// idempotent on the shard); a refusal is final.
    async fn call_with_retries(
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

fn unknown_table(name: &str) -> Reject {
    Reject::new(Status::UnknownTable, format!("no table named {name:?}"))
}

fn validate_name(name: &str) -> Result<(), Reject> {
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

fn validate_addr(addr: &str) -> Result<(), String> {
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

fn request_name(request: &Request<'_>) -> &'static str {
    match request {
        Request::Ping => "Ping",
        Request::Read { .. } => "Read",
        Request::Write { .. } => "Write",
        Request::Remove { .. } => "Remove",
        Request::Increment { .. } => "Increment",
        Request::MultiRead { .. } => "MultiRead",
        Request::MultiWrite { .. } => "MultiWrite",
        Request::MultiRemove { .. } => "MultiRemove",
        Request::Enumerate { .. } => "Enumerate",
        Request::ShardStats => "ShardStats",
        Request::TakeTablet { .. } => "TakeTablet",
        Request::DropTablet { .. } => "DropTablet",
        Request::MigrateTablet { .. } => "MigrateTablet",
        Request::MigrateBatch { .. } => "MigrateBatch",
        Request::ActivateTablet { .. } => "ActivateTablet",
        Request::Enlist { .. } => "Enlist",
        Request::CreateTable { .. } => "CreateTable",
        Request::DropTable { .. } => "DropTable",
        Request::OpenTable { .. } => "OpenTable",
        Request::TableMap { .. } => "TableMap",
        Request::ListTables => "ListTables",
        Request::ListServers => "ListServers",
        Request::MoveTablet { .. } => "MoveTablet",
    }
}
