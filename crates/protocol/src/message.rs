//! The messages: every request and response body, encoded with postcard.
//!
//! Byte strings borrow from the received frame (`Blob`), so decoding a
//! request copies no key or value.

use serde::{Deserialize, Serialize};

use crate::Status;

/// A byte string borrowed from a frame; encoded as varint length + bytes.
pub type Blob<'a> = &'a serde_bytes::Bytes;

/// Wrap a slice as a `Blob`.
#[inline]
pub fn blob(bytes: &[u8]) -> Blob<'_> {
    serde_bytes::Bytes::new(bytes)
}

/// Conditions that refuse a write, remove or increment (RAMCloud's reject rules).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectRules {
    pub exists: bool,
    pub doesnt_exist: bool,
    pub version_le_given: bool,
    pub version_ne_given: bool,
    pub given_version: u64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub enum Number {
    I64(i64),
    F64(f64),
}

/// Where a tablet lives and which map version placed it there.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TabletInfo {
    pub start_hash: u64,
    pub end_hash: u64,
    pub server_id: u64,
    /// Index of the owning shard (core) inside the server.
    pub shard: u32,
    /// Address of that shard, "host:port".
    pub addr: String,
    /// Map version of this tablet's last reassignment.
    pub map_version: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TableInfo {
    pub id: u64,
    pub name: String,
    /// Ordered by `start_hash`, covering the whole hash space.
    pub tablets: Vec<TabletInfo>,
    /// The coordinator's map version when this was read.
    pub map_version: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    pub id: u64,
    /// One address per shard; a tablet names its shard by index.
    pub shard_addrs: Vec<String>,
}

