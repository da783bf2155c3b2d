//! Replay: decide, from untrusted segment bytes, which objects a tablet holds.
//!
//! Every entry is verified (`entry::parse`) before it is believed. For each
//! key the entry with the highest version wins, whether object or tombstone,
//! across all segments and in any order; a winning tombstone means absent.
//! Version marks and every valid entry of the table (even outside `range`,
//! since a split tablet shares its parent's counter) raise the version
//! counter, so versions keep growing after recovery. Building the tablet from
//! the winners is left to the engine, which owns the budget.

use hashbrown::HashTable;

use crate::entry::{self, Bad, KIND_MARK, KIND_OBJECT, KIND_TOMBSTONE};
use crate::segment::Purpose;
use crate::tablet::Tablet;
use crate::{CorruptEntry, Engine, EngineError, HashRange, ReplayReport, TableId};

/// The newest entry seen for one key.
#[derive(Clone, Copy)]
pub(crate) struct Winner<'s> {
    pub hash: u64,
    pub version: u64,
    pub kind: u8,
    /// (segment index, offset): log order, for a deterministic rebuild.
    pub position: (usize, usize),
    pub key: &'s [u8],
    pub value: &'s [u8],
}

pub(crate) struct Resolved<'s> {
    /// Live objects, in log order.
    pub objects: Vec<Winner<'s>>,
    /// The counter the rebuilt tablet must start from.
    pub next_version: u64,
}

/// The probe hash of replay's own table of winners, which keeps full key
/// hashes. A tablet's keys share their top bits and hashbrown takes its tag
/// from the top bits: rotating moves well-mixed low bits there.
#[inline(always)]
fn winner_probe(key_hash: u64) -> u64 {
    key_hash.rotate_right(16)
}

fn oom<T>(_: T) -> EngineError {
    EngineError::OutOfMemory
}

pub(crate) fn resolve<'s>(
    table: TableId,
    range: HashRange,
    segments: impl IntoIterator<Item = &'s [u8]>,
    max_key_bytes: usize,
    max_value_bytes: usize,
    report: &mut ReplayReport,
) -> Result<Resolved<'s>, EngineError> {
    let mut newest: HashTable<Winner<'s>> = HashTable::new();
    let mut next_version = 1u64;
    for (si, buf) in segments.into_iter().enumerate() {
        let mut at = 0;
        loop {
            let p = match entry::parse(buf, at, table, max_key_bytes, max_value_bytes) {
                Ok(p) => p,
                Err(Bad::End) => break,
                Err(Bad::Stop(reason)) => {
                    report.corrupt.try_reserve(1).map_err(oom)?;
                    report.corrupt.push(CorruptEntry {
                        segment: si,
                        offset: at,
                        reason,
                    });
                    break; // the length cannot be trusted: the rest of this segment is lost
                }
                Err(Bad::Skip { reason, next }) => {
                    report.corrupt.try_reserve(1).map_err(oom)?;
                    report.corrupt.push(CorruptEntry {
                        segment: si,
                        offset: at,
                        reason,
                    });
                    at = next;
                    continue;
                }
            };
            let position = (si, at);
            at = p.next;
            // Versions the engine never issues: refused like any corrupt entry
            // (a mark holds a counter, which may be one past the last version).
            let limit = if p.kind == KIND_MARK {
                crate::MAX_VERSION + 1
            } else {
                crate::MAX_VERSION
            };
            if p.version > limit {
                report.corrupt.try_reserve(1).map_err(oom)?;
                report.corrupt.push(CorruptEntry {
                    segment: si,
                    offset: position.1,
                    reason: format!("version {} beyond the maximum {limit}", p.version),
                });
                continue;
            }
            if p.kind == KIND_MARK {
                next_version = next_version.max(p.version);
                continue;
            }
            debug_assert!(p.kind == KIND_OBJECT || p.kind == KIND_TOMBSTONE);
            next_version = next_version.max(p.version + 1);
            let hash = crate::key_hash(table, p.key);
            if !range.contains(hash) {
                continue;
            }
            report.entries_read += 1;
            let candidate = Winner {
                hash,
                version: p.version,
                kind: p.kind,
                position,
                key: p.key,
                value: p.value,
            };
            match newest.find_mut(winner_probe(hash), |w| w.hash == hash && w.key == p.key) {
                // Equal versions are copies of one entry (a cleaner copy): keep the first.
                Some(w) => {
                    if p.version > w.version {
                        *w = candidate;
                    }
                }
                None => {
                    newest
                        .try_reserve(1, |w| winner_probe(w.hash))
                        .map_err(oom)?;
                    newest.insert_unique(winner_probe(hash), candidate, |w| winner_probe(w.hash));
                }
            }
        }
    }
    let live = newest.iter().filter(|w| w.kind == KIND_OBJECT).count();
    let mut objects = Vec::new();
    objects.try_reserve_exact(live).map_err(oom)?;
    objects.extend(newest.into_iter().filter(|w| w.kind == KIND_OBJECT));
    objects.sort_unstable_by_key(|w| w.position);
    Ok(Resolved {
        objects,
        next_version,
    })
}

impl Engine {
    /// Rebuild the tablet `range` of `table` (which must not exist yet) from
    /// segment byte buffers: newest version wins, tombstones respected,
    /// corrupt entries reported and never loaded.
    pub fn replay<'s>(
        &mut self,
        table: TableId,
        range: HashRange,
        segments: impl IntoIterator<Item = &'s [u8]>,
    ) -> Result<ReplayReport, EngineError> {
        self.check_free_range(table, range)?;
        let mut report = ReplayReport::default();
        let resolved = resolve(
            table,
            range,
            segments,
            self.max_key_bytes,
            self.config.max_value_bytes,
            &mut report,
        )?;
        let mut t = Tablet::new(table, range, resolved.next_version);
        let built = self.build_replayed(&mut t, &resolved);
        if let Err(e) = built {
            t.release(&mut self.budget);
            return Err(e);
        }
        report.objects_loaded = resolved.objects.len() as u64;
        self.add_tablet(t)?;
        Ok(report)
    }

    pub(crate) fn build_replayed(
        &mut self,
        t: &mut Tablet,
        resolved: &Resolved<'_>,
    ) -> Result<(), EngineError> {
        t.reserve_index(&mut self.budget, resolved.objects.len())?;
        if t.next_version > 1 {
            // Log the counter even if no object survives (see split_tablet).
            self.with_room_retry(|budget| t.open_head(budget, Purpose::Object))?;
        }
        for w in &resolved.objects {
            self.with_room_retry(|budget| t.push_new(budget, w.hash, w.key, w.value, w.version))?;
        }
        Ok(())
    }
}
