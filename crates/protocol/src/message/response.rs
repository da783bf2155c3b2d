//! Every response body a shard, a backup port or the coordinator answers
//! with (the requests are in `message.rs`): apart so each enum's file holds
//! one side of the conversation.

use serde::{Deserialize, Serialize};

use super::Blob;
use super::fields::{
    LogDigest, Number, Object, ReadResult, ReplicaInfo, ServerInfo, ShardStats, TableInfo,
    WriteResult,
};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Response<'a> {
    Pong,
    /// `Hello` accepted. `member`: the connection may send cluster-internal
    /// requests (it presented the cluster credential, or the cluster runs
    /// without authentication).
    Welcome {
        member: bool,
    },
    /// The body of every reply whose header status is not `Ok`.
    Error {
        message: String,
    },
    Done,

    Read {
        version: u64,
        #[serde(borrow)]
        value: Blob<'a>,
        /// The object's deadline (Unix ms); 0: none.
        expires_at_ms: u64,
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
        /// The cluster's id (random, kept by the coordinator): backups label
        /// their replica files with it and refuse another cluster's.
        cluster_id: u64,
        /// Replicas per segment (R): 0 = in-memory only (cache mode).
        replicas: u32,
    },
    BackupReplicas {
        #[serde(deserialize_with = "crate::limits::replica_infos")]
        replicas: Vec<ReplicaInfo>,
        /// Per log of the master, the newest digest held (see
        /// `BackupOp::Digest`): how a recovery knows which segments to find.
        #[serde(deserialize_with = "crate::limits::log_digests")]
        digests: Vec<LogDigest>,
    },
    /// Bytes of a replica from the requested offset; `end`: no more follow.
    BackupBytes {
        #[serde(borrow)]
        bytes: Blob<'a>,
        end: bool,
    },
    /// A tablet recovered from replicas (`RecoverTablet`).
    Recovered {
        objects: u64,
        segments: u64,
        bytes: u64,
    },
    Table(TableInfo),
    Tables(Vec<TableInfo>),
    Servers(Vec<ServerInfo>),

    /// One tablet's partial result of a `Scan`.
    Scan(crate::plan::ScanResult),
    /// One page of one tablet's answer to a `Query`.
    Query(crate::query::QueryResult),

    /// A yes vote to `TxnPrepare`: the items are validated and locked.
    TxnPrepared {
        /// The shard kept versions for snapshot reads when it locked the
        /// items: the commit then needs a timestamp. When no participant
        /// did, it commits without one (0) and saves the oracle's round
        /// trip (ARCHITECTURE.md, "Snapshot reads", says why that is safe).
        needs_ts: bool,
    },
    /// The outcome of a transaction (`TxnDecide`, `TxnResolve`, a one-phase
    /// `TxnPrepare`): whether it committed.
    TxnDecided {
        committed: bool,
        /// The commit's timestamp (0: aborted, or committed without one: a
        /// one-phase commit on a shard where no snapshot was being read).
        commit_ts: u64,
    },
    /// Where a transaction stands on the participant asked (`TxnInquire`).
    TxnPhase(crate::txn::TxnPhase),

    /// The timestamps `first..first + count` (`count` as asked), each
    /// strictly greater than every timestamp handed out before the request
    /// was received, none of them 0 (see `Request::Timestamps`).
    Timestamps {
        first: u64,
        count: u32,
    },
    /// `AckLoss` done: how many tablets of the table had been marked lost
    /// (0: none was; acknowledging is idempotent).
    LossAcknowledged {
        tablets: u32,
    },
}