/// Whether a shard serves a tablet yet.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TabletState {
    /// Serving reads and writes.
    Active,
    /// Being filled by a migration; client operations get `Status::Retry`.
    Receiving,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TabletStat {
    pub table: u64,
    pub start_hash: u64,
    pub end_hash: u64,
    pub objects: u64,
    pub live_bytes: u64,
    pub segment_bytes: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ShardStats {
    pub tablets: Vec<TabletStat>,
    pub memory_budget_bytes: u64,
    pub segment_bytes: u64,
    pub live_bytes: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ReadResult<'a> {
    pub status: Status,
    pub version: u64,
    #[serde(borrow)]
    pub value: Blob<'a>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteResult {
    pub status: Status,
    pub version: u64,
}

/// An object as it travels in enumeration and migration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Object<'a> {
    #[serde(borrow)]
    pub key: Blob<'a>,
    #[serde(borrow)]
    pub value: Blob<'a>,
    pub version: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Request<'a> {
    Ping,

    // ---- data: client -> storage shard ----
    Read {
        table: u64,
        #[serde(borrow)]
        key: Blob<'a>,
    },
    Write {
        table: u64,
        #[serde(borrow)]
        key: Blob<'a>,
        #[serde(borrow)]
        value: Blob<'a>,
        rules: RejectRules,
    },
    Remove {
        table: u64,
        #[serde(borrow)]
        key: Blob<'a>,
        rules: RejectRules,
    },
    Increment {
        table: u64,
        #[serde(borrow)]
        key: Blob<'a>,
        delta: Number,
        rules: RejectRules,
    },
    MultiRead {
        table: u64,
        #[serde(borrow, deserialize_with = "crate::limits::multi_items")]
        keys: Vec<Blob<'a>>,
    },
    MultiWrite {
        table: u64,
        #[serde(borrow, deserialize_with = "crate::limits::multi_items")]
        items: Vec<(Blob<'a>, Blob<'a>)>,
    },
    MultiRemove {
        table: u64,
        #[serde(borrow, deserialize_with = "crate::limits::multi_items")]
        keys: Vec<Blob<'a>>,
    },
    /// Objects of one tablet with key hash >= `from_hash`, in hash order, up to
    /// about `max_bytes`; the response says where to continue.
    Enumerate {
        table: u64,
        tablet_start: u64,
        from_hash: u64,
        max_bytes: u32,
    },
    ShardStats,

    // ---- control: coordinator -> storage shard ----
    TakeTablet {
        table: u64,
        start_hash: u64,
        end_hash: u64,
        map_version: u64,
        state: TabletState,
    },
    DropTablet {
        table: u64,
        start_hash: u64,
        /// Drop only a copy that serves nothing here (receiving, or moved
        /// out): what clearing up after a move needs, so that it never drops
        /// a tablet that was assigned to this shard again meanwhile.
        only_if_not_serving: bool,
    },
    /// Freeze the tablet for writes and copy its objects to the shard at `dest_addr`.
    MigrateTablet {
        table: u64,
        start_hash: u64,
        dest_addr: String,
    },
    /// One batch of a migration: source shard -> destination shard.
    MigrateBatch {
        table: u64,
        start_hash: u64,
        next_version: u64,
        #[serde(borrow, deserialize_with = "crate::limits::multi_items")]
        objects: Vec<Object<'a>>,
    },
    ActivateTablet {
        table: u64,
        start_hash: u64,
        map_version: u64,
    },

    // ---- metadata: anyone -> coordinator ----
    Enlist {
        #[serde(deserialize_with = "crate::limits::shard_addrs")]
        shard_addrs: Vec<String>,
        /// The server's identity, kept in its data directory: the same value
        /// across restarts of one server, different for two servers. Empty:
        /// none (the coordinator then matches the server by address only).
        identity: String,
        /// Retire any registered server with another identity that claims one
        /// of these addresses (the operator says it is dead). Without it such
        /// an enlistment is refused.
        replace: bool,
    },
    CreateTable {
        name: String,
        tablets: u32,
    },
    DropTable {
        name: String,
    },
    OpenTable {
        name: String,
    },
    TableMap {
        table: u64,
    },
    ListTables,
    ListServers,
    MoveTablet {
        table: String,
        tablet_index: u32,
        server_id: u64,
    },

    // ---- data operations (pushdown): client -> storage shard ----
    /// Run `plan` over the tablet `start_hash..=end_hash` of `table`, which
    /// the client believes was placed by `map_version`. Refused with
    /// `StaleMap` / `UnknownTablet` if that does not match (before and after
    /// the scan), so a result is exact or an error.
    Scan {
        table: u64,
        start_hash: u64,
        end_hash: u64,
        map_version: u64,
        plan: crate::plan::ScanPlan,
        /// Names one update across resends, so a shard that already applied it
        /// answers with the remembered result instead of applying it again
        /// (0 = none: read-only plans).
        op_id: u64,
        /// Milliseconds the client still waits for the reply (0 = no limit):
        /// an update whose budget has passed stops before it writes anything.
        budget_ms: u32,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Response<'a> {
    Pong,
    /// The body of every reply whose header status is not `Ok`.
    Error {
        message: String,
    },
    Done,

    Read {
        version: u64,
        #[serde(borrow)]
        value: Blob<'a>,
    },
    Written {
        version: u64,
    },
    Removed {
        version: u64,
    },
    Incremented {
        value: Number,
        version: u64,
    },
    /// One result per key, in request order. Keys past the point where the
    /// reply would overflow the frame get `Status::Truncated`: ask again.
    MultiRead {
        #[serde(borrow)]
        results: Vec<ReadResult<'a>>,
    },
    MultiWrite {
        results: Vec<WriteResult>,
    },
    MultiRemove {
        results: Vec<WriteResult>,
    },
    /// `next_hash`: where to continue in this tablet, or None when it is exhausted.
    Enumerate {
        #[serde(borrow)]
        objects: Vec<Object<'a>>,
        next_hash: Option<u64>,
    },
    ShardStats(ShardStats),

    Enlisted {
        server_id: u64,
    },
    Table(TableInfo),
    Tables(Vec<TableInfo>),
    Servers(Vec<ServerInfo>),

    /// One tablet's partial result of a `Scan`.
    Scan(crate::plan::ScanResult),
}
