//! What the coordinator asks of its model: which servers are live and
//! where their shards listen, which tablets are orphaned or await recovery,
//! a server's tablets, tables and servers as the wire describes them, and
//! the placement slots and shard loads new tablets are placed by.

use insitu_protocol::{ServerInfo, ServerState, TableInfo, TabletInfo};

use super::{Model, Tablet};

impl Model {
    /// Whether `server_id` is on record and not declared dead.
    pub fn is_live(&self, server_id: u64) -> bool {
        self.servers.contains_key(&server_id) && !self.dead.contains(&server_id)
    }

    /// Ids of the live servers, ascending.
    pub fn live_servers(&self) -> Vec<u64> {
        self.servers
            .keys()
            .copied()
            .filter(|id| !self.dead.contains(id))
            .collect()
    }

    /// Address of a LIVE server's shard, if both exist: every caller uses it
    /// to reach the shard, and a dead server's shards must not be asked.
    pub fn shard_addr(&self, server_id: u64, shard: u32) -> Option<&str> {
        if self.dead.contains(&server_id) {
            return None;
        }
        self.servers
            .get(&server_id)?
            .get(shard as usize)
            .map(String::as_str)
    }

    /// Every orphaned tablet that is not being recovered from replicas (see
    /// `lost_from`): the ones to re-create empty. (table id, index, tablet),
    /// by table id then index.
    pub fn orphaned_tablets(&self) -> Vec<(u64, u32, Tablet)> {
        self.tablets_where(|table, index, t| {
            t.is_orphaned() && !self.lost_from.contains_key(&(table, index))
        })
    }

    /// Every tablet that `keep(table id, index, tablet)` accepts: (table id,
    /// index, tablet), by table id then index. The one walk behind the
    /// listings of tablets by owner or state.
    fn tablets_where(&self, keep: impl Fn(u64, u32, &Tablet) -> bool) -> Vec<(u64, u32, Tablet)> {
        let keep = &keep;
        self.tables
            .values()
            .flat_map(|table| {
                table
                    .tablets
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (table.id, i as u32, t))
                    .filter(move |&(id, i, t)| keep(id, i, t))
                    .map(|(id, i, t)| (id, i, t.clone()))
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

    /// Index of the first tablet of table `id` that no live server holds
    /// (orphaned, or owned by a dead server awaiting recovery), if any.
    pub fn first_orphan(&self, id: u64) -> Option<usize> {
        self.tables
            .get(&id)?
            .tablets
            .iter()
            .position(|t| t.is_orphaned() || self.dead.contains(&t.server_id))
    }

    /// Names of the tables (by id) with a tablet no live server holds:
    /// orphaned, or owned by a dead server awaiting recovery.
    pub fn awaiting_recovery_table_names(&self) -> Vec<String> {
        self.tables
            .values()
            .filter(|t| self.first_orphan(t.id).is_some())
            .map(|t| t.name.clone())
            .collect()
    }

    #[cfg(test)]
    /// Every tablet owned by `server_id`: (table id, index, tablet), by table id then index.
    pub fn tablets_of(&self, server_id: u64) -> Vec<(u64, u32, Tablet)> {
        self.tablets_where(|_, _, t| t.server_id == server_id)
    }

    /// The map of table `id`. An orphaned tablet is listed with server id
    /// [`ORPHANED`](super::ORPHANED) (0) and an empty `addr`.
    pub fn table_info(&self, id: u64) -> Option<TableInfo> {
        let table = self.tables.get(&id)?;
        let tablets = table
            .tablets
            .iter()
            .enumerate()
            .map(|(i, t)| TabletInfo {
                start_hash: t.start_hash,
                end_hash: t.end_hash,
                server_id: t.server_id,
                shard: t.shard,
                addr: self
                    .shard_addr(t.server_id, t.shard)
                    .unwrap_or_default()
                    .to_string(),
                map_version: t.map_version,
                lost_from: self.data_lost.get(&(id, i as u32)).copied().unwrap_or(0),
            })
            .collect();
        Some(TableInfo {
            id,
            name: table.name.clone(),
            tablets,
            map_version: self.map_version,
            schema: table.schema.clone(),
            indexes: table.indexes.clone(),
        })
    }

    pub fn server_infos(&self) -> Vec<ServerInfo> {
        self.servers
            .iter()
            .map(|(id, addrs)| ServerInfo {
                id: *id,
                shard_addrs: addrs.clone(),
                backup_addr: self.backup_addrs.get(id).cloned().unwrap_or_default(),
                state: if self.dead.contains(id) {
                    ServerState::Dead
                } else {
                    ServerState::Up
                },
            })
            .collect()
    }

    /// Every (server, shard) pair of the live servers in placement order:
    /// shard 0 of every server (by id), then shard 1 of every server that has
    /// one, and so on, so that consecutive tablets land on different servers first.
    pub fn placement_slots(&self) -> Vec<(u64, u32)> {
        let live = || {
            self.servers
                .iter()
                .filter(|(id, _)| !self.dead.contains(id))
        };
        let max_shards = live().map(|(_, a)| a.len()).max().unwrap_or(0);
        let mut slots = Vec::new();
        for shard in 0..max_shards {
            for (id, addrs) in live() {
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
}
