//! Durable metadata: an embedded redb database at `DIR/coordinator.redb`.
//!
//! # Layout (redb tables)
//!
//! | redb table | key                          | value                                                      |
//! |------------|------------------------------|------------------------------------------------------------|
//! | `counters` | `&str` counter name          | `u64`                                                      |
//! | `servers`  | `u64` server id              | `Vec<&str>`: one `host:port` per shard, by shard index     |
//! | `tables`   | `u64` table id               | `&str` table name                                          |
//! | `table_schemas` | `u64` table id          | `&[u8]`: a typed table's `Schema`, postcard (no row: untyped) |
//! | `table_indexes` | `u64` table id         | `&[u8]`: the indexed columns, postcard `Vec<u16>` ascending (no row: none) |
//! | `tablets`  | `(u64 table id, u32 index)`  | `(u64 start_hash, u64 end_hash, u64 server_id, u32 shard, u64 map_version)` |
//! | `server_identities` | `u64` server id     | `&str`: the identity the server keeps in its `--dir`         |
//! | `server_backup_addrs` | `u64` server id | `&str`: its backup service's `host:port` (no row: none) |
//! | `dead_servers` | `u64` server id        | `()`: the server was declared dead (kept until its tablets are recovered) |
//! | `moves`    | `(u64 table id, u32 index)`  | `(u64 start_hash, u64 end_hash, u64 old server_id, u32 old shard, u64 old map_version, u64 dest server_id, u32 dest shard, u64 committed_version)` |
//! | `lost_from` | `(u64 table id, u32 index)` | `u64`: the server whose replicas hold the tablet while it is recovered: the dead master, then its new owner until writes are activated |
//! | `data_lost` | `(u64 table id, u32 index)` | `u64`: the dead server that held the tablet's objects in memory only (R = 0); kept until an operator acknowledges the loss |
//!
//! Counters:
//! - `layout_version`: version of this layout (currently 1); a database with
//!   another value is refused.
//! - `next_table_id`, `next_server_id`: the next id to hand out (ids start at
//!   1 and are never reused, even when a create fails or a table is dropped).
//! - `map_version`: the global tablet-map version, bumped by every create,
//!   drop, move, server retirement and re-homing; it never goes back.
//! - `cluster_id`: random, non-zero, written when the database is created
//!   (or first opened by a coordinator that knows it); never changes, so
//!   backups can refuse replicas of another cluster.
//! - `replicas`: R, replicas per segment, as last configured: the configured
//!   value wins at every open (the change is logged).
//! - `lost_version_floor`: the highest version floor handed to a tablet
//!   re-created empty after a loss (`lost.rs`); only grows; no row: 0.
//! - `timestamp_reservation`: the timestamp oracle's high-water mark: every
//!   timestamp ever handed out is below it (`oracle.rs`). Only grows; no row:
//!   0 (none handed out yet). Written by the oracle alone, in a transaction
//!   of its own (`Store::reserve_timestamps`), never through `Op`.
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
//! is activated for writes on its new owner (see `recovery/finish.rs`). `server_identities`,
//! `moves`, `server_backup_addrs`, `dead_servers`, `lost_from`, `data_lost`, `table_schemas` and `table_indexes` were added
//! without changing the layout version: an older database simply has none,
//! and they are created empty on open (likewise the `cluster_id` and
//! `replicas` counters; `timestamp_reservation` is read as 0 until the
//! oracle first writes it).
//!
//! A server in `dead_servers` stays in `servers` until recovery forgets it:
//! its tablets still name it (whose replicas to read) but nothing is routed to it.
//!
//! Every metadata change is one write transaction (`Store::commit`), committed
//! with redb's default durability (fsync) before the coordinator replies.

use std::path::Path;

use anyhow::{Context, bail};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::model::{
    CLUSTER_ID, LOST_VERSION_FLOOR, MAP_VERSION, Model, MoveRecord, NEXT_SERVER_ID, NEXT_TABLE_ID,
    Op, REPLICAS, Table, Tablet,
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
const BACKUP_ADDRS: TableDefinition<u64, &str> = TableDefinition::new("server_backup_addrs");
const DEAD: TableDefinition<u64, ()> = TableDefinition::new("dead_servers");
/// Tablets being recovered: the dead master whose replicas hold them.
const LOST_FROM: TableDefinition<TabletKey, u64> = TableDefinition::new("lost_from");
/// Tablets re-created empty after a loss: the dead server that held them.
const DATA_LOST: TableDefinition<TabletKey, u64> = TableDefinition::new("data_lost");
/// A typed table's schema, postcard-encoded (`insitu_protocol::schema::Schema`).
const SCHEMAS: TableDefinition<u64, &[u8]> = TableDefinition::new("table_schemas");
/// A typed table's indexed columns, postcard-encoded `Vec<u16>`.
const INDEXES: TableDefinition<u64, &[u8]> = TableDefinition::new("table_indexes");

/// Counter: the timestamp oracle's reservation (see the module docs).
const TIMESTAMP_RESERVATION: &str = "timestamp_reservation";

const LAYOUT_VERSION: &str = "layout_version";
const LAYOUT: u64 = 1;

pub const DB_FILE: &str = "coordinator.redb";

pub struct Store {
    db: Database,
}

/// What opening the database found and settled, for the start-up log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// True if this open created the cluster id (a new cluster).
    pub new_cluster: bool,
    /// R on record before this open, if any (differs from the model's when
    /// the configuration changed it).
    pub previous_replicas: Option<u32>,
    /// The timestamp oracle's reservation on record (0: none yet): every
    /// timestamp handed out before this open is below it (`oracle.rs`).
    pub timestamp_reservation: u64,
}

