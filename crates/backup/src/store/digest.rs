//! Log digests kept with replicas (see `replica_file` for the record and
//! ARCHITECTURE.md, "Log digests", for why): accepting one, listing the
//! newest per log, and keeping only that one in memory.

use std::collections::BTreeMap;

use super::{BackupStore, Replica};
use crate::io::Io;
use crate::replica_file::{self, KIND_DIGEST, MAX_DIGEST_SEGMENTS, RECORD_HEAD_BYTES};
use crate::{BackupError, Digest, ReplicaId};

impl<I: Io> BackupStore<I> {
    /// Keep `digest` of replica `id`'s log with that replica (its carrier,
    /// which must be held here), as a record after the bytes it holds:
    /// durable like an append (buffered; the next flush or write-out). A
    /// digest not newer than one this store holds of the log is accepted and
    /// ignored (a master resending after a lost reply).
    pub fn digest(&mut self, id: ReplicaId, digest: Digest) -> Result<(), BackupError> {
        if digest.segments.len() > MAX_DIGEST_SEGMENTS {
            return Err(BackupError::TooLarge {
                bytes: digest.segments.len() as u64,
                max: MAX_DIGEST_SEGMENTS as u64,
            });
        }
        if !digest.segments.windows(2).all(|w| w[0] < w[1]) {
            return Err(BackupError::Malformed(format!(
                "digest {} of log {} lists its segments out of order",
                digest.seq, id.log
            )));
        }
        if !self.replicas.contains_key(&id) {
            return Err(BackupError::Unknown(id));
        }
        let newest = self
            .log_replicas(id.master, id.log)
            .filter_map(|(_, r)| r.digest.as_ref().map(|d| d.seq))
            .max();
        if newest.is_some_and(|seq| seq >= digest.seq) {
            return Ok(());
        }
        let payload = replica_file::encode_digest(&digest);
        let growth = RECORD_HEAD_BYTES + payload.len();
        self.check_disk_room(growth)?;
        let (master, log) = (id.master, id.log);
        for (_, r) in self
            .replicas
            .range_mut(log_range(master, log))
            .filter(|(_, r)| r.digest.is_some())
        {
            r.digest = None;
        }
        let r = self.replicas.get_mut(&id).expect("checked above");
        replica_file::encode_record(&mut r.pending, KIND_DIGEST, r.data_bytes, &payload);
        r.digest = Some(digest);
        self.dirty.insert(id);
        self.pending_bytes += growth;
        self.disk_bytes += growth as u64;
        if self.pending_bytes > self.config.buffer_budget_bytes {
            self.write_out(id, false)?;
        }
        Ok(())
    }

    /// Per log of `master`, the newest digest held with the replica that
    /// keeps it (its carrier), in log order.
    pub fn digests(&self, master: u64) -> Vec<(ReplicaId, Digest)> {
        self.replicas
            .range(
                ReplicaId {
                    master,
                    log: 0,
                    segment: 0,
                }..=ReplicaId {
                    master,
                    log: u64::MAX,
                    segment: u64::MAX,
                },
            )
            .filter_map(|(id, r)| r.digest.clone().map(|d| (*id, d)))
            .collect()
    }

    fn log_replicas(&self, master: u64, log: u64) -> impl Iterator<Item = (&ReplicaId, &Replica)> {
        self.replicas.range(log_range(master, log))
    }
}

/// Every replica id of one log of one master, for a range of the map.
fn log_range(master: u64, log: u64) -> std::ops::RangeInclusive<ReplicaId> {
    ReplicaId {
        master,
        log,
        segment: 0,
    }..=ReplicaId {
        master,
        log,
        segment: u64::MAX,
    }
}

/// After a reopen, keep in memory only the newest digest of each log (see
/// `Replica::digest`).
pub(super) fn keep_newest_digests(replicas: &mut BTreeMap<ReplicaId, Replica>) {
    let mut newest: BTreeMap<(u64, u64), (u64, ReplicaId)> = BTreeMap::new();
    for (id, r) in replicas.iter() {
        if let Some(d) = &r.digest {
            let e = newest.entry((id.master, id.log)).or_insert((d.seq, *id));
            if d.seq > e.0 {
                *e = (d.seq, *id);
            }
        }
    }
    for (id, r) in replicas.iter_mut() {
        if r.digest.is_some()
            && newest
                .get(&(id.master, id.log))
                .is_some_and(|&(_, keep)| keep != *id)
        {
            r.digest = None;
        }
    }
}
