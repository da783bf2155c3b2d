//! A backup's replicas: accept appends, buffer them, write them out, read
//! them back verified, and find them again after a restart (writing out
//! and syncing are in `store/flush.rs`).
//!
//! When an append is durable (what the master may acknowledge after):
//! - `SyncMode::Always`: `append` with `AppendMode::Synced` returns after
//!   the record is written and fsynced. The backup service uses
//!   `AppendMode::Buffered` (or `Now`) instead for every op of a group
//!   of requests and then ONE `flush` before answering any of them (group
//!   commit: one fsync per file touched, not per op, and the files' fsyncs
//!   run concurrently so the journal commits them together).
//! - `SyncMode::Interval`: `append` returns once the record is in this
//!   process's memory; `flush` (called by the server on a timer, 1 s by
//!   default) writes and fsyncs it. A crash of this process alone loses what
//!   was not flushed, which is why a master keeps R replicas on different
//!   servers; a power loss of every machine loses at most one interval.
//!
//! Fences: `fence(master)` records, in a small file `m<master>.fence` made
//! durable before it returns, that `master` was declared dead; the service
//! refuses its later writes. Fence files are reloaded by `open`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::io::Io;
use crate::replica_file::{
    self, HEADER_BYTES, KIND_CLOSED, KIND_DATA, MAX_RECORD_PAYLOAD_BYTES, MAX_SEGMENT_BYTES,
    RECORD_HEAD_BYTES,
};
use crate::{BackupError, Digest, ReplicaId, Tablet};

mod digest;
mod flush;
pub use flush::Flush;

use digest::keep_newest_digests;

/// When an append counts as durable; see the module comment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    Always,
    Interval,
}

#[derive(Clone, Debug)]
pub struct BackupConfig {
    /// Where replica files live (one file per replica).
    pub dir: PathBuf,
    /// The cluster this backup serves; replicas of another cluster found in
    /// `dir` make `open` fail rather than mix two clusters' data.
    pub cluster: u64,
    /// Disk bytes all replica files may take; an append past it is refused
    /// with `DiskFull` so the master picks another backup.
    pub disk_budget_bytes: u64,
    /// Bytes of records held in memory before they are written out even if
    /// no flush is due, so a burst cannot grow memory without bound.
    pub buffer_budget_bytes: usize,
    pub sync: SyncMode,
    /// Most payload bytes per record `AppendMode::Now` writes: `RECORD_SLICE_BYTES`
    /// (tests make it small so that every append is cut into several).
    pub record_slice_bytes: usize,
}

/// Most payload bytes of one record `AppendMode::Now` writes: an append is cut
/// into records of at most this. Why: each record is checksummed and then
/// handed to the kernel straight from the received bytes while they are
/// still in the CPU's cache, so a large append is not read from memory
/// twice; the 24-byte record head costs 0.04 % at this size.
pub const RECORD_SLICE_BYTES: usize = 64 * 1024;

/// How `BackupStore::append` takes its bytes, so one call serves the
/// master-facing store and the backup service's group commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendMode {
    /// Durable on return under `SyncMode::Always` (written and fsynced);
    /// under `SyncMode::Interval` as `Buffered`.
    Synced,
    /// Never synced: under either mode the bytes are durable only after the
    /// next `flush` (they are written early, unsynced, when the buffer
    /// budget is exceeded). For group commit: buffer every op of several
    /// requests, `flush` once, then answer them all.
    Buffered,
    /// As `Buffered`, but written to the file (unsynced) before `append`
    /// returns, in records of at most `record_slice_bytes`, without copying
    /// the bytes into a buffer first. The backup service answers nothing
    /// before its appends are written (`handle_group`), so it has no use
    /// for the buffer: a copy of every replicated byte saved.
    Now,
}

/// What `open` found on disk.
#[derive(Clone, Debug, Default)]
pub struct OpenReport {
    pub replicas: usize,
    /// Masters found fenced (their fence files).
    pub fenced: usize,
    /// One line per file that was cut (torn tail) or skipped (not a replica).
    pub problems: Vec<String>,
}

