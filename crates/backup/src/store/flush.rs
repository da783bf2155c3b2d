//! Making a store's buffered appends durable: written out, then fsynced
//! together (group commit); a replica whose write or sync failed is dropped.

use std::path::PathBuf;

use crate::io::{Io, SyncDone, SyncJob};
use crate::replica_file::{self, KIND_CLOSED, RECORD_HEAD_BYTES};
use crate::{BackupError, ReplicaId};

use super::BackupStore;

/// A flush begun by `BackupStore::begin_flush`, to be finished by
/// `finish_flush` on the same store.
pub struct Flush {
    /// The replicas whose files it syncs: id and `last_write` then.
    synced: Vec<(ReplicaId, u64)>,
    /// Their files, in the same order.
    paths: Vec<PathBuf>,
    /// The fsyncs, if the store's `Io` can run them elsewhere.
    job: Option<SyncJob>,
}

impl Flush {
    /// The fsyncs to run (anywhere; `SyncJob::run`) before `finish_flush`;
    /// `None` if they run in `finish_flush`.
    pub fn take_job(&mut self) -> Option<SyncJob> {
        self.job.take()
    }

    /// How many files it syncs.
    pub fn files(&self) -> usize {
        self.paths.len()
    }
}

impl<I: Io> BackupStore<I> {
    /// Write out every buffered record and fsync every file written since the
    /// last sync. The server calls this on its flush timer.
    pub fn flush(&mut self) -> Result<(), BackupError> {
        self.flush_each()
            .into_iter()
            .next()
            .map_or(Ok(()), |(_, e)| Err(e))
    }

    /// `flush`, reporting every replica that could not be made durable (each
    /// was dropped: its state on disk is unknown). The rest are durable.
    pub fn flush_each(&mut self) -> Vec<(ReplicaId, BackupError)> {
        let (mut flush, mut failed) = self.begin_flush();
        let done = flush.job.take().map(SyncJob::run);
        failed.extend(self.finish_flush(flush, done));
        failed
    }

    /// The first half of `flush_each`: write every buffered record out, and
    /// open a job (`Flush::take_job`) that fsyncs every file written since
    /// its last sync. The job may run on another thread while this store goes
    /// on taking appends; `finish_flush` then marks the replicas synced that
    /// were not written meanwhile (the others wait for the next flush). Why:
    /// a backup's timer flush under a steady stream of replicas fsyncs
    /// hundreds of megabytes, for as long as the disk takes (measured: 0.4 s
    /// of every second while a recovered server re-replicated); holding the
    /// store for it stopped every append, read and listing meanwhile.
    /// Reports the replicas that could not be written (each was dropped).
    pub fn begin_flush(&mut self) -> (Flush, Vec<(ReplicaId, BackupError)>) {
        let mut failed = Vec::new();
        let mut synced: Vec<(ReplicaId, u64)> = Vec::new();
        let mut paths: Vec<PathBuf> = Vec::new();
        for id in std::mem::take(&mut self.dirty) {
            match self.write_out(id, false) {
                Err(e) => failed.push((id, e)),
                Ok(()) => {
                    if let Some(r) = self.replicas.get(&id).filter(|r| r.unsynced) {
                        synced.push((id, r.last_write));
                        paths.push(r.path.clone());
                    }
                }
            }
        }
        let job = self.io.sync_job(&paths);
        (Flush { synced, paths, job }, failed)
    }

    /// The second half of `flush_each`: `done` is what the flush's job did
    /// (`None`: it had none, or it was not run; the files are synced here).
    /// A replica written since `begin_flush` stays owed to the next flush; a
    /// replica whose sync failed is dropped and reported.
    pub fn finish_flush(
        &mut self,
        flush: Flush,
        done: Option<SyncDone>,
    ) -> Vec<(ReplicaId, BackupError)> {
        let results = match done {
            Some(done) => {
                self.io.sync_job_done(&flush.paths, &done);
                done.results
            }
            None => self.io.sync_many(&flush.paths),
        };
        debug_assert_eq!(results.len(), flush.synced.len());
        let mut failed = Vec::new();
        let synced = flush.synced.into_iter().zip(&flush.paths);
        for (((id, last_write), path), result) in synced.zip(results) {
            match result {
                Ok(()) => {
                    if let Some(r) = self.replicas.get_mut(&id)
                        && r.last_write == last_write
                    {
                        r.unsynced = false;
                        if r.pending.is_empty() {
                            self.dirty.remove(&id);
                        }
                    }
                }
                Err(e) => {
                    // Its state on disk is unknown: drop it (as `write_out` does).
                    self.drop_replica(id);
                    failed.push((id, BackupError::io("sync", path, e)));
                }
            }
        }
        failed
    }

