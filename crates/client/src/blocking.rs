//! A blocking wrapper around `Client` for code without an async runtime.

use std::future::Future;
use std::sync::Arc;

use insitu_protocol::plan::{AggPartial, Field, PointLayout, UpdateAction};
use insitu_protocol::{RejectRules, ServerInfo, ShardStats, TableInfo};

use crate::client::{Client, ClientConfig, Found, PerItem};
use crate::cursor::{Object, TableCursor};
use crate::error::ClientError;
use crate::ops::{Selection, TrainedModel};
use crate::snapshot::Snapshot;
use crate::txn::Transaction;
use bytes::Bytes;

/// The same operations as `Client`, each blocking the calling thread.
///
/// It owns a tokio current-thread runtime that runs only while a call is in
/// progress (connections are served during calls, idle in between).
///
/// **Do not use it inside an async context** (a tokio task or any code
/// already driven by a runtime): blocking there panics ("Cannot start a
/// runtime from within a runtime") or stalls that runtime. Use `Client` there.
/// Dropping the last clone must also happen outside an async context.
#[derive(Clone)]
pub struct BlockingClient {
    /// The runtime every call is driven on; shared by clones and cursors.
    runtime: Arc<tokio::runtime::Runtime>,
    /// The async client doing the work.
    client: Client,
}

/// `TableCursor`, blocking.
pub struct BlockingTableCursor {
    /// The runtime the cursor's requests are driven on.
    runtime: Arc<tokio::runtime::Runtime>,
    /// The async cursor.
    cursor: TableCursor,
}

impl BlockingTableCursor {
    pub fn next_batch(&mut self) -> Result<Option<Vec<Object>>, ClientError> {
        self.runtime.block_on(self.cursor.next_batch())
    }

    pub fn is_done(&self) -> bool {
        self.cursor.is_done()
    }
}

/// `Transaction`, blocking (`BlockingClient::begin`).
pub struct BlockingTransaction {
    /// The runtime the transaction's requests are driven on.
    runtime: Arc<tokio::runtime::Runtime>,
    /// The async transaction.
    tx: Transaction,
}

impl BlockingTransaction {
    pub fn read(
        &mut self,
        table: u64,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<Bytes>, ClientError> {
        self.runtime.block_on(self.tx.read(table, key))
    }

    pub fn read_many<K: AsRef<[u8]>>(
        &mut self,
        table: u64,
        keys: &[K],
    ) -> Result<Vec<Option<Bytes>>, ClientError> {
        self.runtime.block_on(self.tx.read_many(table, keys))
    }

    pub fn write(&mut self, table: u64, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.tx.write(table, key, value)
    }

    /// `Transaction::write_expiring`.
    pub fn write_expiring(
        &mut self,
        table: u64,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        expires_at_ms: u64,
    ) {
        self.tx.write_expiring(table, key, value, expires_at_ms)
    }

    pub fn remove(&mut self, table: u64, key: impl AsRef<[u8]>) {
        self.tx.remove(table, key)
    }

    pub fn commit(self) -> Result<(), ClientError> {
        self.runtime.block_on(self.tx.commit())
    }
}

/// `Snapshot`, blocking (`BlockingClient::snapshot`): reads as of one
/// timestamp, never aborted by writes.
#[derive(Clone)]
pub struct BlockingSnapshot {
    /// The runtime the snapshot's requests are driven on.
    runtime: Arc<tokio::runtime::Runtime>,
    /// The async snapshot.
    snap: Snapshot,
}

impl BlockingSnapshot {
    pub fn ts(&self) -> u64 {
        self.snap.ts()
    }

