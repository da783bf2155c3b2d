//! Membership: servers enlisting, retirement (a server replaced by a new
//! process is declared dead), and re-homing orphaned tablets.

use futures::future::join_all;
use insitu_protocol::{Request, Response, TabletState};
use tracing::{error, info, warn};

use crate::model::{MAP_VERSION, NEXT_SERVER_ID, Op, Tablet};
use crate::service::{
    Coordinator, MAX_IDENTITY_BYTES, MAX_SHARDS_PER_SERVER, MetaGuard, Reject, Reply, validate_addr,
};
use crate::shards::{CONTROL_TIMEOUT, CallError};

impl Coordinator {
    /// Register a server under a new id.
    ///
    /// A server names itself by `identity`, a random value it keeps in its
    /// data directory. A known live server is retired (declared dead, in the
    /// same transaction that registers the new one; its tablets are then
    /// recovered, see `death.rs`) when
    /// - it has the same identity: the same server restarted, so its previous
    ///   process, and that process's in-memory objects, are gone;
    /// - it shares a shard address with the new server and either has no
    ///   identity on record or `replace` is set (the operator says it is dead).
    ///
    /// A known server with another identity on one of the new server's
    /// addresses is otherwise NOT retired: the enlistment is refused with an
    /// error naming both. Two live servers can advertise one address (e.g. two
    /// hosts started with `--host 0.0.0.0`), and retiring the first would
    /// re-home its tablets empty: silent data loss from a misconfiguration.
    /// An empty `identity` (a server that keeps none) falls back to matching by
    /// address alone.
    ///
    /// Dead servers are ignored here: their addresses and identities are
    /// free for new servers.
    ///
    /// Then every orphaned tablet (left by an older coordinator, or by a
    /// failed re-homing) is re-homed, EMPTY, round-robin over the shards of
    /// every live server (see `rehome`), once at least
    /// `CoordinatorConfig::rehome_after_servers` servers are live. All of it
    /// is committed before the reply. The reply carries the cluster id and R.
    pub(crate) async fn enlist(
        &self,
        shard_addrs: Vec<String>,
        identity: String,
        replace: bool,
        backup_addr: String,
    ) -> Reply {
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
        if identity.len() > MAX_IDENTITY_BYTES
            || identity
                .chars()
                .any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(Reject::bad(format!(
                "a server identity must be at most {MAX_IDENTITY_BYTES} printable bytes without spaces, got {identity:?}"
            )));
        }
        if !backup_addr.is_empty() {
            validate_addr(&backup_addr)
                .map_err(|e| Reject::bad(format!("backup address {backup_addr:?}: {e}")))?;
        }
        let guard = self.meta_lock.lock().await;
        let shards = shard_addrs.len();
        // (1) Declare the servers that are gone dead, register the new one,
        // and reserve the map version of the re-homing, in one transaction.
        let (id, retired, orphans, ops, rehome_version, slots, cluster) = {
            let model = self.model();
            let id = model.next_server_id;
            let mut retired: Vec<(u64, Vec<String>)> = Vec::new();
            for (old_id, addrs) in &model.servers {
                if model.dead.contains(old_id) {
                    continue;
                }
                let old_identity = model.identities.get(old_id).map(String::as_str);
                let same = !identity.is_empty() && old_identity == Some(identity.as_str());
                let shared = addrs.iter().find(|a| shard_addrs.contains(a));
                let retire = match (same, shared) {
                    (true, _) => true,
                    (false, None) => false,
                    (false, Some(addr)) => match old_identity {
                        Some(old) if !identity.is_empty() && !replace => {
                            return Err(Reject::bad(format!(
                                "address {addr} is already registered by live server {old_id} \
                                 (identity {old}); this server has identity {identity}. Two servers \
                                 cannot advertise the same address: give each its own --host/--port. \
                                 If server {old_id} is dead and this one replaces it, start this one \
                                 with --replace (server {old_id} is then declared dead and its \
                                 tablets recovered), or remove it first with `insitu server remove {old_id}`"
                            )));
                        }
                        _ => true,
                    },
                };
                if retire {
                    retired.push((*old_id, addrs.clone()));
                }
            }
            let mut version = model.map_version;
            let mut ops: Vec<Op> = retired
                .iter()
                .map(|(id, _)| Op::MarkDead { id: *id })
                .collect();
            ops.push(Op::PutServer {
                id,
                shard_addrs: shard_addrs.clone(),
                identity: identity.clone(),
                backup_addr: backup_addr.clone(),
            });
            ops.push(Op::Counter(NEXT_SERVER_ID, id + 1));
            // The tablets orphaned now and those orphaned before.
            let mut after = model.clone();
            drop(model);
            after.apply(&ops);
            let mut orphans = after.orphaned_tablets();
            if after.live_servers().len() < self.rehome_after_servers {
                // Wait for the rest of the expected servers, so the tablets
                // spread over all of them instead of landing on the first.
                orphans.clear();
            }
            if !orphans.is_empty() {
                version += 1;
            }
            if version != after.map_version {
                ops.push(Op::Counter(MAP_VERSION, version));
            }
            let slots: Vec<(u64, u32, String)> = after
                .placement_slots()
                .into_iter()
                .filter_map(|(server, shard)| {
                    let addr = after.shard_addr(server, shard)?.to_string();
                    Some((server, shard, addr))
                })
                .collect();
            let cluster = (after.cluster_id, after.replicas);
            (id, retired, orphans, ops, version, slots, cluster)
        };
        self.commit(&guard, ops).await?;
        for (old_id, old_addrs) in &retired {
            warn!(
                server_id = old_id,
                addrs = ?old_addrs,
                new_server_id = id,
                "server declared dead: it re-enlisted (restart), or a new server enlisted on one of its addresses, so its process is gone; its tablets are recovered"
            );
        }
        // A cached connection to one of these addresses led to an old process.
        for addr in &shard_addrs {
            self.shards.forget(addr);
        }
        info!(server_id = id, shards, addrs = ?shard_addrs, backup_addr, "server enlisted");
        if !orphans.is_empty() {
            self.rehome(&guard, id, &slots, orphans, rehome_version)
                .await;
        }
        drop(guard);
        let retired_ids: Vec<u64> = retired.iter().map(|(id, _)| *id).collect();
        if !retired_ids.is_empty() {
            // ServerDown to the live shards, then recovery (woken there).
            self.after_death(&retired_ids).await;
        }
        // Recovery may have been waiting for live servers.
        self.recovery_wake.notify_one();
        let (cluster_id, replicas) = cluster;
        Ok(Response::Enlisted {
            server_id: id,
            cluster_id,
            replicas,
        })
    }

    /// Give the orphaned tablets `orphans` (table id, index, tablet), empty
    /// (a stale copy a shard kept is dropped first),
    /// under map version `version` (already committed as the global version),
    /// round-robin over `slots` (server, shard, address): every live server's
    /// shard 0 first, then shard 1, ..., so a restarted `insitu up` spreads them
    /// like a new table. `server_id` (the server that just enlisted) is for
    /// the log. Failures leave tablets orphaned.
    pub(crate) async fn rehome(
        &self,
        guard: &MetaGuard<'_>,
        server_id: u64,
        slots: &[(u64, u32, String)],
        orphans: Vec<(u64, u32, Tablet)>,
        version: u64,
    ) {
        if slots.is_empty() {
            return; // cannot happen: the enlisting server has a shard
        }
        let placed: Vec<(u64, u32, Tablet, &str)> = orphans
            .into_iter()
            .enumerate()
            .map(|(i, (table, index, t))| {
                let (server, shard, addr) = &slots[i % slots.len()];
                let tablet = t.placed(*server, *shard, version);
                (table, index, tablet, addr.as_str())
            })
            .collect();
        // Every re-homed tablet lost its objects: each is marked lost, with
        // a version floor recorded in the same commit as its new owner, before
        // the map names that owner (`lost.rs`).
        let (floor, floor_op) = self.take_floor();
        let takes = placed.iter().map(|(table, _, t, addr)| {
            // The shard may still hold a copy of the tablet it moved out
            // before the owner died (its drop was never delivered).
            // `TakeTablet` keeps a copy it finds, so that copy, the contents
            // from before the move, would serve as the tablet. Dropped
            // first, it re-homes empty like every other orphan; the drop
            // spares a tablet that serves here (none can: its owner is dead).
            let clear = Request::DropTablet {
                table: *table,
                start_hash: t.start_hash,
                only_if_not_serving: true,
            };
            let request = Request::TakeTablet {
                table: *table,
                start_hash: t.start_hash,
                end_hash: t.end_hash,
                map_version: version,
                state: TabletState::Active,
                migration: 0,
            };
            let mark = crate::lost::mark_request(
                *table,
                t.start_hash,
                insitu_protocol::LOST_FROM_EARLIER_RUN,
                floor,
            );
            async move {
                self.shards.call(addr, &clear, CONTROL_TIMEOUT).await?;
                self.shards.call(addr, &request, CONTROL_TIMEOUT).await?;
                self.shards.call(addr, &mark, CONTROL_TIMEOUT).await
            }
        });
        let results = join_all(takes).await;
        let mut ops = Vec::new();
        let mut undo = Vec::new();
        for ((table, index, tablet, addr), result) in placed.iter().zip(&results) {
            match result {
                Ok(()) => {
                    ops.push(Op::PutTablet {
                        table: *table,
                        index: *index,
                        tablet: tablet.clone(),
                    });
                    ops.push(Op::PutDataLost {
                        table: *table,
                        index: *index,
                        master: insitu_protocol::LOST_FROM_EARLIER_RUN,
                    });
                }
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
        if !ops.is_empty() {
            ops.push(floor_op);
        }
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
            "orphaned tablets re-homed EMPTY: their objects were held in memory only by a server that is gone and are lost"
        );
    }

    /// Names of the tables that have tablets no live server holds yet.
    pub fn orphaned_table_names(&self) -> Vec<String> {
        self.model().orphaned_table_names()
    }
}
