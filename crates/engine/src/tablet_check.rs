//! `Tablet::check_consistency`: the tablet's running figures recomputed
//! from its log and its index and compared (tests, `check_invariants` and
//! debug builds' check after cleaning only: O(data)).
//!
//! Apart from `tablet.rs` because it is a checker, not a path any request
//! takes: it re-derives every figure the mutations keep, entry by entry, and
//! is read against them rather than beside them.

use super::Tablet;
use crate::entry::{self, KIND_OBJECT, KIND_RECORD, KIND_RECORD_REMOVED, KIND_TOMBSTONE};
use crate::index::{loc, probe_hash};

impl Tablet {
    /// Recompute the statistics from the log and the index and compare them
    /// with the running figures (tests and debug checks only: O(data)).
    pub fn check_consistency(&self) {
        let mut count = 0u64;
        let (mut live, mut records) = (0u64, 0u64);
        for &slot in &self.order {
            let seg = &self.segs[slot as usize];
            let (mut seg_live, mut seg_tomb, mut seg_records) = (0u64, 0u64, 0u64);
            let (mut seg_expiring, mut seg_earliest, mut seg_sum) = (0u32, u64::MAX, 0u128);
            let mut at = 0;
            while at < seg.buf.len() {
                let len = entry::len_at(&seg.buf, at) as u64;
                match entry::kind(&seg.buf, at) {
                    KIND_OBJECT if !entry::is_dead(&seg.buf, at) => {
                        seg_live += len;
                        let deadline = entry::expires_at(&seg.buf, at);
                        if deadline != 0 {
                            seg_expiring += 1;
                            seg_earliest = seg_earliest.min(deadline);
                            seg_sum += u128::from(deadline);
                        }
                        let hash = crate::key_hash(self.table, entry::key_at(&seg.buf, at));
                        let l = loc(slot, at as u32);
                        let prefix = self.prefixer.prefix(hash);
                        assert!(
                            self.index
                                .find(probe_hash(prefix), |e| e.loc() == l)
                                .is_some(),
                            "live entry not indexed"
                        );
                        assert!(
                            entry::version(&seg.buf, at) < self.next_version,
                            "version not below the counter"
                        );
                    }
                    // Checked against the records map in `check_records`.
                    KIND_RECORD if !entry::is_dead(&seg.buf, at) => {
                        seg_live += len;
                        seg_records += len;
                    }
                    // A copied tombstone is dead in its source (cleaner.rs).
                    KIND_TOMBSTONE | KIND_RECORD_REMOVED if !entry::is_dead(&seg.buf, at) => {
                        seg_tomb += len
                    }
                    _ => {}
                }
                at += len as usize;
            }
            assert_eq!(at, seg.buf.len(), "entries must tile the segment");
            assert_eq!(seg.live_bytes, seg_live, "segment live bytes drifted");
            assert_eq!(seg.expiring, seg_expiring, "segment expiring count drifted");
            assert_eq!(
                seg.expiry_deadline_sum_ms, seg_sum,
                "segment deadline sum drifted"
            );
            assert!(
                seg_expiring == 0 || seg.earliest_expiry_ms <= seg_earliest,
                "a segment's earliest deadline is late: the sweep would skip a due object"
            );
            assert_eq!(
                seg.tombstone_bytes, seg_tomb,
                "segment tombstone bytes drifted"
            );
            live += seg_live - seg_records;
            records += seg_records;
        }
        self.check_records(records);
        for e in self.index.iter() {
            count += 1;
            let o = self.object(e.loc());
            let hash = crate::key_hash(self.table, o.key);
            assert!(
                self.range.contains(hash),
                "indexed key outside the tablet's range"
            );
            assert_eq!(
                self.prefixer.prefix(hash),
                e.prefix(),
                "index prefix does not match the key"
            );
        }
        assert_eq!(count, self.object_count, "object count drifted");
        assert_eq!(
            self.key_classes,
            self.count_key_classes(),
            "key classes drifted"
        );
        assert_eq!(live, self.live_bytes, "live bytes drifted");
        assert!(
            self.order
                .windows(2)
                .all(|w| self.segs[w[0] as usize].id < self.segs[w[1] as usize].id),
            "segments out of id order"
        );
    }
}
