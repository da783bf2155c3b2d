//! The values requests and responses carry: reject rules, numbers, tablet,
//! table and server descriptions, backup ops and replica listings, shard
//! statistics, per-key results and objects.

use serde::{Deserialize, Serialize};

use super::Blob;
use crate::Status;

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

/// `TabletInfo::lost_from` of a tablet whose objects died with a server of
/// an earlier run, whose id is no longer on record.
pub const LOST_FROM_EARLIER_RUN: u64 = u64::MAX;

/// How a message names the server a tablet's objects were lost with.
pub fn lost_with(lost_from: u64) -> String {
    if lost_from == LOST_FROM_EARLIER_RUN {
        "a server of an earlier run".to_string()
    } else {
        format!("server {lost_from}")
    }
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
    /// 0: nothing lost. Else the server that died holding this tablet's
    /// objects in memory only (R = 0): the tablet was re-created empty and
    /// stays marked until an operator acknowledges the loss (`AckLoss`).
    /// [`LOST_FROM_EARLIER_RUN`]: a server of an earlier run.
    pub lost_from: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TableInfo {
    pub id: u64,
    pub name: String,
    /// Ordered by `start_hash`, covering the whole hash space.
    pub tablets: Vec<TabletInfo>,
    /// The coordinator's map version when this was read.
    pub map_version: u64,
    /// The schema of a typed table; None = untyped.
    pub schema: Option<crate::schema::Schema>,
    /// Columns of a typed table with a secondary index (ascending): the
    /// planner may probe them (`Request::Query::index`).
    #[serde(deserialize_with = "crate::limits::columns")]
    pub indexes: Vec<u16>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    pub id: u64,
    /// One address per shard; a tablet names its shard by index.
    pub shard_addrs: Vec<String>,
    /// Address of the server's backup service ("" for a server enlisted
    /// without one): where masters send replicas and recoveries read them.
    pub backup_addr: String,
    /// Whether the coordinator believes the server alive.
    pub state: ServerState,
}

/// What the coordinator believes of a server.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerState {
    /// Answering the coordinator's pings.
    Up,
    /// Declared dead (silent past the failure timeout, or replaced); its
    /// tablets are being recovered from backups, its replicas re-made.
    Dead,
}

/// One replication operation from a master shard to a backup. Segments are
/// named by (master server id, log, segment id): `log` is one tablet
/// instance's log on its master, `segment` the engine's per-tablet segment id.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum BackupOp<'a> {
    /// `bytes` belong at `offset` of the segment (offset = bytes the backup
    /// already holds; a resend of held bytes is accepted). `close`: the
    /// segment is complete (the master sealed it). The first append of a
    /// segment opens its replica; `table`/`start_hash` name the tablet whose
    /// log it is, so a recovery finds a tablet's segments without reading them.
    Append {
        log: u64,
        table: u64,
        start_hash: u64,
        segment: u64,
        offset: u64,
        #[serde(borrow)]
        bytes: Blob<'a>,
        close: bool,
    },
    /// The master freed the segment (cleaned): its replica may be deleted.
    Free { log: u64, segment: u64 },
    /// The master dropped the whole log (tablet dropped or moved away).
    FreeLog { log: u64 },
    /// The log's digest number `seq`: the ids of the segments the log holds
    /// whose replicas a recovery must find (ascending). Kept with the
    /// replica of `segment` (the carrier, which the backup already holds);
    /// a recovery trusts the digest with the highest `seq` it finds.
    Digest {
        log: u64,
        segment: u64,
        seq: u64,
        #[serde(deserialize_with = "crate::limits::digest_segments")]
        segments: Vec<u64>,
    },
}

/// The newest digest a backup holds of one log (answer to `BackupList`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LogDigest {
    pub log: u64,
    /// Its carrier: the segment whose replica here keeps it. A recovery
    /// refuses a digest whose carrier's replicas are all closed (the master
    /// closes a carrier only after a newer digest elsewhere was held).
    pub segment: u64,
    /// Grows with every digest the master makes of the log.
    pub seq: u64,
    /// Segment ids, ascending.
    #[serde(deserialize_with = "crate::limits::digest_segments")]
    pub segments: Vec<u64>,
}

/// A replica a backup holds (answer to `BackupList`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ReplicaInfo {
    pub log: u64,
    pub table: u64,
    pub start_hash: u64,
    pub segment: u64,
    /// Bytes of the segment held (verified when the store opened or accepted them).
    pub bytes: u64,
    /// The master closed the segment: `bytes` is its whole length.
    pub closed: bool,
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
    /// Objects with a deadline, expired ones included until the sweep
    /// removes them (`Engine::expiring_figures`): Redis's `INFO` `expires=`.
    pub expiring_objects: u64,
    /// The sum of their deadlines (Unix ms): with the count, their mean,
    /// from which `INFO` derives `avg_ttl`. A sum, not a mean, so tablets add up.
    pub expiring_deadline_sum_ms: u128,
    /// Side records the tablet holds (transactions' votes and decisions, the
    /// update log's entries): each is log bytes until removed, so an operator
    /// sees a count that only grows, and tests see records removed on time.
    pub records: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ShardStats {
    pub tablets: Vec<TabletStat>,
    pub memory_budget_bytes: u64,
    pub segment_bytes: u64,
    pub live_bytes: u64,
    /// Requests the shard has handled since it started (the status page
    /// derives request rates from two readings).
    pub requests: u64,
    /// The longest a single point request (read, write, remove, increment,
    /// multi-read/write/remove) held the shard, in microseconds, since the
    /// shard started or since a `ShardStats { reset_longest_call: true }`:
    /// the cleaner's slices and every other engine work run inside such
    /// calls, and nothing else runs on the shard meanwhile.
    pub longest_point_call_us: u64,
    /// The server's Redis protocol port (0: none): where cluster clients
    /// are sent for the slots this server serves.
    pub resp_port: u16,
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

/// A tablet's side record (a transaction's durable record) as it travels
/// in a migration: the destination keeps it under the same id and anchor.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SideRecord<'a> {
    /// The record family (the engine's `RecordId::class`).
    pub class: u8,
    pub id: u64,
    #[serde(borrow)]
    pub anchor: Blob<'a>,
    #[serde(borrow)]
    pub payload: Blob<'a>,
}

/// An object as it travels in enumeration and migration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Object<'a> {
    #[serde(borrow)]
    pub key: Blob<'a>,
    #[serde(borrow)]
    pub value: Blob<'a>,
    pub version: u64,
    /// The object's deadline (Unix ms; 0: none): a move carries it along.
    pub expires_at_ms: u64,
}
