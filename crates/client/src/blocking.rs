//! A blocking wrapper around `Client` for code without an async runtime.

use std::future::Future;
use std::sync::Arc;

use insitu_protocol::plan::{AggPartial, Field, JsonPath, PointLayout, UpdateAction};
use insitu_protocol::{RejectRules, ServerInfo, ShardStats, TableInfo};

use crate::client::{Client, ClientConfig, Found, PerItem};
use crate::cursor::{Object, TableCursor};
use crate::error::ClientError;
use crate::ops::{Selection, TrainedModel};
use crate::snapshot::Snapshot;
use crate::txn::Transaction;
use bytes::Bytes;

/// Blocking methods that mirror the async value in `self.$inner`, one row
/// each, because dozens of them differ only in names. A row
/// `fn name(&self, args) -> T;` (or `&mut self`) becomes a `pub fn` returning
/// `Result<T, ClientError>` that drives `self.$inner.name(args)` on
/// `self.runtime`; a row `sync fn name(&mut self, args);` calls the plain
/// method straight through. Each row's own `self` token is reused in the body
/// (`$s`), as macro hygiene requires.
macro_rules! blocking {
    ($inner:ident;) => {};
    ($inner:ident; $(#[$doc:meta])* sync fn $name:ident
        (&mut $s:ident $(, $a:ident: $t:ty)*); $($rest:tt)*) => {
        blocking!(@fn sync [$(#[$doc])*] $name [] [&mut $s] $s [$($a: $t),*] $inner []);
        blocking!($inner; $($rest)*);
    };
    ($inner:ident; $(#[$doc:meta])* fn $name:ident $(<$($g:ident: $bd:path),+>)?
        (&mut $s:ident $(, $a:ident: $t:ty)*) -> $r:ty; $($rest:tt)*) => {
        blocking!(@fn run [$(#[$doc])*] $name [$($($g: $bd),+)?] [&mut $s] $s [$($a: $t),*]
            $inner [-> Result<$r, ClientError>]);
        blocking!($inner; $($rest)*);
    };
    ($inner:ident; $(#[$doc:meta])* fn $name:ident $(<$($g:ident: $bd:path),+>)?
        (&$s:ident $(, $a:ident: $t:ty)*) -> $r:ty; $($rest:tt)*) => {
        blocking!(@fn run [$(#[$doc])*] $name [$($($g: $bd),+)?] [&$s] $s [$($a: $t),*]
            $inner [-> Result<$r, ClientError>]);
        blocking!($inner; $($rest)*);
    };
    (@fn $mode:ident [$($attr:tt)*] $name:ident [$($gen:tt)*] [$($recv:tt)*] $s:ident
        [$($a:ident: $t:ty),*] $inner:ident [$($ret:tt)*]) => {
        $($attr)*
        pub fn $name<$($gen)*>($($recv)* $(, $a: $t)*) $($ret)* {
            blocking!(@call $mode $s, $s.$inner.$name($($a),*))
        }
    };
    (@call run $s:ident, $call:expr) => { $s.runtime.block_on($call) };
    (@call sync $s:ident, $call:expr) => { $call };
}

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
    blocking! { cursor;
        fn next_batch(&mut self) -> Option<Vec<Object>>;
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
    blocking! { tx;
        fn read(&mut self, table: u64, key: impl AsRef<[u8]>) -> Option<Bytes>;
        fn read_many<K: AsRef<[u8]>>(&mut self, table: u64, keys: &[K]) -> Vec<Option<Bytes>>;
        sync fn write(&mut self, table: u64, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>);
        /// `Transaction::write_expiring`.
        sync fn write_expiring(&mut self, table: u64, key: impl AsRef<[u8]>,
            value: impl AsRef<[u8]>, expires_at_ms: u64);
        sync fn remove(&mut self, table: u64, key: impl AsRef<[u8]>);
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

    blocking! { snap;
        fn read(&self, table: u64, key: impl AsRef<[u8]>) -> Option<Bytes>;
        fn multi_read<K: AsRef<[u8]>>(&self, table: u64, keys: &[K]) -> PerItem<Found>;
        fn count(&self, table: u64, sel: &Selection) -> u64;
        fn aggregate(&self, table: u64, field: Field, sel: &Selection) -> AggPartial;
        fn aggregate_json(&self, table: u64, path: JsonPath, sel: &Selection) -> AggPartial;
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

    blocking! { client;
        /// A fresh timestamp from the coordinator's oracle (`Client::timestamp`).
        fn timestamp(&self) -> u64;
        fn create_table(&self, name: &str, tablets: u32) -> TableInfo;
        fn drop_table(&self, name: &str) -> ();
        /// See `Client::ack_loss`.
        fn ack_loss(&self, name: &str) -> u32;
        /// See `Client::accept_loss`.
        fn accept_loss(&self, name: &str) -> u32;
        fn list_tables(&self) -> Vec<TableInfo>;
        fn open_table(&self, name: &str) -> TableInfo;
        fn table_id(&self, name: &str) -> u64;
        fn list_servers(&self) -> Vec<ServerInfo>;
        fn move_tablet(&self, table_name: &str, tablet_index: u32, server_id: u64) -> ();
        fn shard_stats(&self, addr: &str) -> ShardStats;
        fn read(&self, table: u64, key: impl AsRef<[u8]>) -> Found;
        fn write(&self, table: u64, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> u64;
        fn write_with(&self, table: u64, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>,
            rules: RejectRules) -> u64;
        /// `Client::write_expiring`.
        fn write_expiring(&self, table: u64, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>,
            expires_at_ms: u64, rules: RejectRules) -> u64;
        /// `Client::read_expiring`: (value, version, deadline in Unix ms or 0).
        fn read_expiring(&self, table: u64, key: impl AsRef<[u8]>) -> Option<(Bytes, u64, u64)>;
        fn remove(&self, table: u64, key: impl AsRef<[u8]>) -> Option<u64>;
        fn remove_with(&self, table: u64, key: impl AsRef<[u8]>, rules: RejectRules)
            -> Option<u64>;
        fn increment_i64(&self, table: u64, key: impl AsRef<[u8]>, delta: i64) -> (i64, u64);
        fn increment_f64(&self, table: u64, key: impl AsRef<[u8]>, delta: f64) -> (f64, u64);
        fn multi_read<K: AsRef<[u8]>>(&self, table: u64, keys: &[K]) -> PerItem<Found>;
        fn multi_write<K: AsRef<[u8]>, V: AsRef<[u8]>>(&self, table: u64, items: &[(K, V)])
            -> PerItem<u64>;
        fn multi_remove<K: AsRef<[u8]>>(&self, table: u64, keys: &[K]) -> PerItem<Option<u64>>;
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

    blocking! { client;
        fn scan(&self, table: u64, limit: usize) -> Vec<Object>;
        fn count(&self, table: u64, sel: &Selection) -> u64;
        fn aggregate(&self, table: u64, field: Field, sel: &Selection) -> AggPartial;
        fn aggregate_json(&self, table: u64, path: JsonPath, sel: &Selection) -> AggPartial;
        fn update(&self, table: u64, field: Field, action: UpdateAction, sel: &Selection) -> u64;
        fn remove_where(&self, table: u64, sel: &Selection) -> u64;
        fn train_logreg(&self, table: u64, layout: PointLayout, iterations: u32, rate: f64)
            -> TrainedModel;
    }
}
