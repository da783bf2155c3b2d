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

use std::collections::{BTreeMap, HashMap};

use insitu_protocol::{ServerInfo, TableInfo, TabletInfo};

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
}

/// Names of the rows of the `counters` table.
pub const NEXT_TABLE_ID: &str = "next_table_id";
pub const NEXT_SERVER_ID: &str = "next_server_id";
pub const MAP_VERSION: &str = "map_version";

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
    },
    /// Forget a (retired) server. Its tablets are orphaned by `PutTablet`s in
    /// the same change (see [`Model::retire_ops`]).
    DeleteServer { id: u64 },
    /// Create a table row. Its tablets follow as `PutTablet`s.
    PutTable { id: u64, name: String },
    /// Remove a table and all its tablets.
    DeleteTable { id: u64 },
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
    /// be recovered from that master's replicas (`recovery.rs`).
    PutLostFrom { table: u64, index: u32, master: u64 },
    /// The recovery of tablet `index` of `table` is committed and activated.
    DeleteLostFrom { table: u64, index: u32 },
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    pub tables: BTreeMap<u64, Table>,
    pub by_name: HashMap<String, u64>,
    /// Server id -> one address per shard.
    pub servers: BTreeMap<u64, Vec<String>>,
    /// Server id -> the identity it keeps in its `--dir` (absent: none sent).
    pub identities: BTreeMap<u64, String>,
    /// Moves in progress, by (table id, tablet index).
    pub moves: BTreeMap<(u64, u32), MoveRecord>,
    /// Tablets being recovered, by (table id, tablet index): the dead master
    /// whose replicas hold them. Such a tablet is orphaned (clients get
    /// `Retry`, never an empty re-creation) until its new owner is committed,
    /// and keeps its entry until that owner is activated (`recovery.rs`).
    pub lost_from: BTreeMap<(u64, u32), u64>,
    pub next_table_id: u64,
    pub next_server_id: u64,
    pub map_version: u64,
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
                    other => tracing::error!(
                        counter = other,
                        "unknown counter in a change (ignored in memory)"
                    ),
                },
                Op::PutServer {
                    id,
                    shard_addrs,
                    identity,
                } => {
                    self.servers.insert(*id, shard_addrs.clone());
                    if identity.is_empty() {
                        self.identities.remove(id);
                    } else {
                        self.identities.insert(*id, identity.clone());
                    }
                }
                Op::DeleteServer { id } => {
                    self.servers.remove(id);
                    self.identities.remove(id);
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
                Op::PutTable { id, name } => {
                    self.by_name.insert(name.clone(), *id);
                    self.tables.insert(
                        *id,
                        Table {
                            id: *id,
                            name: name.clone(),
                            tablets: Vec::new(),
                        },
                    );
                }
                Op::DeleteTable { id } => {
                    if let Some(table) = self.tables.remove(id) {
                        self.by_name.remove(&table.name);
                    }
                    self.moves.retain(|(table, _), _| table != id);
                    self.lost_from.retain(|(table, _), _| table != id);
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

    /// Address of a server's shard, if both exist.
    pub fn shard_addr(&self, server_id: u64, shard: u32) -> Option<&str> {
        self.servers
            .get(&server_id)?
            .get(shard as usize)
            .map(String::as_str)
    }

    /// The changes that retire `servers`: each is forgotten and each of its
    /// tablets becomes orphaned under map version `version` (the caller also
    /// commits `Counter(MAP_VERSION, version)` or a later one).
    pub fn retire_ops(&self, servers: &[u64], version: u64) -> Vec<Op> {
        let mut ops: Vec<Op> = servers.iter().map(|&id| Op::DeleteServer { id }).collect();
        for table in self.tables.values() {
            for (i, t) in table.tablets.iter().enumerate() {
                if !t.is_orphaned() && servers.contains(&t.server_id) {
                    ops.push(Op::PutTablet {
                        table: table.id,
                        index: i as u32,
                        tablet: Tablet {
                            server_id: ORPHANED,
                            shard: 0,
                            map_version: version,
                            ..t.clone()
                        },
                    });
                }
            }
        }
        ops
    }

    /// The changes that make every tablet `dead` owns wait for recovery from
    /// its replicas: orphaned under map version `version` (the caller also
    /// commits `Counter(MAP_VERSION, version)`) and recorded in `lost_from`.
    /// May be part of the transaction that declares the server dead, so no
    /// client is ever sent to the dead address after that commit.
    pub fn lose_tablets_ops(&self, dead: u64, version: u64) -> Vec<Op> {
        let mut ops = Vec::new();
        for table in self.tables.values() {
            for (i, t) in table.tablets.iter().enumerate() {
                if t.server_id == dead && !t.is_orphaned() {
                    ops.push(Op::PutTablet {
                        table: table.id,
                        index: i as u32,
                        tablet: Tablet {
                            server_id: ORPHANED,
                            shard: 0,
                            map_version: version,
                            ..t.clone()
                        },
                    });
                    ops.push(Op::PutLostFrom {
                        table: table.id,
                        index: i as u32,
                        master: dead,
                    });
                }
            }
        }
        ops
    }

    /// Every orphaned tablet that is not being recovered from replicas (see
    /// `lost_from`): the ones to re-create empty. (table id, index, tablet),
    /// by table id then index.
    pub fn orphaned_tablets(&self) -> Vec<(u64, u32, Tablet)> {
        self.tables
            .values()
            .flat_map(|table| {
                table
                    .tablets
                    .iter()
                    .enumerate()
                    .filter(|(i, t)| {
                        t.is_orphaned() && !self.lost_from.contains_key(&(table.id, *i as u32))
                    })
                    .map(|(i, t)| (table.id, i as u32, t.clone()))
            })
            .collect()
    }

    /// Names of the tables that have at least one orphaned tablet, by table id.
    pub fn orphaned_table_names(&self) -> Vec<String> {
        self.tables
            .values()
            .filter(|t| t.tablets.iter().any(Tablet::is_orphaned))
            .map(|t| t.name.clone())
            .collect()
    }

    /// Index of the first orphaned tablet of table `id`, if any.
    pub fn first_orphan(&self, id: u64) -> Option<usize> {
        self.tables
            .get(&id)?
            .tablets
            .iter()
            .position(Tablet::is_orphaned)
    }

    /// The map of table `id`. An orphaned tablet is listed with server id
    /// [`ORPHANED`] (0) and an empty `addr`.
    pub fn table_info(&self, id: u64) -> Option<TableInfo> {
        let table = self.tables.get(&id)?;
        let tablets = table
            .tablets
            .iter()
            .map(|t| TabletInfo {
                start_hash: t.start_hash,
                end_hash: t.end_hash,
                server_id: t.server_id,
                shard: t.shard,
                addr: self
                    .shard_addr(t.server_id, t.shard)
                    .unwrap_or_default()
                    .to_string(),
                map_version: t.map_version,
            })
            .collect();
        Some(TableInfo {
            id,
            name: table.name.clone(),
            tablets,
            map_version: self.map_version,
        })
    }

    pub fn server_infos(&self) -> Vec<ServerInfo> {
        self.servers
            .iter()
            .map(|(id, addrs)| ServerInfo {
                id: *id,
                shard_addrs: addrs.clone(),
                backup_addr: String::new(),
                state: insitu_protocol::ServerState::Up,
            })
            .collect()
    }

    /// Every (server, shard) pair in placement order: shard 0 of every server
    /// (by id), then shard 1 of every server that has one, and so on, so that
    /// consecutive tablets land on different servers first.
    pub fn placement_slots(&self) -> Vec<(u64, u32)> {
        let max_shards = self.servers.values().map(Vec::len).max().unwrap_or(0);
        let mut slots = Vec::new();
        for shard in 0..max_shards {
            for (id, addrs) in &self.servers {
                if shard < addrs.len() {
                    slots.push((*id, shard as u32));
                }
            }
        }
        slots
    }

    /// How many tablets (of all tables) each shard of `server_id` owns.
    pub fn shard_loads(&self, server_id: u64) -> Vec<usize> {
        let shards = self.servers.get(&server_id).map(Vec::len).unwrap_or(0);
        let mut loads = vec![0usize; shards];
        for table in self.tables.values() {
            for t in &table.tablets {
                if t.server_id == server_id
                    && let Some(load) = loads.get_mut(t.shard as usize)
                {
                    *load += 1;
                }
            }
        }
        loads
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
                if !t.is_orphaned() && self.shard_addr(t.server_id, t.shard).is_none() {
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
            if table.id >= self.next_table_id {
                return Err(format!(
                    "table id {} is not below next_table_id {}",
                    table.id, self.next_table_id
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_with_servers(shards: &[usize]) -> Model {
        let mut m = Model::empty();
        for (i, n) in shards.iter().enumerate() {
            let id = i as u64 + 1;
            m.apply(&[
                Op::PutServer {
                    id,
                    shard_addrs: (0..*n)
                        .map(|s| format!("127.0.0.1:{}", 1000 + 10 * id + s as u64))
                        .collect(),
                    identity: String::new(),
                },
                Op::Counter(NEXT_SERVER_ID, id + 1),
            ]);
        }
        m
    }

    #[test]
    fn placement_alternates_servers_first() {
        let m = model_with_servers(&[2, 1, 3]);
        assert_eq!(
            m.placement_slots(),
            vec![(1, 0), (2, 0), (3, 0), (1, 1), (3, 1), (3, 2)]
        );
        assert!(Model::empty().placement_slots().is_empty());
    }

    #[test]
    fn validate_rejects_gaps_and_unknown_owners() {
        let mut m = model_with_servers(&[1]);
        let tablet = |start, end| Tablet {
            start_hash: start,
            end_hash: end,
            server_id: 1,
            shard: 0,
            map_version: 1,
        };
        m.apply(&[
            Op::Counter(MAP_VERSION, 1),
            Op::Counter(NEXT_TABLE_ID, 2),
            Op::PutTable {
                id: 1,
                name: "t".into(),
            },
            Op::PutTablet {
                table: 1,
                index: 0,
                tablet: tablet(0, 99),
            },
            Op::PutTablet {
                table: 1,
                index: 1,
                tablet: tablet(100, u64::MAX),
            },
        ]);
        assert_eq!(m.validate(), Ok(()));
        assert_eq!(m.shard_loads(1), vec![2]);

        let mut gap = m.clone();
        gap.apply(&[Op::PutTablet {
            table: 1,
            index: 1,
            tablet: tablet(101, u64::MAX),
        }]);
        assert!(gap.validate().unwrap_err().contains("gap"));

        let mut orphan = m.clone();
        orphan.apply(&[Op::PutTablet {
            table: 1,
            index: 0,
            tablet: Tablet {
                shard: 5,
                ..tablet(0, 99)
            },
        }]);
        assert!(orphan.validate().unwrap_err().contains("unknown"));

        let mut dropped = m.clone();
        dropped.apply(&[Op::DeleteTable { id: 1 }]);
        assert!(dropped.tables.is_empty() && dropped.by_name.is_empty());

        // Retiring the owner orphans both tablets; that is coherent.
        let mut retired = m.clone();
        let mut ops = m.retire_ops(&[1], 2);
        ops.push(Op::Counter(MAP_VERSION, 2));
        retired.apply(&ops);
        assert_eq!(retired.validate(), Ok(()));
        assert!(retired.servers.is_empty());
        assert_eq!(retired.orphaned_tablets().len(), 2);
        assert_eq!(retired.orphaned_table_names(), vec!["t".to_string()]);
        assert_eq!(retired.first_orphan(1), Some(0));
        let info = retired.table_info(1).unwrap();
        assert!(
            info.tablets
                .iter()
                .all(|t| t.addr.is_empty() && t.server_id == ORPHANED && t.map_version == 2)
        );
        assert_eq!(m.first_orphan(1), None);
        // But an orphan's version may not run ahead of the global one.
        let mut ahead = m.clone();
        ahead.apply(&m.retire_ops(&[1], 7));
        assert!(ahead.validate().unwrap_err().contains("ahead"));
    }
}