    /// Write every buffered record to its file without fsync: the bytes are
    /// then the kernel's, safe from a crash of this process though not from
    /// a power loss (the next `flush` syncs them). Reports the replicas that
    /// could not be written (each was dropped).
    pub fn write_pending(&mut self) -> Vec<(ReplicaId, BackupError)> {
        let ids: Vec<ReplicaId> = self.dirty.iter().copied().collect();
        ids.into_iter()
            .filter_map(|id| self.write_out(id, false).err().map(|e| (id, e)))
            .collect()
    }

    /// Whether anything awaits a flush.
    pub fn needs_flush(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Write `id`'s buffered records; fsync when `sync`. On an I/O error the
    /// replica's state on disk is unknown, so it is dropped (file removed) and
    /// the error returned: the master re-replicates that segment elsewhere.
    pub(super) fn write_out(&mut self, id: ReplicaId, sync: bool) -> Result<(), BackupError> {
        let BackupStore {
            io,
            replicas,
            pending_bytes,
            dirty,
            writes,
            ..
        } = self;
        let Some(r) = replicas.get_mut(&id) else {
            return Ok(());
        };
        let mut result = Ok(());
        if !r.pending.is_empty() && r.file_bytes == 0 {
            // A replica's first write creates its file from scratch. A file
            // of that name may already exist: one whose creation a crash tore
            // (its header short or garbled, so `open` skipped it) before the
            // master re-sent the segment from offset 0. Appending to it would
            // put the new header behind the garbage, and the next `open`
            // would skip the replica again — losing bytes a sync covered.
            result = io.remove(&r.path);
        }
        if result.is_ok() && !r.pending.is_empty() {
            result = io.append(&r.path, &r.pending);
            if result.is_ok() {
                r.file_bytes += r.pending.len() as u64;
                *pending_bytes -= r.pending.len();
                r.pending = Vec::new();
                r.unsynced = true;
                *writes += 1;
                r.last_write = *writes;
            }
        }
        if result.is_ok() && sync && r.unsynced {
            result = io.sync(&r.path);
            if result.is_ok() {
                r.unsynced = false;
            }
        }
        if result.is_ok() {
            if r.pending.is_empty() && !r.unsynced {
                dirty.remove(&id);
            } else {
                dirty.insert(id);
            }
        }
        let path = r.path.clone();
        result.map_err(|e| {
            self.drop_replica(id);
            BackupError::io("write", &path, e)
        })
    }

    /// Append one record of replica `id` (whose buffer is empty) to its
    /// file: its head and then `payload` as it is, in one vectored write;
    /// the caller checked the disk budget. On
    /// an I/O error the replica is dropped (as in `write_out`): its state on
    /// disk is unknown.
    pub(super) fn write_record(
        &mut self,
        id: ReplicaId,
        kind: u8,
        payload: &[u8],
    ) -> Result<(), BackupError> {
        let BackupStore {
            io,
            replicas,
            dirty,
            disk_bytes,
            writes,
            ..
        } = self;
        let Some(r) = replicas.get_mut(&id) else {
            return Ok(());
        };
        debug_assert!(
            r.pending.is_empty(),
            "buffered bytes would land after these"
        );
        let head = replica_file::record_head(kind, r.data_bytes, payload);
        match io.append_parts(&r.path, &[&head, payload]) {
            Ok(()) => {
                let written = (RECORD_HEAD_BYTES + payload.len()) as u64;
                r.file_bytes += written;
                *disk_bytes += written;
                r.data_bytes += payload.len() as u64;
                r.closed |= kind == KIND_CLOSED;
                r.unsynced = true;
                *writes += 1;
                r.last_write = *writes;
                // The next flush syncs it (`write_out` may just have taken
                // it off the list, finding nothing to write).
                dirty.insert(id);
                Ok(())
            }
            Err(e) => {
                let path = r.path.clone();
                self.drop_replica(id);
                Err(BackupError::io("write", &path, e))
            }
        }
    }
}