/// A replica as the store lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaInfo {
    pub id: ReplicaId,
    /// The tablet whose log this segment is part of.
    pub tablet: Tablet,
    /// Segment bytes accepted (written or still buffered).
    pub data_bytes: u64,
    pub closed: bool,
}

struct Replica {
    path: PathBuf,
    /// Named by the first append, kept in the file header.
    tablet: Tablet,
    /// Segment bytes accepted so far: the offset the next append must start at.
    data_bytes: u64,
    closed: bool,
    /// Encoded records (and, for a new replica, its header) not yet written.
    pending: Vec<u8>,
    /// Bytes of this replica's file on disk (written, maybe not yet synced).
    file_bytes: u64,
    /// Written since the last sync.
    unsynced: bool,
    /// `BackupStore::writes` at its last write: a detached sync (`flush`
    /// started with `begin_flush`) vouches for it only if it is unchanged.
    last_write: u64,
    /// The newest digest of its log this replica carries, while it is the
    /// newest this store holds of that log (an older one is forgotten in
    /// memory when a newer arrives; its record stays in the file, and a
    /// reopen forgets it again). Why one per log: every head of a log
    /// carries a digest listing the whole log, so keeping them all would
    /// cost memory quadratic in the log's length.
    digest: Option<Digest>,
}

pub struct BackupStore<I: Io> {
    config: BackupConfig,
    io: I,
    replicas: BTreeMap<ReplicaId, Replica>,
    /// Sum of `pending.len()`: checked against `buffer_budget_bytes`.
    pending_bytes: usize,
    /// Sum of file bytes plus pending bytes: checked against the disk budget.
    disk_bytes: u64,
    /// Replicas with pending records or unsynced writes, so a flush costs
    /// one step per replica touched, not per replica held.
    dirty: BTreeSet<ReplicaId>,
    /// Masters declared dead (each has a durable fence file).
    fenced: BTreeSet<u64>,
    /// Writes to replica files so far (each stamps `Replica::last_write`).
    writes: u64,
}

const SUFFIX: &str = "replica";
const FENCE_SUFFIX: &str = "fence";

fn fence_file_name(master: u64) -> String {
    format!("m{master:016x}.{FENCE_SUFFIX}")
}

/// The master a fence file names, if `path` is one.
fn fenced_master(path: &Path) -> Option<u64> {
    if path.extension().and_then(|e| e.to_str()) != Some(FENCE_SUFFIX) {
        return None;
    }
    let stem = path.file_stem()?.to_str()?.strip_prefix('m')?;
    if stem.len() != 16 {
        return None;
    }
    u64::from_str_radix(stem, 16).ok()
}

fn file_name(id: ReplicaId) -> String {
    format!(
        "m{:016x}-l{:016x}-s{:016x}.{SUFFIX}",
        id.master, id.log, id.segment
    )
}

