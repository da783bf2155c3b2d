//! The messages: every request and response body, encoded with postcard.
//!
//! Byte strings borrow from the received frame (`Blob`), so decoding a
//! request copies no key or value.

use serde::{Deserialize, Serialize};

mod fields;
mod response;

pub use fields::{
    BackupOp, LogDigest, Number, Object, ReadResult, RejectRules, ReplicaInfo, ServerInfo,
    ServerState, ShardStats, SideRecord, TableInfo, TabletInfo, TabletStat, TabletState,
    WriteResult,
};
pub use fields::{LOST_FROM_EARLIER_RUN, lost_with};
pub use response::Response;

/// A byte string borrowed from a frame; encoded as varint length + bytes.
pub type Blob<'a> = &'a serde_bytes::Bytes;

/// Wrap a slice as a `Blob`.
#[inline]
pub fn blob(bytes: &[u8]) -> Blob<'_> {
    serde_bytes::Bytes::new(bytes)
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Request<'a> {
    Ping,
    /// The first request of a connection to a cluster that requires
    /// authentication: the client token (data and metadata requests) or the
    /// cluster credential (members: also control requests). Answered
    /// `Welcome`, or `Unauthenticated` and the connection is closed.
    Hello {
        #[serde(borrow)]
        token: Blob<'a>,
    },

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
        /// When the object stops existing, in Unix milliseconds; 0: never
        /// (one byte on the wire then). The server's clock decides.
        expires_at_ms: u64,
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
    /// The shard's figures. `reset_longest_call`: start a new window for
    /// `ShardStats::longest_point_call_us` after reading it (a benchmark
    /// brackets each case with two such requests; the status page does not).
    ShardStats {
        reset_longest_call: bool,
    },

    // ---- control: coordinator -> storage shard ----
    TakeTablet {
        table: u64,
        start_hash: u64,
        end_hash: u64,
        map_version: u64,
        state: TabletState,
        /// For `Receiving`: the move's id (nonzero, chosen by the coordinator
        /// per move attempt). The copy accepts only `MigrateBatch`es of this
        /// id, so a late batch of an aborted attempt can never land in (and
        /// bring deleted objects back into) a later attempt's copy. 0 otherwise.
        migration: u64,
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
        /// The move's id, as given to the destination's `TakeTablet`; every batch carries it.
        migration: u64,
    },
    /// One batch of a migration: source shard -> destination shard.
    MigrateBatch {
        table: u64,
        start_hash: u64,
        /// The move's id: must match the receiving copy's (see `TakeTablet`).
        migration: u64,
        next_version: u64,
        /// Every transaction commit applied to the tablet's objects has a
        /// timestamp at or below this: the snapshot floor the tablet starts
        /// with at its destination (snapshots taken before the move are
        /// still read there). None: not known, the destination learns a
        /// floor from the oracle after the move.
        commit_ts_bound: Option<u64>,
        #[serde(borrow, deserialize_with = "crate::limits::multi_items")]
        objects: Vec<Object<'a>>,
        /// The tablet's side records (transactions' decision records), in
        /// the batches after the objects.
        #[serde(borrow, deserialize_with = "crate::limits::multi_items")]
        records: Vec<SideRecord<'a>>,
    },
    /// The tablet (held `Receiving`, or frozen) serves under `map_version`.
    /// `writes` false: reads only, writes answered `Retry` (a recovered
    /// tablet whose replay the new owner's backups may not hold yet; the
    /// reply then leaves only once they do, so it tells the coordinator the
    /// replay is held). `writes` true: reads and writes, answered at once.
    ActivateTablet {
        table: u64,
        start_hash: u64,
        map_version: u64,
        writes: bool,
    },
    /// Recover a dead master's tablet into this shard: read the replicas of
    /// the tablet's log from `backups`, replay them, hold the tablet
    /// `Receiving` at `map_version` (the coordinator activates it after it
    /// commits the new owner). Answered `Recovered`.
    RecoverTablet {
        table: u64,
        start_hash: u64,
        end_hash: u64,
        map_version: u64,
        /// Server id of the dead master.
        master: u64,
        /// Backup service addresses of every live server.
        #[serde(deserialize_with = "crate::limits::shard_addrs")]
        backups: Vec<String>,
        /// An operator accepted the loss (`AcceptLoss`): recover what the
        /// backups hold even if the log's digest shows segments missing.
        accept_missing: bool,
    },
    /// A server was declared dead: re-replicate every segment that had a
    /// replica on it, and stop sending to it.
    ServerDown {
        server_id: u64,
    },

    // ---- replication: master shard -> backup; recovery -> backup ----
    /// Apply `ops` in order to the replicas of `master`. Answered `Done` once
    /// every op is held as the backup's sync mode promises (memory + bounded
    /// interval, or fsynced); `Fenced` if `master` was declared dead.
    BackupWrite {
        /// The cluster the master belongs to (a backup refuses another's).
        cluster: u64,
        master: u64,
        #[serde(borrow, deserialize_with = "crate::limits::backup_ops")]
        ops: Vec<BackupOp<'a>>,
    },
    /// The replicas held for `master`. `fence`: refuse every later
    /// `BackupWrite` from it (a recovery has started: a master that was
    /// declared dead but still runs can no longer make a write durable).
    BackupList {
        cluster: u64,
        master: u64,
        fence: bool,
    },
    /// Up to `max_bytes` of one replica from `offset`, verified first.
    BackupRead {
        cluster: u64,
        master: u64,
        log: u64,
        segment: u64,
        offset: u64,
        max_bytes: u32,
    },
    /// Delete every replica of `master` (its recovery is committed).
    BackupForget {
        cluster: u64,
        master: u64,
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
        /// Address of this server's backup service ("" = none: the server
        /// keeps no replicas for others).
        backup_addr: String,
    },
    /// The operator says a server is gone for good (`insitu server remove`):
    /// declare it dead now, recover its tablets, forget it.
    RemoveServer {
        server_id: u64,
    },
    CreateTable {
        name: String,
        tablets: u32,
        /// A typed table's schema; None = untyped (opaque values).
        schema: Option<crate::schema::Schema>,
        /// Place keys by Redis hash slot (`insitu_keyhash::SLOT_PLACED`):
        /// the id gets that bit and the tablets hold whole slots, so Redis
        /// Cluster clients can be told which server serves which slots
        /// (the RESP port's tables). At most 16,384 tablets then.
        by_slot: bool,
    },
    DropTable {
        name: String,
    },
    /// Declare a secondary index on `column` (by name) of typed table `table`
    /// (by name). Shards build it on first use and keep it up to date.
    CreateIndex {
        table: String,
        column: String,
    },
    DropIndex {
        table: String,
        column: String,
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
        /// Read the tablet as of this timestamp (from the coordinator's
        /// oracle): every transaction committed at or before it, none after
        /// (0 = no snapshot: the tablet as it is). Read-only plans only.
        /// Refused with `SnapshotTooOld` when the shard no longer keeps (or
        /// does not yet keep) the versions it needs: the client takes a new
        /// timestamp and runs the operation again.
        snapshot_ts: u64,
    },
    /// Run a query over the tablet `start_hash..=end_hash` of a typed table
    /// (checked like `Scan`). `resume`: continue a paged answer (the
    /// previous page's `resume`).
    Query {
        table: u64,
        start_hash: u64,
        end_hash: u64,
        map_version: u64,
        /// The table's schema, as the client read it from the coordinator
        /// (schemas never change, so the client's copy is the table's): the
        /// shard compiles the plan against it and reads rows with it.
        schema: crate::schema::Schema,
        plan: crate::query::QueryPlan,
        resume: Option<crate::query::QueryResume>,
        /// Find the candidate rows through the tablet's secondary index on a
        /// column instead of walking the log (the filter is still applied to
        /// every candidate, so the answer is the same either way).
        index: Option<crate::query::IndexProbe>,
        /// 0: the rows as they are. Else the rows as of this snapshot
        /// timestamp (as `Scan::snapshot_ts`; `Status::SnapshotTooOld` when
        /// the shard no longer keeps the versions it needs).
        snapshot_ts: u64,
    },

    // ---- transactions (ARCHITECTURE.md, "Transactions") ----
    /// Validate and lock this participant's items of transaction `txn`
    /// (client -> every participant shard). Ok (`TxnPrepared`) is a yes
    /// vote; `Status::Conflict` a no (a key read at another version, or
    /// locked by another transaction). A primary with no `others` is the
    /// only participant and commits at once on a yes (`TxnDecided`).
    TxnPrepare {
        txn: crate::txn::TxnId,
        /// None: this participant is the primary, which decides the outcome;
        /// its anchor is its first item. Some: the primary's anchor, whose
        /// owner this participant asks when the client goes silent.
        #[serde(borrow)]
        primary: Option<crate::txn::TxnAnchor<'a>>,
        /// At the primary: the other participants' anchors (each one's first
        /// item), whose owners it asks before deciding an orphaned
        /// transaction. Empty elsewhere.
        #[serde(borrow, deserialize_with = "crate::limits::txn_participants")]
        others: Vec<crate::txn::TxnAnchor<'a>>,
        #[serde(borrow, deserialize_with = "crate::limits::txn_items")]
        items: Vec<crate::txn::TxnItem<'a>>,
        /// Whether the transaction writes any key at any participant. When
        /// false nothing is recorded and the decision need not be durable
        /// (nothing is applied anywhere): a read-only transaction costs no
        /// log write and no replication wait. A write item under `false` is
        /// refused.
        writes: bool,
    },
    /// The decision. After every vote was yes, the client's commit goes to
    /// every participant at once (`direct`); with a vote unknown the client
    /// asks the primary first, which makes its decision durable (or answers
    /// the one it already took for an orphan), then tells the others the
    /// primary's answer; an abort after a no vote goes to every participant
    /// at once. Idempotent.
    TxnDecide {
        txn: crate::txn::TxnId,
        commit: bool,
        /// The commit's timestamp (from the oracle, taken after every vote):
        /// snapshots at or after it see the writes, earlier ones do not. 0
        /// with an abort. The primary answers the timestamp that stands.
        commit_ts: u64,
        /// The client's own decision after every vote (not the primary's
        /// answer relayed). A participant other than the primary refuses it
        /// (`Retry`: ask the primary) once a primary deciding an orphan has
        /// asked where it stands, or when its part came back from a
        /// recovery or a move: the primary may be deciding it, perhaps at
        /// another timestamp. ARCHITECTURE.md, "Transactions".
        direct: bool,
    },
    /// A participant whose prepared transaction waited too long asks the
    /// primary for the outcome; the primary decides it if it has not.
    TxnResolve {
        txn: crate::txn::TxnId,
        /// The primary's anchor: the asked shard must own its tablet (else
        /// `UnknownTablet`: the asker refreshes its map), since "no record
        /// here" means aborted only at the anchor's owner.
        #[serde(borrow)]
        anchor: crate::txn::TxnAnchor<'a>,
    },
    /// The primary, deciding an orphan, asks a participant where it stands;
    /// or (`part`) a shard proving a recovered vote asks whether one of the
    /// vote's sibling records is held.
    TxnInquire {
        txn: crate::txn::TxnId,
        /// The participant asked about (its anchor, by which the request
        /// was routed). Why it is named: one shard may hold parts of several
        /// participants of a transaction (a recovery or a move merged them),
        /// and only this participant's own vote answers `Prepared`. With
        /// `part`: the key a sibling record was written at.
        #[serde(borrow)]
        anchor: crate::txn::TxnAnchor<'a>,
        /// Ask about the part recorded at `anchor`, not a vote: `Prepared`
        /// if its record is held, `Committed` if the transaction committed
        /// here, else `Aborted` (nothing is recorded by the question). Only
        /// the owner of the anchor's tablet answers (else `UnknownTablet`).
        part: bool,
    },

    // ---- timestamps: client -> coordinator (ARCHITECTURE.md, "Timestamp oracle") ----
    /// `count` fresh timestamps from the coordinator's oracle (1 to
    /// [`MAX_TIMESTAMPS`], else `BadRequest`), answered `Timestamps`. Every
    /// timestamp handed out is strictly greater than every timestamp the
    /// oracle handed out before this request was received, across
    /// coordinator restarts too; 0 is never handed out (0 means "no
    /// timestamp" elsewhere). A client token suffices.
    Timestamps {
        count: u32,
    },
    /// Read keys of one table as of the snapshot timestamp `snapshot_ts`
    /// (from the oracle): each key's value as every transaction committed at
    /// or before it left it, none after. Answered `MultiRead` (one result
    /// per key, in order). Refused as a whole with `SnapshotTooOld` like a
    /// snapshot `Scan`: the caller takes a new timestamp and reads again.
    /// May wait (for the floor, for transactions locking a key), so it is
    /// not a point request.
    SnapshotRead {
        table: u64,
        snapshot_ts: u64,
        #[serde(borrow, deserialize_with = "crate::limits::multi_items")]
        keys: Vec<Blob<'a>>,
    },

    // ---- objects lost with an in-memory-only server (R = 0) ----
    /// Coordinator -> storage shard: tablet `start_hash` of `table` was
    /// re-created empty after server `lost_from` died holding its objects in
    /// memory only. Until the mark is cleared (the same request with
    /// `lost_from` 0, after `AckLoss`), a read of a key the tablet does not
    /// hold answers `Status::DataLost` instead of "no such object": the key
    /// may have existed. The tablet's version counter is raised to at least
    /// `version_floor` (0: unchanged), which the coordinator chose above
    /// every version the lost copy can have handed out, so a key's version
    /// never goes back. Sent before the tablet serves.
    MarkLost {
        table: u64,
        start_hash: u64,
        lost_from: u64,
        version_floor: u64,
    },
    /// Operator -> coordinator (`insitu table ack-loss NAME`): the loss of
    /// table `table`'s lost objects is acknowledged; its tablets answer
    /// "no such object" for missing keys again. Answered `LossAcknowledged`.
    AckLoss {
        table: String,
    },
    /// Operator -> coordinator (`insitu table accept-loss NAME`): the
    /// tablets of table `table` waiting for recovery are recovered from what
    /// the backups hold, even where the log's digest shows segments no
    /// backup holds (their disks are gone for good); they are marked lost
    /// like `MarkLost` until `AckLoss`. Answered `LossAcknowledged` with
    /// the number of tablets given up.
    AcceptLoss {
        table: String,
    },
}