    pub fn read(&self, table: u64, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, ClientError> {
        self.runtime.block_on(self.snap.read(table, key))
    }

    pub fn multi_read<K: AsRef<[u8]>>(
        &self,
        table: u64,
        keys: &[K],
    ) -> Result<PerItem<Found>, ClientError> {
        self.runtime.block_on(self.snap.multi_read(table, keys))
    }

    pub fn count(&self, table: u64, sel: &Selection) -> Result<u64, ClientError> {
        self.runtime.block_on(self.snap.count(table, sel))
    }

    pub fn aggregate(
        &self,
        table: u64,
        field: Field,
        sel: &Selection,
    ) -> Result<AggPartial, ClientError> {
        self.runtime
            .block_on(self.snap.aggregate(table, field, sel))
    }

    pub fn aggregate_json(
        &self,
        table: u64,
        path: insitu_protocol::plan::JsonPath,
        sel: &Selection,
    ) -> Result<AggPartial, ClientError> {
        self.runtime
            .block_on(self.snap.aggregate_json(table, path, sel))
    }
}

impl BlockingClient {
    /// A snapshot at a fresh timestamp (`Client::snapshot`). Retrying a
    /// refused one (`SnapshotTooOld`) is the caller's loop here.
    pub fn snapshot(&self) -> Result<BlockingSnapshot, ClientError> {
        Ok(BlockingSnapshot {
            runtime: self.runtime.clone(),
            snap: self.runtime.block_on(self.client.snapshot())?,
        })
    }

    /// A snapshot at `ts`, a timestamp from the oracle (`Client::snapshot_at`:
    /// refused for 0 and for a timestamp not yet handed out).
    pub fn snapshot_at(&self, ts: u64) -> Result<BlockingSnapshot, ClientError> {
        Ok(BlockingSnapshot {
            runtime: self.runtime.clone(),
            snap: self.runtime.block_on(self.client.snapshot_at(ts))?,
        })
    }

    /// Start a transaction (see `Client::begin`; retrying on conflicts is
    /// the caller's loop here, with `crate::txn::is_retryable`).
    pub fn begin(&self) -> BlockingTransaction {
        BlockingTransaction {
            runtime: self.runtime.clone(),
            tx: self.client.begin(),
        }
    }

    /// Like `Client::connect`: presents `INSITU_AUTH_TOKEN` if it is set.
    pub fn connect(coordinator_addr: &str) -> Result<BlockingClient, ClientError> {
        BlockingClient::connect_with(coordinator_addr, ClientConfig::default().with_env_token()?)
    }

    pub fn connect_with(
        coordinator_addr: &str,
        config: ClientConfig,
    ) -> Result<BlockingClient, ClientError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Runtime(e.to_string()))?;
        let client = runtime.block_on(Client::connect_with(coordinator_addr, config))?;
        Ok(BlockingClient {
            runtime: Arc::new(runtime),
            client,
        })
    }

