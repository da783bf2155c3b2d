//! Durable metadata: an embedded redb database at `DIR/coordinator.redb`.
//!
//! # Layout (redb tables)
//!
//! | redb table | key                          | value                                                      |
//! |------------|------------------------------|------------------------------------------------------------|
//! | `counters` | `&str` counter name          | `u64`                                                      |
//! | `servers`  | `u64` server id              | `Vec<&str>`: one `host:port` per shard, by shard index     |
//! | `tables`   | `u64` table id               | `&str` table name                                          |
//! | `tablets`  | `(u64 table id, u32 index)`  | `(u64 start_hash, u64 end_hash, u64 server_id, u32 shard, u64 map_version)` |
//! | `server_identities` | `u64` server id     | `&str`: the identity the server keeps in its `--dir`         |
//! | `moves`    | `(u64 table id, u32 index)`  | `(u64 start_hash, u64 end_hash, u64 old server_id, u32 old shard, u64 old map_version, u64 dest server_id, u32 dest shard, u64 committed_version)` |
//! | `lost_from` | `(u64 table id, u32 index)` | `u64`: the dead master whose replicas hold the tablet (being recovered) |
//!
//! Counters:
//! - `layout_version`: version of this layout (currently 1); a database with
//!   another value is refused.
//! - `next_table_id`, `next_server_id`: the next id to hand out (ids start at
//!   1 and are never reused, even when a create fails or a table is dropped).
//! - `map_version`: the global tablet-map version, bumped by every create,
//!   drop, move, server retirement and re-homing; it never goes back.
//!
//! A tablet row with `server_id` 0 (server ids start at 1) is *orphaned*: its
//! server was retired (its process is gone) and no server holds it yet; its
//! `shard` is 0. It is re-homed, empty, when a server enlists.
//!
//! A table's tablets are rows `(table id, 0..n)`, ordered by index, which is
//! also the order of `start_hash`; together they cover `0..=u64::MAX`.
//! A tablet's `map_version` is the global version at its last assignment.
//!
//! A `moves` row exists while a tablet move is in progress: written before its
//! first step with `committed_version` 0, rewritten with the destination's map
//! version in the transaction that commits the new owner, deleted when the
//! move is finished or undone. A coordinator that starts with rows there
//! reconciles them (see `reconcile.rs`). A `lost_from` row exists from the
//! transaction that orphans a dead server's tablet until its recovered copy
//! is activated on its new owner (see `recovery.rs`). `server_identities`,
//! `moves` and `lost_from` were added without changing the layout version: an
//! older database simply has none, and they are created empty on open.
//!
//! Every metadata change is one write transaction (`Store::commit`), committed
//! with redb's default durability (fsync) before the coordinator replies.

use std::path::Path;

use anyhow::{Context, bail};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::model::{
    MAP_VERSION, Model, MoveRecord, NEXT_SERVER_ID, NEXT_TABLE_ID, Op, Table, Tablet,
};

const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const SERVERS: TableDefinition<u64, Vec<&str>> = TableDefinition::new("servers");
const TABLES: TableDefinition<u64, &str> = TableDefinition::new("tables");
/// `(table id, index)`.
type TabletKey = (u64, u32);
/// `(start_hash, end_hash, server_id, shard, map_version)`.
type TabletRow = (u64, u64, u64, u32, u64);
const TABLETS: TableDefinition<TabletKey, TabletRow> = TableDefinition::new("tablets");
const IDENTITIES: TableDefinition<u64, &str> = TableDefinition::new("server_identities");
/// `(start_hash, end_hash, old server_id, old shard, old map_version, dest
/// server_id, dest shard, committed_version)`, keyed like `tablets`.
type MoveRow = (u64, u64, u64, u32, u64, u64, u32, u64);
const MOVES: TableDefinition<TabletKey, MoveRow> = TableDefinition::new("moves");
/// Tablets being recovered: the dead master whose replicas hold them.
const LOST_FROM: TableDefinition<TabletKey, u64> = TableDefinition::new("lost_from");

