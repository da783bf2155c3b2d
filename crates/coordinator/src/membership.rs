//! Membership: servers enlisting, retirement of dead servers, and re-homing
//! their orphaned tablets.

use futures::future::join_all;
use insitu_protocol::{Request, Response, TabletState};
use tracing::{error, info, warn};

use crate::model::{MAP_VERSION, NEXT_SERVER_ID, Op, Tablet};
use crate::service::{Coordinator, MAX_SHARDS_PER_SERVER, MetaGuard, Reject, Reply, validate_addr};
use crate::shards::{CONTROL_TIMEOUT, CallError};

impl Coordinator {
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
    pub(crate) async fn enlist(&self, shard_addrs: Vec<String>) -> Reply {
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
    pub(crate) async fn rehome(
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
}
