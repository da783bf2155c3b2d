//! The coordinator's metadata, in memory.
//!
//! `Model` is an exact mirror of what is committed in redb: every change is a
//! list of [`Op`]s that is first committed to the database in one write
//! transaction and only then applied here with [`Model::apply`], so memory
//! never shows something that is not durable.
//!
//! # Orphaned tablets
//! A tablet whose owner was retired (its process is known to be gone, see
//! `Coordinator::enlist` and `CoordinatorConfig::forget_servers`) is
//! *orphaned*: its `server_id` is [`ORPHANED`] (0; real server ids start at 1)
//! and its `shard` is 0. Its objects were held in memory by the dead process
//! and are lost. It keeps its hash range, so the table still covers the whole
//! hash space, and it is re-homed, empty, onto the next server that enlists.
//!
//! # Dead servers
//! A server declared dead (failure detection, `RemoveServer`, or retirement
//! when its identity enlists again) stays on record, marked in `dead`, until
//! its tablets are recovered: they keep naming it as their owner (so recovery
//! knows whose replicas to read) but no request is routed to it
//! ([`Model::shard_addr`] answers only for live servers) and `OpenTable` /
//! `TableMap` answer `Retry` for them. Recovery then forgets the server.

use std::collections::{BTreeMap, BTreeSet, HashMap};

// The unit tests (`use super::*`) name server states through this module.
#[cfg(test)]
use insitu_protocol::ServerState;

mod query;

/// `Tablet::server_id` of an orphaned tablet: no live server owns it.
pub const ORPHANED: u64 = 0;

/// Where one tablet lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tablet {
    pub start_hash: u64,
    pub end_hash: u64,
    pub server_id: u64,
    pub shard: u32,
    /// Map version of this tablet's last assignment.
    pub map_version: u64,
}

impl Tablet {
    /// Whether its owner was retired and no server holds it yet.
    pub fn is_orphaned(&self) -> bool {
        self.server_id == ORPHANED
    }

    /// The same hash range assigned to `shard` of `server_id` under map
    /// version `map_version`: what a move, a recovery or an orphaning records.
    pub fn placed(&self, server_id: u64, shard: u32, map_version: u64) -> Tablet {
        Tablet {
            server_id,
            shard,
            map_version,
            ..self.clone()
        }
    }
}

/// A tablet move in progress, recorded (in redb) before its first step and
/// updated when the new owner is committed, so that a coordinator that stops
/// in the middle finishes or undoes it when it starts again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveRecord {
    /// The tablet's assignment before the move (the source).
    pub old: Tablet,
    pub dest_server: u64,
    pub dest_shard: u32,
    /// 0 while the source still owns the tablet in the map (undo on restart);
    /// the map version of the destination's assignment once that is
    /// committed (finish on restart: activate the destination, drop the source).
    pub committed_version: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub id: u64,
    pub name: String,
    /// Ordered by index (= by `start_hash`), covering the whole hash space.
    pub tablets: Vec<Tablet>,
    /// A typed table's schema (checked at create); None = untyped.
    pub schema: Option<insitu_protocol::schema::Schema>,
    /// Columns with a secondary index, ascending (typed tables only).
    pub indexes: Vec<u16>,
}

/// Names of the rows of the `counters` table.
pub const NEXT_TABLE_ID: &str = "next_table_id";
pub const NEXT_SERVER_ID: &str = "next_server_id";
pub const MAP_VERSION: &str = "map_version";
/// The cluster's random id, created when the database is (never 0).
pub const CLUSTER_ID: &str = "cluster_id";
/// Replicas per segment (R), as last configured.
pub const REPLICAS: &str = "replicas";
/// The highest version floor given to a tablet re-created empty after a
/// loss (`lost.rs`): the next one is above it whatever the clock says.
pub const LOST_VERSION_FLOOR: &str = "lost_version_floor";