const LAYOUT_VERSION: &str = "layout_version";
const LAYOUT: u64 = 1;

pub const DB_FILE: &str = "coordinator.redb";

pub struct Store {
    db: Database,
}

impl Store {
    /// Open (or create) the database in `dir` and load the whole model.
    /// Blocking: call from a blocking thread.
    pub fn open(dir: &Path) -> anyhow::Result<(Store, Model)> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating coordinator directory {}", dir.display()))?;
        let path = dir.join(DB_FILE);
        let db = Database::builder()
            // A damaged file is reported as an error instead of being trusted.
            .set_check_integrity_on_open(true)
            .create(&path)
            .with_context(|| format!("opening coordinator metadata {}", path.display()))?;
        let store = Store { db };
        store
            .init()
            .with_context(|| format!("initialising {}", path.display()))?;
        let model = store
            .load()
            .with_context(|| format!("loading coordinator metadata from {}", path.display()))?;
        Ok((store, model))
    }

    /// Create the redb tables and the layout version if this is a new database.
    fn init(&self) -> anyhow::Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut counters = txn.open_table(COUNTERS)?;
            let layout = counters.get(LAYOUT_VERSION)?.map(|v| v.value());
            match layout {
                None => {
                    counters.insert(LAYOUT_VERSION, LAYOUT)?;
                }
                Some(LAYOUT) => {}
                Some(other) => bail!(
                    "metadata layout version {other} is not supported (this coordinator reads version {LAYOUT})"
                ),
            }
            txn.open_table(SERVERS)?;
            txn.open_table(TABLES)?;
            txn.open_table(TABLETS)?;
            txn.open_table(IDENTITIES)?;
            txn.open_table(MOVES)?;
            txn.open_table(LOST_FROM)?;
        }
        txn.commit()?;
        Ok(())
    }

    fn load(&self) -> anyhow::Result<Model> {
        let txn = self.db.begin_read()?;
        let mut model = Model::empty();

        let counters = txn.open_table(COUNTERS)?;
        let counter = |name: &str| -> anyhow::Result<Option<u64>> {
            Ok(counters.get(name)?.map(|v| v.value()))
        };
        if let Some(v) = counter(NEXT_TABLE_ID)? {
            model.next_table_id = v;
        }
        if let Some(v) = counter(NEXT_SERVER_ID)? {
            model.next_server_id = v;
        }
        if let Some(v) = counter(MAP_VERSION)? {
            model.map_version = v;
        }

        for row in txn.open_table(SERVERS)?.iter()? {
            let (id, addrs) = row?;
            let addrs: Vec<String> = addrs.value().into_iter().map(str::to_string).collect();
            model.servers.insert(id.value(), addrs);
        }

        for row in txn.open_table(TABLES)?.iter()? {
            let (id, name) = row?;
            let (id, name) = (id.value(), name.value().to_string());
            if model.by_name.insert(name.clone(), id).is_some() {
                bail!("two tables are named {name:?}");
            }
            model.tables.insert(
                id,
                Table {
                    id,
                    name,
                    tablets: Vec::new(),
                },
            );
        }

        for row in txn.open_table(TABLETS)?.iter()? {
            let (key, value) = row?;
            let (table_id, index) = key.value();
            let (start_hash, end_hash, server_id, shard, map_version) = value.value();
            let Some(table) = model.tables.get_mut(&table_id) else {
                bail!("tablet {index} belongs to table {table_id}, which does not exist");
            };
            if index as usize != table.tablets.len() {
                bail!(
                    "table {table_id}: tablet index {index} found where {} was expected",
                    table.tablets.len()
                );
            }
            table.tablets.push(Tablet {
                start_hash,
                end_hash,
                server_id,
                shard,
                map_version,
            });
        }

        for row in txn.open_table(IDENTITIES)?.iter()? {
            let (id, identity) = row?;
            model
                .identities
                .insert(id.value(), identity.value().to_string());
        }

        for row in txn.open_table(MOVES)?.iter()? {
            let (key, value) = row?;
            let (s, e, old_server, old_shard, old_version, dest_server, dest_shard, committed) =
                value.value();
            model.moves.insert(
                key.value(),
                MoveRecord {
                    old: Tablet {
                        start_hash: s,
                        end_hash: e,
                        server_id: old_server,
                        shard: old_shard,
                        map_version: old_version,
                    },
                    dest_server,
                    dest_shard,
                    committed_version: committed,
                },
            );
        }

        for row in txn.open_table(LOST_FROM)?.iter()? {
            let (key, master) = row?;
            model.lost_from.insert(key.value(), master.value());
        }

        model
            .validate()
            .map_err(|e| anyhow::anyhow!("inconsistent metadata: {e}"))?;
        Ok(model)
    }

    /// Commit `ops` as one write transaction. Blocking: call from a blocking thread.
    pub fn commit(&self, ops: &[Op]) -> anyhow::Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut counters = txn.open_table(COUNTERS)?;
            let mut servers = txn.open_table(SERVERS)?;
            let mut tables = txn.open_table(TABLES)?;
            let mut tablets = txn.open_table(TABLETS)?;
            let mut identities = txn.open_table(IDENTITIES)?;
            let mut moves = txn.open_table(MOVES)?;
            let mut lost_from = txn.open_table(LOST_FROM)?;
            for op in ops {
                match op {
                    Op::Counter(name, value) => {
                        counters.insert(*name, *value)?;
                    }
                    Op::PutServer {
                        id,
                        shard_addrs,
                        identity,
                    } => {
                        let addrs: Vec<&str> = shard_addrs.iter().map(String::as_str).collect();
                        servers.insert(*id, addrs)?;
                        if identity.is_empty() {
                            identities.remove(*id)?;
                        } else {
                            identities.insert(*id, identity.as_str())?;
                        }
                    }
                    Op::DeleteServer { id } => {
                        servers.remove(*id)?;
                        identities.remove(*id)?;
                    }
                    Op::PutMove {
                        table,
                        index,
                        record: r,
                    } => {
                        moves.insert(
                            (*table, *index),
                            (
                                r.old.start_hash,
                                r.old.end_hash,
                                r.old.server_id,
                                r.old.shard,
                                r.old.map_version,
                                r.dest_server,
                                r.dest_shard,
                                r.committed_version,
                            ),
                        )?;
                    }
                    Op::DeleteMove { table, index } => {
                        moves.remove((*table, *index))?;
                    }
                    Op::PutLostFrom {
                        table,
                        index,
                        master,
                    } => {
                        lost_from.insert((*table, *index), *master)?;
                    }
                    Op::DeleteLostFrom { table, index } => {
                        lost_from.remove((*table, *index))?;
                    }
                    Op::PutTable { id, name } => {
                        tables.insert(*id, name.as_str())?;
                    }
                    Op::DeleteTable { id } => {
                        tables.remove(*id)?;
                        tablets.retain_in((*id, 0u32)..=(*id, u32::MAX), |_, _| false)?;
                        moves.retain_in((*id, 0u32)..=(*id, u32::MAX), |_, _| false)?;
                        lost_from.retain_in((*id, 0u32)..=(*id, u32::MAX), |_, _| false)?;
                    }
                    Op::PutTablet {
                        table,
                        index,
                        tablet,
                    } => {
                        let t = tablet;
                        tablets.insert(
                            (*table, *index),
                            (
                                t.start_hash,
                                t.end_hash,
                                t.server_id,
                                t.shard,
                                t.map_version,
                            ),
                        )?;
                    }
                }
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Close the database, reporting any error. Blocking.
    pub fn close(self) -> anyhow::Result<()> {
        self.db.close()?;
        Ok(())
    }
}
