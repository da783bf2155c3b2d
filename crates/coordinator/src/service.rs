//! Request handling: the metadata operations.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::join_all;
use insitu_keyhash::HashRange;
use insitu_protocol::{Request, Response, Status, TabletState};
use tracing::{error, info, warn};

use crate::model::{MAP_VERSION, Model, NEXT_SERVER_ID, NEXT_TABLE_ID, ORPHANED, Op, Tablet};
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
                usable_map(&model, id).ok_or_else(|| unknown_table(&name))?
            }
            Request::TableMap { table } => usable_map(&self.model(), table).ok_or_else(|| {
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
            } => self.move_tablet(table, tablet_index, server_id).await,
            other => Err(Reject::bad(format!(
                "{} is not a coordinator request",
                request_name(&other)
            ))),
        }
    }

    /// Register a server under a new id.
    ///
    /// Any known server with one of the new server's shard addresses is
    /// retired first (forgotten; its tablets become orphaned). That is safe: a
    /// listening address is held by one live process at most, and the new
    /// server listens on its addresses right now (it binds them before it
    /// enlists, and enlists once per process), so the old owner of such an
    /// address is dead — typically the previous incarnation of a server
    /// restarted with the same `--port` — and its in-memory objects are gone.
    /// Without this, its tablets would name a process that answers
    /// `UnknownTablet` for them forever.
    ///
    /// Then every orphaned tablet (of this retirement, of an earlier one, or
    /// of `CoordinatorConfig::forget_servers`) is re-homed, EMPTY, onto the
    /// new server's shards (round-robin): `TakeTablet{Active, v}` to the shard,
    /// then the new owner is committed under map version `v`. A tablet whose
    /// TakeTablet fails stays orphaned until the next enlist. All of it is
    /// committed before the reply.
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
        let shards = shard_addrs.len();
        // (1) Retire the servers that shared an address, register the new one,
        // and reserve the map version of the re-homing, in one transaction.
        let (id, retired, orphans, ops, rehome_version) = {
            let model = self.model();
            let id = model.next_server_id;
            let retired: Vec<(u64, Vec<String>)> = model
                .servers
                .iter()
                .filter(|(_, addrs)| addrs.iter().any(|a| shard_addrs.contains(a)))
                .map(|(id, addrs)| (*id, addrs.clone()))
                .collect();
            let retired_ids: Vec<u64> = retired.iter().map(|(id, _)| *id).collect();
            let mut version = model.map_version;
            let mut ops = Vec::new();
            if !retired_ids.is_empty() {
                version += 1;
                ops = model.retire_ops(&retired_ids, version);
            }
            ops.push(Op::PutServer {
                id,
                shard_addrs: shard_addrs.clone(),
            });
            ops.push(Op::Counter(NEXT_SERVER_ID, id + 1));
            // The tablets orphaned now and those orphaned before.
            let mut after = model.clone();
            drop(model);
            after.apply(&ops);
            let orphans = after.orphaned_tablets();
            if !orphans.is_empty() {
                version += 1;
            }
            if version != after.map_version {
                ops.push(Op::Counter(MAP_VERSION, version));
            }
            (id, retired, orphans, ops, version)
        };
        self.commit(&guard, ops).await?;
        for (old_id, old_addrs) in &retired {
            warn!(
                server_id = old_id,
                addrs = ?old_addrs,
                new_server_id = id,
                "server retired: a new server enlisted on one of its addresses, so its process is gone"
            );
        }
        // A cached connection to one of these addresses led to a dead process.
        for addr in retired.iter().flat_map(|(_, a)| a).chain(&shard_addrs) {
            self.shards.forget(addr);
        }
        info!(server_id = id, shards, addrs = ?shard_addrs, "server enlisted");
        if !orphans.is_empty() {
            self.rehome(&guard, id, &shard_addrs, orphans, rehome_version)
                .await;
        }
        drop(guard);
        Ok(Response::Enlisted { server_id: id })
    }

    /// Give the orphaned tablets `orphans` (table id, index, tablet) to the
    /// new server `server_id`, empty, under map version `version` (already
    /// committed as the global version). Failures leave tablets orphaned.
    async fn rehome(
        &self,
        guard: &MetaGuard<'_>,
        server_id: u64,
        shard_addrs: &[String],
        orphans: Vec<(u64, u32, Tablet)>,
        version: u64,
    ) {
        let placed: Vec<(u64, u32, Tablet, &str)> = orphans
            .into_iter()
            .enumerate()
            .map(|(i, (table, index, t))| {
                let shard = i % shard_addrs.len();
                let tablet = Tablet {
                    server_id,
                    shard: shard as u32,
                    map_version: version,
                    ..t
                };
                (table, index, tablet, shard_addrs[shard].as_str())
            })
            .collect();
        let takes = placed.iter().map(|(table, _, t, addr)| {
            let request = Request::TakeTablet {
                table: *table,
                start_hash: t.start_hash,
                end_hash: t.end_hash,
                map_version: version,
                state: TabletState::Active,
            };
            async move { self.shards.call(addr, &request, CONTROL_TIMEOUT).await }
        });
        let results = join_all(takes).await;
        let mut ops = Vec::new();
        let mut undo = Vec::new();
        for ((table, index, tablet, addr), result) in placed.iter().zip(&results) {
            match result {
                Ok(()) => ops.push(Op::PutTablet {
                    table: *table,
                    index: *index,
                    tablet: tablet.clone(),
                }),
                Err(e) => {
                    warn!(
                        table,
                        index,
                        addr,
                        "re-homing an orphaned tablet failed; it stays orphaned until the next enlist: {e}"
                    );
                    // A transport failure may still have created it there.
                    if !matches!(e, CallError::Rejected(..)) {
                        undo.push((*table, tablet.start_hash, *addr));
                    }
                }
            }
        }
        let rehomed: Vec<(u64, u32, Tablet, &str)> = placed
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(p, _)| p.clone())
            .collect();
        if !ops.is_empty()
            && let Err(e) = self.commit(guard, ops).await
        {
            error!(
                server_id,
                "cannot commit re-homed tablets; they stay orphaned: {}", e.message
            );
            undo.extend(
                rehomed
                    .iter()
                    .map(|(table, _, t, addr)| (*table, t.start_hash, *addr)),
            );
            for (table, start_hash, addr) in undo {
                self.drop_tablets(table, std::iter::once((start_hash, addr)))
                    .await;
            }
            return;
        }
        for (table, start_hash, addr) in undo {
            self.drop_tablets(table, std::iter::once((start_hash, addr)))
                .await;
        }
        if rehomed.is_empty() {
            return;
        }
        // Per table: its name and how many of its tablets came back empty.
        let mut lost: std::collections::BTreeMap<u64, usize> = Default::default();
        for (table, ..) in &rehomed {
            *lost.entry(*table).or_default() += 1;
        }
        let names: Vec<String> = {
            let model = self.model();
            lost.iter()
                .map(|(table, n)| {
                    let name = model
                        .tables
                        .get(table)
                        .map(|t| t.name.as_str())
                        .unwrap_or("?");
                    format!("{name:?} ({n} tablets)")
                })
                .collect()
        };
        warn!(
            server_id,
            map_version = version,
            tablets = rehomed.len(),
            tables = %names.join(", "),
            "orphaned tablets re-homed EMPTY on the new server: their objects were held in memory only by a server that is gone (no replicas yet) and are lost"
        );
    }

    /// Retire every known server (`CoordinatorConfig::forget_servers`): their
    /// tablets become orphaned, and are re-homed as servers enlist.
    /// Returns how many servers were retired.
    pub async fn retire_all(&self) -> Result<usize, Reject> {
        let guard = self.meta_lock.lock().await;
        let (ops, count) = {
            let model = self.model();
            let ids: Vec<u64> = model.servers.keys().copied().collect();
            if ids.is_empty() {
                return Ok(0);
            }
            let version = model.map_version + 1;
            let mut ops = model.retire_ops(&ids, version);
            ops.push(Op::Counter(MAP_VERSION, version));
            (ops, ids.len())
        };
        self.commit(&guard, ops).await?;
        Ok(count)
    }

    /// Names of the tables that have tablets no live server holds yet.
    pub fn orphaned_table_names(&self) -> Vec<String> {
        self.model().orphaned_table_names()
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
                // An orphaned tablet is held by no live shard.
                .filter(|t| !t.is_orphaned())
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

/// The reply to OpenTable / TableMap of table `id` (`None`: no such table).
///
/// A table with an orphaned tablet (its server was retired and no server
/// holds it yet) gets `Status::Retry` with "tablet N of table T has no live
/// server yet" instead of a map: the client backs off and asks again within
/// its operation timeout (a server that enlists meanwhile gets the tablet),
/// and then fails with that message rather than hanging on an empty address.
/// `ListTables` still lists such a table, its orphaned tablets with server id
/// 0 and an empty address.
fn usable_map(model: &Model, id: u64) -> Option<Reply> {
    let info = model.table_info(id)?;
    Some(match model.first_orphan(id) {
        None => Ok(Response::Table(info)),
        Some(index) => Err(no_live_server(index, &info.name)),
    })
}

fn no_live_server(index: usize, table: &str) -> Reject {
    Reject::new(
        Status::Retry,
        format!(
            "tablet {index} of table {table:?} has no live server yet (its server is gone; \
             it is re-created empty when a storage server enlists)"
        ),
    )
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
        Request::Scan { .. } => "Scan",
    }
}
