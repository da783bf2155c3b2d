//! Backups: segment replicas of other servers' logs, kept on this server's
//! disk so that every acknowledged write survives a server's crash.
//!
//! A master sends each append to its head segment to R backups; a backup
//! buffers it and writes it to a replica file (see `store` for exactly when
//! an append is durable). After a master dies, recovery reads the replicas of
//! its segments back — verified record by record — and replays them with the
//! engine's replay, which verifies every log entry again.
//!
//! Only this crate knows the bytes of a replica file (`replica_file`); the
//! segment bytes inside are the engine's, opaque here.
//!
//! - `replica_file`: the file's byte layout and a reader that trusts nothing;
//! - `io`: the file operations, with a simulated disk for fault injection;
//! - `store`: the replicas of one backup: append, flush, read, list, free;
//! - `sync_job`: fsyncs detached from the store, run on another thread while
//!   it takes appends (a timer flush's, so a slow disk stalls nothing);
//! - `service`: the backup requests answered over a store, with group commit
//!   and fencing (the server puts it behind its backup port).

pub mod io;
pub mod replica_file;
pub mod service;
pub mod store;
pub mod sync_job;

pub use io::{FsIo, Io, SyncDone, SyncJob};
pub use service::{BackupService, Outcome};
pub use store::{
    AppendMode, BackupConfig, BackupStore, OpenReport, RECORD_SLICE_BYTES, ReplicaInfo, SyncMode,
};

use std::path::{Path, PathBuf};

/// The tablet whose log a replica copies a segment of: the table and the
/// start of the tablet's hash range (how recovery finds a tablet's replicas
/// without reading them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tablet {
    pub table: u64,
    pub start_hash: u64,
}

/// Which segment a replica copies: segment `segment` of log `log` (one log
/// per tablet) of server `master`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaId {
    pub master: u64,
    pub log: u64,
    pub segment: u64,
}

/// A log's digest: the segments of the log a recovery must find, as the
/// master knew them when it made digest number `seq` (see the replicator).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digest {
    pub seq: u64,
    /// Segment ids, ascending.
    pub segments: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("backup disk budget full: {need} bytes needed, {free} free")]
    DiskFull { need: u64, free: u64 },
    #[error("append to {id:?} at segment offset {offset}, but only {have} bytes are held")]
    Gap {
        id: ReplicaId,
        have: u64,
        offset: u64,
    },
    #[error("replica {0:?} is closed; it takes no more data")]
    Closed(ReplicaId),
    #[error("{bytes} bytes exceed the limit of {max}")]
    TooLarge { bytes: u64, max: u64 },
    #[error("replica {id:?} belongs to tablet {held:?}, an append named {sent:?}")]
    WrongTablet {
        id: ReplicaId,
        held: Tablet,
        sent: Tablet,
    },
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("no replica {0:?} here")]
    Unknown(ReplicaId),
    #[error("replica {id:?} is corrupt: {why}")]
    Corrupt { id: ReplicaId, why: String },
    #[error(
        "{path} belongs to cluster {found:#x}, this server to cluster {expected:#x}: \
         refusing to mix two clusters' data (use another --dir)"
    )]
    OtherCluster {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("cannot {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl BackupError {
    fn io(op: &'static str, path: &Path, source: std::io::Error) -> BackupError {
        BackupError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}