/// Most timestamps one `Request::Timestamps` may ask for: enough for a
/// client to serve all its concurrent callers with one request, few enough
/// that no caller can drain the oracle's reservation in one go.
pub const MAX_TIMESTAMPS: u32 = 65_536;

/// Which listener serves a request: a storage server's shard port, its
/// backup port, or the coordinator. Each refuses the others' requests with
/// a message naming where they belong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    Shard,
    Backup,
    Coordinator,
}

impl Request<'_> {
    /// The listener that serves this kind of request. Exhaustive on
    /// purpose: a new request must be given its place here.
    pub fn destination(&self) -> Destination {
        use Request::*;
        match self {
            BackupWrite { .. } | BackupList { .. } | BackupRead { .. } | BackupForget { .. } => {
                Destination::Backup
            }
            Enlist { .. }
            | RemoveServer { .. }
            | CreateTable { .. }
            | DropTable { .. }
            | CreateIndex { .. }
            | DropIndex { .. }
            | OpenTable { .. }
            | TableMap { .. }
            | ListTables
            | ListServers
            | MoveTablet { .. }
            | Timestamps { .. }
            | AckLoss { .. }
            | AcceptLoss { .. } => Destination::Coordinator,
            Ping | Hello { .. } => Destination::Shard,
            Read { .. } | Write { .. } | Remove { .. } | Increment { .. } => Destination::Shard,
            MultiRead { .. } | MultiWrite { .. } | MultiRemove { .. } | SnapshotRead { .. } => {
                Destination::Shard
            }
            Enumerate { .. } | ShardStats { .. } | Scan { .. } | Query { .. } => Destination::Shard,
            TakeTablet { .. }
            | DropTablet { .. }
            | MigrateTablet { .. }
            | MigrateBatch { .. }
            | ActivateTablet { .. }
            | RecoverTablet { .. }
            | ServerDown { .. }
            | MarkLost { .. } => Destination::Shard,
            TxnPrepare { .. } | TxnDecide { .. } | TxnResolve { .. } | TxnInquire { .. } => {
                Destination::Shard
            }
        }
    }

    /// Whether it reads or writes given keys (read, write, remove,
    /// increment, multi-read/write/remove): a shard serves it in one step,
    /// never yielding, so its handling time is how long it held the shard.
    pub fn is_point(&self) -> bool {
        use Request::*;
        matches!(
            self,
            Read { .. }
                | Write { .. }
                | Remove { .. }
                | Increment { .. }
                | MultiRead { .. }
                | MultiWrite { .. }
                | MultiRemove { .. }
        )
    }

    /// A write, remove, increment, multiWrite or multiRemove: what a shard
    /// stamps with a timestamp while snapshots are read there.
    pub fn is_plain_write(&self) -> bool {
        use Request::*;
        matches!(
            self,
            Write { .. }
                | Remove { .. }
                | Increment { .. }
                | MultiWrite { .. }
                | MultiRemove { .. }
        )
    }

    /// The request's variant name, for messages (never its contents: a
    /// `Hello` carries a secret).
    pub fn name(&self) -> &'static str {
        use Request::*;
        match self {
            Ping => "Ping",
            Hello { .. } => "Hello",
            Read { .. } => "Read",
            Write { .. } => "Write",
            Remove { .. } => "Remove",
            Increment { .. } => "Increment",
            MultiRead { .. } => "MultiRead",
            MultiWrite { .. } => "MultiWrite",
            MultiRemove { .. } => "MultiRemove",
            Enumerate { .. } => "Enumerate",
            ShardStats { .. } => "ShardStats",
            TakeTablet { .. } => "TakeTablet",
            DropTablet { .. } => "DropTablet",
            MigrateTablet { .. } => "MigrateTablet",
            MigrateBatch { .. } => "MigrateBatch",
            ActivateTablet { .. } => "ActivateTablet",
            RecoverTablet { .. } => "RecoverTablet",
            ServerDown { .. } => "ServerDown",
            BackupWrite { .. } => "BackupWrite",
            BackupList { .. } => "BackupList",
            BackupRead { .. } => "BackupRead",
            BackupForget { .. } => "BackupForget",
            Enlist { .. } => "Enlist",
            RemoveServer { .. } => "RemoveServer",
            CreateTable { .. } => "CreateTable",
            DropTable { .. } => "DropTable",
            CreateIndex { .. } => "CreateIndex",
            DropIndex { .. } => "DropIndex",
            OpenTable { .. } => "OpenTable",
            TableMap { .. } => "TableMap",
            ListTables => "ListTables",
            ListServers => "ListServers",
            MoveTablet { .. } => "MoveTablet",
            Scan { .. } => "Scan",
            Query { .. } => "Query",
            TxnPrepare { .. } => "TxnPrepare",
            TxnDecide { .. } => "TxnDecide",
            TxnResolve { .. } => "TxnResolve",
            TxnInquire { .. } => "TxnInquire",
            Timestamps { .. } => "Timestamps",
            SnapshotRead { .. } => "SnapshotRead",
            MarkLost { .. } => "MarkLost",
            AckLoss { .. } => "AckLoss",
            AcceptLoss { .. } => "AcceptLoss",
        }
    }
}