    fn run<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Drive `f` to completion on this client's runtime: for async work
    /// built on `async_client` (e.g. a SQL session) that this wrapper has no
    /// blocking call for. Blocks the calling thread.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.run(f)
    }

    /// The async client inside (to be used only on this wrapper's runtime).
    pub fn async_client(&self) -> &Client {
        &self.client
    }

    /// A fresh timestamp from the coordinator's oracle (`Client::timestamp`).
    pub fn timestamp(&self) -> Result<u64, ClientError> {
        self.run(self.client.timestamp())
    }

    pub fn create_table(&self, name: &str, tablets: u32) -> Result<TableInfo, ClientError> {
        self.run(self.client.create_table(name, tablets))
    }

    pub fn drop_table(&self, name: &str) -> Result<(), ClientError> {
        self.run(self.client.drop_table(name))
    }

    /// See `Client::ack_loss`.
    pub fn ack_loss(&self, name: &str) -> Result<u32, ClientError> {
        self.run(self.client.ack_loss(name))
    }

    /// See `Client::accept_loss`.
    pub fn accept_loss(&self, name: &str) -> Result<u32, ClientError> {
        self.run(self.client.accept_loss(name))
    }

    pub fn list_tables(&self) -> Result<Vec<TableInfo>, ClientError> {
        self.run(self.client.list_tables())
    }

    pub fn open_table(&self, name: &str) -> Result<TableInfo, ClientError> {
        self.run(self.client.open_table(name))
    }

    pub fn table_id(&self, name: &str) -> Result<u64, ClientError> {
        self.run(self.client.table_id(name))
    }

    pub fn list_servers(&self) -> Result<Vec<ServerInfo>, ClientError> {
        self.run(self.client.list_servers())
    }

    pub fn move_tablet(
        &self,
        table_name: &str,
        tablet_index: u32,
        server_id: u64,
    ) -> Result<(), ClientError> {
        self.run(self.client.move_tablet(table_name, tablet_index, server_id))
    }

    pub fn shard_stats(&self, addr: &str) -> Result<ShardStats, ClientError> {
        self.run(self.client.shard_stats(addr))
    }

    pub fn read(&self, table: u64, key: impl AsRef<[u8]>) -> Result<Found, ClientError> {
        self.run(self.client.read(table, key))
    }

    pub fn write(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<u64, ClientError> {
        self.run(self.client.write(table, key, value))
    }

    pub fn write_with(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        rules: RejectRules,
    ) -> Result<u64, ClientError> {
        self.run(self.client.write_with(table, key, value, rules))
    }

    /// `Client::write_expiring`.
    pub fn write_expiring(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        expires_at_ms: u64,
        rules: RejectRules,
    ) -> Result<u64, ClientError> {
        self.run(
            self.client
                .write_expiring(table, key, value, expires_at_ms, rules),
        )
    }

    /// `Client::read_expiring`: (value, version, deadline in Unix ms or 0).
    pub fn read_expiring(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<(Bytes, u64, u64)>, ClientError> {
        self.run(self.client.read_expiring(table, key))
    }

    pub fn remove(&self, table: u64, key: impl AsRef<[u8]>) -> Result<Option<u64>, ClientError> {
        self.run(self.client.remove(table, key))
    }

    pub fn remove_with(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        rules: RejectRules,
    ) -> Result<Option<u64>, ClientError> {
        self.run(self.client.remove_with(table, key, rules))
    }

    pub fn increment_i64(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        delta: i64,
    ) -> Result<(i64, u64), ClientError> {
        self.run(self.client.increment_i64(table, key, delta))
    }

    pub fn increment_f64(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
        delta: f64,
    ) -> Result<(f64, u64), ClientError> {
        self.run(self.client.increment_f64(table, key, delta))
    }

    pub fn multi_read<K: AsRef<[u8]>>(
        &self,
        table: u64,
        keys: &[K],
    ) -> Result<PerItem<Found>, ClientError> {
        self.run(self.client.multi_read(table, keys))
    }

    pub fn multi_write<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        table: u64,
        items: &[(K, V)],
    ) -> Result<PerItem<u64>, ClientError> {
        self.run(self.client.multi_write(table, items))
    }

    pub fn multi_remove<K: AsRef<[u8]>>(
        &self,
        table: u64,
        keys: &[K],
    ) -> Result<PerItem<Option<u64>>, ClientError> {
        self.run(self.client.multi_remove(table, keys))
    }

    pub fn enumerate(&self, table: u64) -> BlockingTableCursor {
        BlockingTableCursor {
            runtime: self.runtime.clone(),
            cursor: self.client.enumerate(table),
        }
    }

    pub fn cursor(&self, table: u64) -> Result<BlockingTableCursor, ClientError> {
        let cursor = self.run(self.client.cursor(table))?;
        Ok(BlockingTableCursor {
            runtime: self.runtime.clone(),
            cursor,
        })
    }

    pub fn scan(&self, table: u64, limit: usize) -> Result<Vec<Object>, ClientError> {
        self.run(self.client.scan(table, limit))
    }

    pub fn count(&self, table: u64, sel: &Selection) -> Result<u64, ClientError> {
        self.run(self.client.count(table, sel))
    }

    pub fn aggregate(
        &self,
        table: u64,
        field: Field,
        sel: &Selection,
    ) -> Result<AggPartial, ClientError> {
        self.run(self.client.aggregate(table, field, sel))
    }

    pub fn aggregate_json(
        &self,
        table: u64,
        path: insitu_protocol::plan::JsonPath,
        sel: &Selection,
    ) -> Result<AggPartial, ClientError> {
        self.run(self.client.aggregate_json(table, path, sel))
    }

    pub fn update(
        &self,
        table: u64,
        field: Field,
        action: UpdateAction,
        sel: &Selection,
    ) -> Result<u64, ClientError> {
        self.run(self.client.update(table, field, action, sel))
    }

    pub fn remove_where(&self, table: u64, sel: &Selection) -> Result<u64, ClientError> {
        self.run(self.client.remove_where(table, sel))
    }

    pub fn train_logreg(
        &self,
        table: u64,
        layout: PointLayout,
        iterations: u32,
        rate: f64,
    ) -> Result<TrainedModel, ClientError> {
        self.run(self.client.train_logreg(table, layout, iterations, rate))
    }
}
