//! Tables: create and drop, and the shard calls they share.

use futures::future::join_all;
use insitu_keyhash::{HashRange, SLOT_PLACED, SLOTS};
use insitu_protocol::schema::Schema;
use insitu_protocol::{Request, Response, Status, TabletState};
use tracing::{info, warn};

use crate::model::{MAP_VERSION, NEXT_TABLE_ID, Op, Tablet};
use crate::service::{Coordinator, MAX_TABLETS, Reject, Reply, unknown_table, validate_name};
use crate::shards::{CONTROL_TIMEOUT, CallError};

impl Coordinator {
    pub(crate) async fn create_table(
        &self,
        name: String,
        count: u32,
        schema: Option<Schema>,
        by_slot: bool,
    ) -> Reply {
        validate_name(&name)?;
        if let Some(schema) = &schema {
            schema
                .check()
                .map_err(|e| Reject::bad(format!("bad schema for table {name:?}: {e}")))?;
        }
        if count == 0 || count > MAX_TABLETS {
            return Err(Reject::bad(format!(
                "a table needs 1 to {MAX_TABLETS} tablets, got {count}"
            )));
        }
        if by_slot && (schema.is_some() || count > u32::from(SLOTS)) {
            return Err(Reject::bad(format!(
                "a table placed by hash slot is untyped and has at most {SLOTS} tablets \
                 (got {count}{})",
                if schema.is_some() {
                    ", with a schema"
                } else {
                    ""
                }
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
        // Ids are counted without the placement bit; `next_table_id` stays
        // far below it (a table a nanosecond for a century is 2^62).
        assert!(id & SLOT_PLACED == 0, "table ids reached the placement bit");
        let id = if by_slot { id | SLOT_PLACED } else { id };
        // Reserve the id and the version first, so that even if this create
        // fails half-way (and a shard keeps a copy we could not drop), neither
        // is ever handed out again.
        self.commit(
            &guard,
            vec![
                Op::Counter(NEXT_TABLE_ID, (id & !SLOT_PLACED) + 1),
                Op::Counter(MAP_VERSION, version),
            ],
        )
        .await?;

        let ranges = if by_slot {
            // `count` <= SLOTS, checked above.
            HashRange::split_slots(count as u16)
        } else {
            HashRange::split_even(u64::from(count))
        };
        // A slot-placed table's tablets go to the shards in blocks, server by
        // server: each server then serves one run of slots (what a Redis
        // Cluster client expects to see, and one line of `CLUSTER SLOTS`).
        // Other tables' go round-robin, so the first tablets of every table
        // do not all land on the first server.
        let mut by_server = slots.clone();
        by_server.sort_unstable();
        let tablet_count = ranges.len();
        let tablets: Vec<Tablet> = ranges
            .into_iter()
            .enumerate()
            .map(|(i, range)| {
                let (server_id, shard) = if by_slot {
                    by_server[i * by_server.len() / tablet_count]
                } else {
                    slots[i % slots.len()]
                };
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
                migration: 0,
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
            schema,
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

    pub(crate) async fn drop_table(&self, name: String) -> Reply {
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
                // An orphaned tablet, or a dead server's, is held by no live shard.
                .filter_map(|t| {
                    let addr = model.shard_addr(t.server_id, t.shard)?;
                    Some((t.start_hash, addr.to_string()))
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
    pub(crate) async fn drop_tablets<'a>(
        &self,
        table: u64,
        tablets: impl Iterator<Item = (u64, &'a str)>,
    ) {
        let calls = tablets.map(|(start_hash, addr)| async move {
            if let Err(e) = self
                .shards
                .call(
                    addr,
                    &Request::DropTablet {
                        table,
                        start_hash,
                        only_if_not_serving: false,
                    },
                    CONTROL_TIMEOUT,
                )
                .await
            {
                warn!(table, start_hash, addr, "DropTablet failed: {e}");
            }
        });
        join_all(calls).await;
    }

    pub(crate) fn addrs_of(&self, tablets: &[Tablet]) -> Result<Vec<String>, Reject> {
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
}

impl Coordinator {
    /// Add (`create`) or remove a secondary index on `column` of `table`.
    /// Only the declaration is stored: shards build a tablet's index on its
    /// first probe and keep it in memory.
    pub(crate) async fn set_index(&self, table: String, column: String, create: bool) -> Reply {
        let guard = self.meta_lock.lock().await;
        let (id, columns, col) = {
            let model = self.model();
            let id = *model
                .by_name
                .get(&table)
                .ok_or_else(|| unknown_table(&table))?;
            let t = model.tables.get(&id).ok_or_else(|| unknown_table(&table))?;
            let Some(schema) = &t.schema else {
                return Err(Reject::bad(format!(
                    "table {table:?} is untyped: indexes need a typed table (created with --schema)"
                )));
            };
            let Some(col) = schema.columns.iter().position(|c| c.name == column) else {
                let names: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
                return Err(Reject::bad(format!(
                    "table {table:?} has no column {column:?} (columns: {})",
                    names.join(", ")
                )));
            };
            let col = col as u16;
            let ty = schema.columns[col as usize].ty;
            if create && ty == insitu_protocol::schema::ColumnType::Float64 {
                return Err(Reject::bad(format!(
                    "column {column:?} is float64: indexes are for exact values \
                     (integers, decimals, dates, text, bool)"
                )));
            }
            let mut columns = t.indexes.clone();
            match (create, columns.binary_search(&col)) {
                (true, Ok(_)) => {
                    return Err(Reject::bad(format!(
                        "column {column:?} of table {table:?} is already indexed"
                    )));
                }
                (true, Err(at)) => columns.insert(at, col),
                (false, Ok(at)) => {
                    columns.remove(at);
                }
                (false, Err(_)) => {
                    return Err(Reject::bad(format!(
                        "column {column:?} of table {table:?} has no index"
                    )));
                }
            }
            (id, columns, col)
        };
        self.commit(&guard, vec![Op::PutIndexes { table: id, columns }])
            .await?;
        drop(guard);
        info!(table = %table, column = %column, col, create, "index declaration changed");
        Ok(Response::Done)
    }
}