impl<I: Io> BackupStore<I> {
    /// Open (or create) the backup directory and load every replica in it,
    /// verifying each; torn tails are cut off and reported.
    pub fn open(config: BackupConfig, mut io: I) -> Result<(Self, OpenReport), BackupError> {
        let dir = config.dir.clone();
        io.create_dir_all(&dir)
            .map_err(|e| BackupError::io("create", &dir, e))?;
        let mut report = OpenReport::default();
        let mut replicas = BTreeMap::new();
        let mut disk_bytes = 0u64;
        let mut fenced = BTreeSet::new();
        let files = io
            .list(&dir)
            .map_err(|e| BackupError::io("list", &dir, e))?;
        for path in files {
            if let Some(master) = fenced_master(&path) {
                fenced.insert(master);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some(SUFFIX) {
                continue;
            }
            let bytes = io
                .read(&path)
                .map_err(|e| BackupError::io("read", &path, e))?;
            let parsed = match replica_file::parse(&bytes) {
                Ok(p) => p,
                Err(e) => {
                    report
                        .problems
                        .push(format!("{}: skipped: {e}", path.display()));
                    continue;
                }
            };
            if parsed.cluster != config.cluster {
                return Err(BackupError::OtherCluster {
                    path,
                    found: parsed.cluster,
                    expected: config.cluster,
                });
            }
            if path.file_name().and_then(|n| n.to_str()) != Some(file_name(parsed.id).as_str()) {
                report.problems.push(format!(
                    "{}: skipped: its header names replica {:?}",
                    path.display(),
                    parsed.id
                ));
                continue;
            }
            if let Some(why) = &parsed.cut {
                report
                    .problems
                    .push(format!("{}: cut: {why}", path.display()));
                io.truncate(&path, parsed.valid_file_bytes)
                    .and_then(|()| io.sync(&path))
                    .map_err(|e| BackupError::io("truncate", &path, e))?;
            }
            disk_bytes += parsed.valid_file_bytes;
            replicas.insert(
                parsed.id,
                Replica {
                    path,
                    tablet: parsed.tablet,
                    data_bytes: parsed.data.len() as u64,
                    closed: parsed.closed,
                    pending: Vec::new(),
                    file_bytes: parsed.valid_file_bytes,
                    unsynced: false,
                    last_write: 0,
                    digest: parsed.digest,
                },
            );
        }
        report.replicas = replicas.len();
        report.fenced = fenced.len();
        keep_newest_digests(&mut replicas);
        let store = BackupStore {
            config,
            io,
            replicas,
            pending_bytes: 0,
            disk_bytes,
            dirty: BTreeSet::new(),
            fenced,
            writes: 0,
        };
        Ok((store, report))
    }

    /// Accept `bytes` at segment `offset` of replica `id` (created by its first
    /// append, which must be at offset 0, of a segment of `tablet`'s log), and
    /// mark the segment complete when `close`. A resend of bytes already held
    /// is accepted again (a master retrying after a lost reply). When it is
    /// durable is as `mode` says (see `AppendMode` and the module comment).
    pub fn append(
        &mut self,
        id: ReplicaId,
        tablet: Tablet,
        offset: u64,
        bytes: &[u8],
        close: bool,
        mode: AppendMode,
    ) -> Result<(), BackupError> {
        let now = mode == AppendMode::Now;
        if bytes.len() > MAX_RECORD_PAYLOAD_BYTES {
            return Err(BackupError::TooLarge {
                bytes: bytes.len() as u64,
                max: MAX_RECORD_PAYLOAD_BYTES as u64,
            });
        }
        let end = offset
            .checked_add(bytes.len() as u64)
            .ok_or(BackupError::TooLarge {
                bytes: u64::MAX,
                max: MAX_SEGMENT_BYTES,
            })?;
        if end > MAX_SEGMENT_BYTES {
            return Err(BackupError::TooLarge {
                bytes: end,
                max: MAX_SEGMENT_BYTES,
            });
        }
        let (have, closed) = match self.replicas.get(&id) {
            Some(r) if r.tablet != tablet => {
                return Err(BackupError::WrongTablet {
                    id,
                    held: r.tablet,
                    sent: tablet,
                });
            }
            Some(r) => (r.data_bytes, r.closed),
            None => (0, false),
        };
        if offset > have {
            return Err(BackupError::Gap { id, have, offset });
        }
        // Only the part beyond what we hold is new.
        let skip = (have - offset) as usize;
        let new = bytes.get(skip..).unwrap_or(&[]);
        if closed {
            return if new.is_empty() {
                self.sync_if_owed(id, mode)
            } else {
                Err(BackupError::Closed(id))
            };
        }
        let header = if self.replicas.contains_key(&id) {
            0
        } else {
            HEADER_BYTES
        };
        // Records for the new bytes: one when buffered, slices when written now.
        let records = match (new.is_empty(), now) {
            (true, _) => 0,
            (false, false) => 1,
            (false, true) => new.len().div_ceil(self.config.record_slice_bytes.max(1)),
        };
        let growth = header
            + records * RECORD_HEAD_BYTES
            + new.len()
            + if close { RECORD_HEAD_BYTES } else { 0 };
        self.check_disk_room(growth)?;
        let cluster = self.config.cluster;
        let dir = self.config.dir.clone();
        let r = self.replicas.entry(id).or_insert_with(|| Replica {
            path: dir.join(file_name(id)),
            tablet,
            data_bytes: 0,
            closed: false,
            pending: replica_file::encode_header(cluster, id, tablet).to_vec(),
            file_bytes: 0,
            unsynced: false,
            last_write: 0,
            digest: None,
        });
        if growth > 0 {
            self.dirty.insert(id);
        }
        if now {
            // The replica's buffered bytes (at least a new file's header)
            // go first: file order is segment order.
            self.pending_bytes += header;
            self.disk_bytes += header as u64;
            self.write_out(id, false)?;
            for part in new.chunks(self.config.record_slice_bytes.max(1)) {
                self.write_record(id, KIND_DATA, part)?;
            }
            if close {
                self.write_record(id, KIND_CLOSED, &[])?;
            }
            return Ok(());
        }
        // Room for the whole growth at once: an emptied buffer starts over
        // at zero capacity, and doubling up to a large record would copy it.
        r.pending.reserve(growth);
        if !new.is_empty() {
            replica_file::encode_record(&mut r.pending, KIND_DATA, have, new);
            r.data_bytes += new.len() as u64;
        }
        if close {
            replica_file::encode_record(&mut r.pending, KIND_CLOSED, r.data_bytes, &[]);
            r.closed = true;
        }
        self.pending_bytes += growth;
        self.disk_bytes += growth as u64;
        if self.pending_bytes > self.config.buffer_budget_bytes {
            self.write_out(id, false)?;
        }
        self.sync_if_owed(id, mode)
    }

    /// The sync an `AppendMode::Synced` append owes before it returns under
    /// `SyncMode::Always` (kept apart so an accepted resend owes it too).
    fn sync_if_owed(&mut self, id: ReplicaId, mode: AppendMode) -> Result<(), BackupError> {
        match (mode, self.config.sync) {
            (AppendMode::Synced, SyncMode::Always) => self.write_out(id, true),
            _ => Ok(()),
        }
    }

    /// `DiskFull` if `growth` more bytes would pass the disk budget.
    pub(super) fn check_disk_room(&self, growth: usize) -> Result<(), BackupError> {
        let free = self
            .config
            .disk_budget_bytes
            .saturating_sub(self.disk_bytes);
        if growth as u64 > free {
            return Err(BackupError::DiskFull {
                need: growth as u64,
                free,
            });
        }
        Ok(())
    }

    fn drop_replica(&mut self, id: ReplicaId) {
        self.dirty.remove(&id);
        if let Some(r) = self.replicas.remove(&id) {
            self.pending_bytes -= r.pending.len();
            self.disk_bytes -= r.file_bytes + r.pending.len() as u64;
            let _ = self.io.remove(&r.path);
        }
    }

    /// The replica's segment bytes, read back from disk and verified (its
    /// buffered records are written out first). A replica whose file no
    /// longer verifies completely is reported as `Corrupt`, so recovery uses
    /// another replica.
    pub fn read(&mut self, id: ReplicaId) -> Result<(Vec<u8>, bool), BackupError> {
        let Some(r) = self.replicas.get(&id) else {
            return Err(BackupError::Unknown(id));
        };
        let (path, want, closed) = (r.path.clone(), r.data_bytes, r.closed);
        self.write_out(id, false)?;
        let bytes = self
            .io
            .read(&path)
            .map_err(|e| BackupError::io("read", &path, e))?;
        let parsed = replica_file::parse(&bytes).map_err(|e| BackupError::Corrupt {
            id,
            why: e.to_string(),
        })?;
        if parsed.data.len() as u64 != want || parsed.closed != closed || parsed.id != id {
            return Err(BackupError::Corrupt {
                id,
                why: parsed.cut.unwrap_or_else(|| {
                    format!(
                        "holds {} segment bytes, {} were accepted",
                        parsed.data.len(),
                        want
                    )
                }),
            });
        }
        Ok((parsed.data, parsed.closed))
    }

    /// Replicas held, optionally only those of one master, in id order.
    pub fn list(&self, master: Option<u64>) -> Vec<ReplicaInfo> {
        self.replicas
            .iter()
            .filter(|(id, _)| master.is_none_or(|m| id.master == m))
            .map(|(id, r)| ReplicaInfo {
                id: *id,
                tablet: r.tablet,
                data_bytes: r.data_bytes,
                closed: r.closed,
            })
            .collect()
    }

    /// Forget a replica and delete its file (its segment was cleaned, or
    /// its master's recovery finished).
    pub fn free(&mut self, id: ReplicaId) {
        self.drop_replica(id);
    }

    /// Forget every replica of `master`.
    pub fn free_master(&mut self, master: u64) {
        self.drop_replicas_of(master, None);
    }

    /// Drop every replica of `master`, or only those of its log `log`: what
    /// `free_master` and `free_log` share.
    fn drop_replicas_of(&mut self, master: u64, log: Option<u64>) {
        let ids: Vec<ReplicaId> = self
            .replicas
            .keys()
            .filter(|id| id.master == master && log.is_none_or(|l| id.log == l))
            .copied()
            .collect();
        for id in ids {
            self.drop_replica(id);
        }
    }

    /// Refuse `master` from now on, durably: its fence file is written and
    /// synced before this returns (a recovery may rely on it at once).
    pub fn fence(&mut self, master: u64) -> Result<(), BackupError> {
        if self.fenced.contains(&master) {
            return Ok(());
        }
        let path = self.config.dir.join(fence_file_name(master));
        self.io
            .append(&path, format!("master {master} is fenced\n").as_bytes())
            .and_then(|()| self.io.sync(&path))
            .map_err(|e| BackupError::io("write fence", &path, e))?;
        self.fenced.insert(master);
        Ok(())
    }

    /// Whether `master` was fenced (by this process or one before it).
    pub fn is_fenced(&self, master: u64) -> bool {
        self.fenced.contains(&master)
    }

    /// Forget `master` entirely: its replicas and its fence file. It stays
    /// fenced in memory for this process's life (a master whose recovery
    /// finished must never write again; server ids are never reused, so
    /// dropping the file after a restart cannot let it back in by mistake).
    pub fn forget_master(&mut self, master: u64) -> Result<(), BackupError> {
        self.free_master(master);
        if self.fenced.contains(&master) {
            let path = self.config.dir.join(fence_file_name(master));
            self.io
                .remove(&path)
                .map_err(|e| BackupError::io("remove fence", &path, e))?;
        }
        Ok(())
    }

    /// Bytes on disk plus buffered, against the disk budget.
    pub fn disk_bytes(&self) -> u64 {
        self.disk_bytes
    }

    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// The cluster whose replicas this store holds.
    pub fn cluster(&self) -> u64 {
        self.config.cluster
    }

    pub fn sync_mode(&self) -> SyncMode {
        self.config.sync
    }

    /// Forget every replica of one log of `master` (the tablet was dropped
    /// or moved away).
    pub fn free_log(&mut self, master: u64, log: u64) {
        self.drop_replicas_of(master, Some(log));
    }

    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// The I/O layer (tests reach the simulated disk through it).
    pub fn io_mut(&mut self) -> &mut I {
        &mut self.io
    }

    /// Give the I/O layer back (a test "crashes" it and opens a new store).
    pub fn into_io(self) -> I {
        self.io
    }
}