/// One durable change. A request's changes are committed together.
#[derive(Clone, Debug)]
pub enum Op {
    /// Set a counter (`NEXT_TABLE_ID`, `NEXT_SERVER_ID`, `MAP_VERSION`).
    Counter(&'static str, u64),
    PutServer {
        id: u64,
        shard_addrs: Vec<String>,
        /// The identity the server keeps in its data directory ("" if it sent none).
        identity: String,
        /// Its backup service's address ("" if it runs none).
        backup_addr: String,
    },
    /// The server is declared dead: no request is routed to it any more; its
    /// tablets wait for recovery (see "Dead servers" above).
    MarkDead { id: u64 },
    /// Forget a (retired) server. Its tablets are orphaned by `PutTablet`s in
    /// the same change (see [`Model::retire_ops`]).
    DeleteServer { id: u64 },
    /// Create a table row. Its tablets follow as `PutTablet`s.
    PutTable {
        id: u64,
        name: String,
        schema: Option<insitu_protocol::schema::Schema>,
    },
    /// Remove a table and all its tablets.
    DeleteTable { id: u64 },
    /// Set the indexed columns of a table (ascending; empty: none).
    PutIndexes { table: u64, columns: Vec<u16> },
    /// Insert or replace tablet `index` of `table` (index <= current count).
    PutTablet {
        table: u64,
        index: u32,
        tablet: Tablet,
    },
    /// Record or update the move of tablet `index` of `table`.
    PutMove {
        table: u64,
        index: u32,
        record: MoveRecord,
    },
    /// The move of tablet `index` of `table` is finished or undone.
    DeleteMove { table: u64, index: u32 },
    /// Tablet `index` of `table` was lost with dead server `master` and is to
    /// be recovered from that master's replicas (`recovery.rs`); or, with
    /// `master` its live owner, was recovered and its replay is held by that
    /// owner's backups, writes not yet activated (`recovery/finish.rs`).
    PutLostFrom { table: u64, index: u32, master: u64 },
    /// The recovery of tablet `index` of `table` is committed and activated
    /// for reads and writes.
    DeleteLostFrom { table: u64, index: u32 },
    /// Tablet `index` of `table` was re-created empty: its objects died
    /// with server `master`, which held them in memory only (`lost.rs`).
    PutDataLost { table: u64, index: u32, master: u64 },
    /// An operator acknowledged that loss (`AckLoss`).
    DeleteDataLost { table: u64, index: u32 },
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    pub tables: BTreeMap<u64, Table>,
    pub by_name: HashMap<String, u64>,
    /// Server id -> one address per shard.
    pub servers: BTreeMap<u64, Vec<String>>,
    /// Server id -> the identity it keeps in its `--dir` (absent: none sent).
    pub identities: BTreeMap<u64, String>,
    /// Server id -> its backup service's address (absent: none sent).
    pub backup_addrs: BTreeMap<u64, String>,
    /// Servers declared dead, still on record until their tablets are recovered.
    pub dead: BTreeSet<u64>,
    /// Moves in progress, by (table id, tablet index).
    pub moves: BTreeMap<(u64, u32), MoveRecord>,
    /// Tablets being recovered, by (table id, tablet index): the dead master
    /// whose replicas hold them. Such a tablet is orphaned (clients get
    /// `Retry`, never an empty re-creation) until its new owner is committed,
    /// and keeps its entry until that owner is activated for writes; from
    /// when the owner's backups hold the replay the entry names the owner
    /// (`recovery/finish.rs`).
    pub lost_from: BTreeMap<(u64, u32), u64>,
    /// Tablets re-created empty whose objects were lost, by (table id,
    /// tablet index): the dead server that held them in memory only. Kept
    /// until an operator acknowledges the loss; the owner answers reads of
    /// missing keys `DataLost` meanwhile (`lost.rs`).
    pub data_lost: BTreeMap<(u64, u32), u64>,
    /// Highest version floor handed to a lost tablet (`LOST_VERSION_FLOOR`).
    pub lost_version_floor: u64,
    pub next_table_id: u64,
    pub next_server_id: u64,
    pub map_version: u64,
    /// Random, created with the database: backups label replicas with it.
    pub cluster_id: u64,
    /// Replicas per segment (R); 0 = in-memory only.
    pub replicas: u32,
}

impl Model {
    pub fn empty() -> Model {
        Model {
            next_table_id: 1,
            next_server_id: 1,
            ..Model::default()
        }
    }