impl Store {
    /// Open (or create) the database in `dir`, settle the cluster id (created
    /// if missing) and R (`replicas`, the configured value wins), and load the
    /// whole model. Blocking: call from a blocking thread.
    pub fn open(dir: &Path, replicas: u32) -> anyhow::Result<(Store, Model, Opened)> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating coordinator directory {}", dir.display()))?;
        let path = dir.join(DB_FILE);
        let db = Database::builder()
            // A damaged file is reported as an error instead of being trusted.
            .set_check_integrity_on_open(true)
            .create(&path)
            .with_context(|| format!("opening coordinator metadata {}", path.display()))?;
        let store = Store { db };
        let opened = store
            .init(replicas)
            .with_context(|| format!("initialising {}", path.display()))?;
        let model = store
            .load()
            .with_context(|| format!("loading coordinator metadata from {}", path.display()))?;
        Ok((store, model, opened))
    }

    /// Create the redb tables and the layout version if this is a new
    /// database; create the cluster id if missing; record `replicas`.
    fn init(&self, replicas: u32) -> anyhow::Result<Opened> {
        let txn = self.db.begin_write()?;
        let opened;
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
            let new_cluster = counters.get(CLUSTER_ID)?.is_none();
            if new_cluster {
                counters.insert(CLUSTER_ID, random_cluster_id())?;
            }
            let previous_replicas = counters
                .get(REPLICAS)?
                .map(|v| u32::try_from(v.value()).unwrap_or(u32::MAX));
            counters.insert(REPLICAS, u64::from(replicas))?;
            let timestamp_reservation = counters
                .get(TIMESTAMP_RESERVATION)?
                .map_or(0, |v| v.value());
            opened = Opened {
                new_cluster,
                previous_replicas,
                timestamp_reservation,
            };
            txn.open_table(SERVERS)?;
            txn.open_table(TABLES)?;
            txn.open_table(SCHEMAS)?;
            txn.open_table(INDEXES)?;
            txn.open_table(TABLETS)?;
            txn.open_table(IDENTITIES)?;
            txn.open_table(MOVES)?;
            txn.open_table(BACKUP_ADDRS)?;
            txn.open_table(DEAD)?;
            txn.open_table(LOST_FROM)?;
            txn.open_table(DATA_LOST)?;
        }
        txn.commit()?;
        Ok(opened)
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
        model.cluster_id = counter(CLUSTER_ID)?.context("the cluster id is missing")?;
        model.lost_version_floor = counter(LOST_VERSION_FLOOR)?.unwrap_or(0);
        model.replicas = counter(REPLICAS)?
            .and_then(|v| u32::try_from(v).ok())
            .context("R (replicas) is missing or out of range")?;

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
                    schema: None,
                    indexes: Vec::new(),
                },
            );
        }

        for row in txn.open_table(SCHEMAS)?.iter()? {
            let (id, bytes) = row?;
            let id = id.value();
            let schema: insitu_protocol::schema::Schema = postcard::from_bytes(bytes.value())
                .with_context(|| format!("the schema of table {id} does not decode"))?;
            schema
                .check()
                .map_err(|e| anyhow::anyhow!("the schema of table {id} is not valid: {e}"))?;
            let Some(table) = model.tables.get_mut(&id) else {
                bail!("a schema for table {id}, which does not exist");
            };
            table.schema = Some(schema);
        }

        for row in txn.open_table(INDEXES)?.iter()? {
            let (id, bytes) = row?;
            let id = id.value();
            let columns: Vec<u16> = postcard::from_bytes(bytes.value())
                .with_context(|| format!("the indexes of table {id} do not decode"))?;
            let Some(table) = model.tables.get_mut(&id) else {
                bail!("indexes for table {id}, which does not exist");
            };
            let width = table.schema.as_ref().map_or(0, |s| s.columns.len());
            if columns.iter().any(|&c| c as usize >= width) || !columns.is_sorted() {
                bail!("the indexes of table {id} name columns it does not have: {columns:?}");
            }
            table.indexes = columns;
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

        for row in txn.open_table(BACKUP_ADDRS)?.iter()? {
            let (id, addr) = row?;
            model
                .backup_addrs
                .insert(id.value(), addr.value().to_string());
        }

        for row in txn.open_table(DEAD)?.iter()? {
            model.dead.insert(row?.0.value());
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

        for row in txn.open_table(DATA_LOST)?.iter()? {
            let (key, master) = row?;
            model.data_lost.insert(key.value(), master.value());
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
            let mut schemas = txn.open_table(SCHEMAS)?;
            let mut indexes = txn.open_table(INDEXES)?;
            let mut tablets = txn.open_table(TABLETS)?;
            let mut identities = txn.open_table(IDENTITIES)?;
            let mut moves = txn.open_table(MOVES)?;
            let mut backup_addrs = txn.open_table(BACKUP_ADDRS)?;
            let mut dead = txn.open_table(DEAD)?;
            let mut lost_from = txn.open_table(LOST_FROM)?;
            let mut data_lost = txn.open_table(DATA_LOST)?;
            for op in ops {
                match op {
                    Op::Counter(name, value) => {
                        counters.insert(*name, *value)?;
                    }
                    Op::PutServer {
                        id,
                        shard_addrs,
                        identity,
                        backup_addr,
                    } => {
                        let addrs: Vec<&str> = shard_addrs.iter().map(String::as_str).collect();
                        servers.insert(*id, addrs)?;
                        if identity.is_empty() {
                            identities.remove(*id)?;
                        } else {
                            identities.insert(*id, identity.as_str())?;
                        }
                        if backup_addr.is_empty() {
                            backup_addrs.remove(*id)?;
                        } else {
                            backup_addrs.insert(*id, backup_addr.as_str())?;
                        }
                    }
                    Op::MarkDead { id } => {
                        // Like `Model::apply`: only a server on record can be dead.
                        if servers.get(*id)?.is_some() {
                            dead.insert(*id, ())?;
                        }
                    }
                    Op::DeleteServer { id } => {
                        servers.remove(*id)?;
                        identities.remove(*id)?;
                        backup_addrs.remove(*id)?;
                        dead.remove(*id)?;
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
                    Op::PutDataLost {
                        table,
                        index,
                        master,
                    } => {
                        data_lost.insert((*table, *index), *master)?;
                    }
                    Op::DeleteDataLost { table, index } => {
                        data_lost.remove((*table, *index))?;
                    }
                    Op::PutTable { id, name, schema } => {
                        tables.insert(*id, name.as_str())?;
                        if let Some(schema) = schema {
                            let bytes = postcard::to_stdvec(schema)?;
                            schemas.insert(*id, bytes.as_slice())?;
                        }
                    }
                    Op::PutIndexes { table, columns } => {
                        if columns.is_empty() {
                            indexes.remove(*table)?;
                        } else {
                            let bytes = postcard::to_stdvec(columns)?;
                            indexes.insert(*table, bytes.as_slice())?;
                        }
                    }
                    Op::DeleteTable { id } => {
                        tables.remove(*id)?;
                        schemas.remove(*id)?;
                        indexes.remove(*id)?;
                        tablets.retain_in((*id, 0u32)..=(*id, u32::MAX), |_, _| false)?;
                        moves.retain_in((*id, 0u32)..=(*id, u32::MAX), |_, _| false)?;
                        lost_from.retain_in((*id, 0u32)..=(*id, u32::MAX), |_, _| false)?;
                        data_lost.retain_in((*id, 0u32)..=(*id, u32::MAX), |_, _| false)?;
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

    /// Record `reservation` as the timestamp oracle's high-water mark, in a
    /// write transaction of its own, durably (fsync) before returning. A
    /// value not above the one on record changes nothing (it only grows), so
    /// a late write can never lower it. Blocking: call from a blocking thread.
    pub fn reserve_timestamps(&self, reservation: u64) -> anyhow::Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut counters = txn.open_table(COUNTERS)?;
            let on_record = counters
                .get(TIMESTAMP_RESERVATION)?
                .map_or(0, |v| v.value());
            if reservation > on_record {
                counters.insert(TIMESTAMP_RESERVATION, reservation)?;
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

/// A random non-zero cluster id: std's per-process random hash keys mixed
/// with the time and the process id (uniqueness, not secrecy, is needed; no
/// extra dependency).
fn random_cluster_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_id_is_kept_and_replicas_follow_the_configuration() {
        let dir = std::env::temp_dir().join(format!("insitu-store-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (store, model, opened) = Store::open(&dir, 3).unwrap();
        assert!(opened.new_cluster);
        assert_eq!(opened.previous_replicas, None);
        assert_ne!(model.cluster_id, 0);
        assert_eq!(model.replicas, 3);
        let cluster = model.cluster_id;
        store.close().unwrap();

        let (store, model, opened) = Store::open(&dir, 1).unwrap();
        assert!(!opened.new_cluster);
        assert_eq!(opened.previous_replicas, Some(3), "R was persisted");
        assert_eq!((model.cluster_id, model.replicas), (cluster, 1));
        store.close().unwrap();
        let (_store, model, opened) = Store::open(&dir, 1).unwrap();
        assert_eq!(opened.previous_replicas, Some(1));
        assert_eq!(model.cluster_id, cluster);
        drop(_store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