    /// Apply committed changes. Ops that make no sense (unknown table, index
    /// gap) are impossible here because the caller builds them from this
    /// model under the metadata lock; they are ignored rather than panicking.
    pub fn apply(&mut self, ops: &[Op]) {
        for op in ops {
            match op {
                Op::Counter(name, value) => match *name {
                    NEXT_TABLE_ID => self.next_table_id = *value,
                    NEXT_SERVER_ID => self.next_server_id = *value,
                    MAP_VERSION => self.map_version = *value,
                    CLUSTER_ID => self.cluster_id = *value,
                    REPLICAS => self.replicas = u32::try_from(*value).unwrap_or(u32::MAX),
                    LOST_VERSION_FLOOR => self.lost_version_floor = *value,
                    other => tracing::error!(
                        counter = other,
                        "unknown counter in a change (ignored in memory)"
                    ),
                },
                Op::PutServer {
                    id,
                    shard_addrs,
                    identity,
                    backup_addr,
                } => {
                    self.servers.insert(*id, shard_addrs.clone());
                    if identity.is_empty() {
                        self.identities.remove(id);
                    } else {
                        self.identities.insert(*id, identity.clone());
                    }
                    if backup_addr.is_empty() {
                        self.backup_addrs.remove(id);
                    } else {
                        self.backup_addrs.insert(*id, backup_addr.clone());
                    }
                }
                Op::MarkDead { id } => {
                    if self.servers.contains_key(id) {
                        self.dead.insert(*id);
                    }
                }
                Op::DeleteServer { id } => {
                    self.servers.remove(id);
                    self.identities.remove(id);
                    self.backup_addrs.remove(id);
                    self.dead.remove(id);
                }
                Op::PutMove {
                    table,
                    index,
                    record,
                } => {
                    self.moves.insert((*table, *index), record.clone());
                }
                Op::DeleteMove { table, index } => {
                    self.moves.remove(&(*table, *index));
                }
                Op::PutLostFrom {
                    table,
                    index,
                    master,
                } => {
                    self.lost_from.insert((*table, *index), *master);
                }
                Op::DeleteLostFrom { table, index } => {
                    self.lost_from.remove(&(*table, *index));
                }
                Op::PutDataLost {
                    table,
                    index,
                    master,
                } => {
                    self.data_lost.insert((*table, *index), *master);
                }
                Op::DeleteDataLost { table, index } => {
                    self.data_lost.remove(&(*table, *index));
                }
                Op::PutTable { id, name, schema } => {
                    self.by_name.insert(name.clone(), *id);
                    self.tables.insert(
                        *id,
                        Table {
                            id: *id,
                            name: name.clone(),
                            tablets: Vec::new(),
                            schema: schema.clone(),
                            indexes: Vec::new(),
                        },
                    );
                }
                Op::PutIndexes { table, columns } => {
                    if let Some(t) = self.tables.get_mut(table) {
                        t.indexes = columns.clone();
                    }
                }
                Op::DeleteTable { id } => {
                    if let Some(table) = self.tables.remove(id) {
                        self.by_name.remove(&table.name);
                    }
                    self.moves.retain(|(table, _), _| table != id);
                    self.lost_from.retain(|(table, _), _| table != id);
                    self.data_lost.retain(|(table, _), _| table != id);
                }
                Op::PutTablet {
                    table,
                    index,
                    tablet,
                } => {
                    let Some(t) = self.tables.get_mut(table) else {
                        tracing::error!(
                            table,
                            "tablet change for an unknown table (ignored in memory)"
                        );
                        continue;
                    };
                    let index = *index as usize;
                    if index < t.tablets.len() {
                        t.tablets[index] = tablet.clone();
                    } else if index == t.tablets.len() {
                        t.tablets.push(tablet.clone());
                    } else {
                        tracing::error!(
                            table,
                            index,
                            "tablet index gap in a change (ignored in memory)"
                        );
                    }
                }
            }
        }
    }

    /// The changes that retire `servers`: each is forgotten and each of its
    /// tablets becomes orphaned under map version `version` (the caller also
    /// commits `Counter(MAP_VERSION, version)` or a later one).
    #[cfg(test)]
    pub fn retire_ops(&self, servers: &[u64], version: u64) -> Vec<Op> {
        let mut ops: Vec<Op> = servers.iter().map(|&id| Op::DeleteServer { id }).collect();
        for table in self.tables.values() {
            for (i, t) in table.tablets.iter().enumerate() {
                if !t.is_orphaned() && servers.contains(&t.server_id) {
                    ops.push(orphan_op(table.id, i as u32, t, version));
                }
            }
        }
        ops
    }

    /// The changes that make every tablet `dead` owns wait for recovery from
    /// its replicas: orphaned under map version `version` (the caller also
    /// commits `Counter(MAP_VERSION, version)`) and recorded in `lost_from`.
    /// May be part of the transaction that declares the server dead, so no
    /// client is ever sent to the dead address after that commit. With R = 0
    /// nothing holds the objects: each tablet is also recorded in
    /// `data_lost`, before anything is re-created (`lost.rs`).
    ///
    /// A tablet `dead` was recovering from an earlier dead master, whose row
    /// still names that master (its replay may not be held by `dead`'s
    /// backups, and no write was taken: `recovery/finish.rs`), keeps that
    /// row: it is recovered from that master's replicas again.
    pub fn lose_tablets_ops(&self, dead: u64, version: u64) -> Vec<Op> {
        let mut ops = Vec::new();
        for table in self.tables.values() {
            for (i, t) in table.tablets.iter().enumerate() {
                if t.server_id == dead && !t.is_orphaned() {
                    let index = i as u32;
                    ops.push(orphan_op(table.id, index, t, version));
                    let master = match self.lost_from.get(&(table.id, index)) {
                        Some(&earlier) => earlier,
                        None => dead,
                    };
                    if master == dead {
                        ops.push(Op::PutLostFrom {
                            table: table.id,
                            index,
                            master,
                        });
                    }
                    if self.replicas == 0 {
                        ops.push(Op::PutDataLost {
                            table: table.id,
                            index,
                            master,
                        });
                    }
                }
            }
        }
        ops
    }

    /// Check that loaded metadata is coherent: every table covers the hash
    /// space with contiguous tablets, each on a known shard or orphaned, and the counters are
    /// ahead of every id and version in use.
    pub fn validate(&self) -> Result<(), String> {
        if self.by_name.len() != self.tables.len() {
            return Err("two tables have the same name".into());
        }
        for table in self.tables.values() {
            let Some(first) = table.tablets.first() else {
                return Err(format!(
                    "table {} ({:?}) has no tablets",
                    table.id, table.name
                ));
            };
            if first.start_hash != 0 {
                return Err(format!(
                    "table {} ({:?}): first tablet starts at {:#x}, not 0",
                    table.id, table.name, first.start_hash
                ));
            }
            for (i, t) in table.tablets.iter().enumerate() {
                if t.start_hash > t.end_hash {
                    return Err(format!(
                        "table {} tablet {i}: start {:#x} > end {:#x}",
                        table.id, t.start_hash, t.end_hash
                    ));
                }
                let known = self
                    .servers
                    .get(&t.server_id)
                    .is_some_and(|a| (t.shard as usize) < a.len());
                if !t.is_orphaned() && !known {
                    return Err(format!(
                        "table {} tablet {i}: owner server {} shard {} is unknown",
                        table.id, t.server_id, t.shard
                    ));
                }
                if t.map_version > self.map_version {
                    return Err(format!(
                        "table {} tablet {i}: map version {} is ahead of the global {}",
                        table.id, t.map_version, self.map_version
                    ));
                }
                if let Some(next) = table.tablets.get(i + 1)
                    && t.end_hash.checked_add(1) != Some(next.start_hash)
                {
                    return Err(format!(
                        "table {} tablets {i} and {}: gap or overlap in the hash space",
                        table.id,
                        i + 1
                    ));
                }
            }
            if table.tablets.last().map(|t| t.end_hash) != Some(u64::MAX) {
                return Err(format!(
                    "table {} ({:?}): tablets do not reach the end of the hash space",
                    table.id, table.name
                ));
            }
            // Counted without the placement bit (`tables.rs`).
            if table.id & !insitu_keyhash::SLOT_PLACED >= self.next_table_id {
                return Err(format!(
                    "table id {} is not below next_table_id {}",
                    table.id, self.next_table_id
                ));
            }
            if insitu_keyhash::slot_placed(table.id)
                && let Some(t) = table
                    .tablets
                    .iter()
                    .find(|t| t.start_hash & ((1 << insitu_keyhash::SLOT_SHIFT) - 1) != 0)
            {
                return Err(format!(
                    "table {} ({:?}) is placed by slot, but tablet {:#x} does not start on a slot",
                    table.id, table.name, t.start_hash
                ));
            }
        }
        if let Some((&id, _)) = self.servers.last_key_value()
            && id >= self.next_server_id
        {
            return Err(format!(
                "server id {id} is not below next_server_id {}",
                self.next_server_id
            ));
        }
        if let Some(id) = self.dead.iter().find(|id| !self.servers.contains_key(id)) {
            return Err(format!("dead server {id} is not on record"));
        }
        Ok(())
    }
}

/// The change that orphans tablet `index` of `table` (`t`) under map version
/// `version`: retiring a server and losing one orphan tablets the same way.
pub(crate) fn orphan_op(table: u64, index: u32, t: &Tablet, version: u64) -> Op {
    Op::PutTablet {
        table,
        index,
        tablet: t.placed(ORPHANED, 0, version),
    }
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
