//! Replay: decide, from untrusted segment bytes, which objects a tablet holds.
//!
//! Every entry is verified (`entry::parse`) before it is believed. For each
//! key the entry with the highest version wins, whether object or tombstone,
//! across all segments and in any order; a winning tombstone means absent.
//! Version marks and every valid entry of the table (even outside `range`,
//! since a split tablet shares its parent's counter) raise the version
//! counter, so versions keep growing after recovery. Building the tablet from
//! the winners is left to the engine, which owns the budget.
//!
//! Side records (`records.rs`) are resolved apart from objects, per
//! `RecordId`: the newest of its records and removals wins, across *every*
//! anchor, and only then is a live winner kept if its anchor hashes into
//! `range`. Why not filter by range first, as objects are: a record's
//! identity is its id, not its anchor, so a record re-put under an anchor in
//! the other half before a split leaves in the kept half's log an older
//! entry of it, anchored in range, that only the out-of-range newer entry
//! shows to be superseded (or, once that entry died in the split and the
//! cleaner dropped it, the removal the split logged: `split.rs`).
//! (For objects the key is the identity, so every version of a key shares
//! its range.) Entries out of range are never newer than the truth for the
//! range: after a split, a tablet's log gains only entries anchored in its
//! range and the split's removals of the records that left, each with a
//! higher version.

use hashbrown::{HashMap, HashTable};

use crate::entry::{
    self, Bad, KIND_MARK, KIND_OBJECT, KIND_RECORD, KIND_RECORD_REMOVED, KIND_TOMBSTONE,
};
use crate::segment::Purpose;
use crate::tablet::Tablet;
use crate::{CorruptEntry, Engine, EngineError, HashRange, RecordId, ReplayReport, TableId};

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
    /// An object's deadline (Unix ms; 0: none). An expired winner is still
    /// rebuilt: replay does not read the clock (the shard's expiry sweep
    /// removes it, with a tombstone, as it would have before the crash).
    pub expires_at_ms: u64,
}

/// The newest entry seen for one side record id (record or removal).
#[derive(Clone, Copy)]
pub(crate) struct RecordWinner<'s> {
    /// The record this is the newest entry of.
    pub id: RecordId,
    /// Of the anchor: a live winner is kept only inside the range.
    pub hash: u64,
    /// Decides between entries of one id (copies share it).
    pub version: u64,
    /// `KIND_RECORD` or `KIND_RECORD_REMOVED`.
    pub kind: u8,
    /// (segment index, offset): log order, for a deterministic rebuild.
    pub position: (usize, usize),
    /// Re-appended as the rebuilt record's key.
    pub anchor: &'s [u8],
    /// The payload (of a removal: its recorded segment id; never used).
    pub payload: &'s [u8],
}

pub(crate) struct Resolved<'s> {
    /// Live objects, in log order.
    pub objects: Vec<Winner<'s>>,
    /// Live side records anchored in the range, in log order.
    pub records: Vec<RecordWinner<'s>>,
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
    let mut newest_records: HashMap<RecordId, RecordWinner<'s>> = HashMap::new();
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
            next_version = next_version.max(p.version + 1);
            let hash = crate::key_hash(table, p.key);
            if p.kind == KIND_RECORD || p.kind == KIND_RECORD_REMOVED {
                // `parse` checked the value's length; refused, not trusted.
                let Some((id, payload)) = entry::split_record_value(p.value) else {
                    report.corrupt.try_reserve(1).map_err(oom)?;
                    report.corrupt.push(CorruptEntry {
                        segment: si,
                        offset: position.1,
                        reason: "record value shorter than its id".into(),
                    });
                    continue;
                };
                let candidate = RecordWinner {
                    id,
                    hash,
                    version: p.version,
                    kind: p.kind,
                    position,
                    anchor: p.key,
                    payload,
                };
                // Every anchor competes (see the module comment); equal
                // versions are copies of one entry: keep the first.
                match newest_records.get_mut(&id) {
                    Some(w) => {
                        if p.version > w.version {
                            *w = candidate;
                        }
                    }
                    None => {
                        newest_records.try_reserve(1).map_err(oom)?;
                        newest_records.insert(id, candidate);
                    }
                }
                continue;
            }
            debug_assert!(p.kind == KIND_OBJECT || p.kind == KIND_TOMBSTONE);
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
                expires_at_ms: p.expires_at_ms,
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
    let kept = |w: &RecordWinner<'_>| w.kind == KIND_RECORD && range.contains(w.hash);
    let mut records = Vec::new();
    records
        .try_reserve_exact(newest_records.values().filter(|w| kept(w)).count())
        .map_err(oom)?;
    records.extend(newest_records.into_values().filter(kept));
    records.sort_unstable_by_key(|w| w.position);
    Ok(Resolved {
        objects,
        records,
        next_version,
    })
}

impl Engine {
    /// Rebuild the tablet `range` of `table` (which must not exist yet) from
    /// segment byte buffers: newest version wins, tombstones respected,
    /// corrupt entries reported and never loaded. Side records are rebuilt
    /// the same way (newest version per record id; see the module comment).
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
        report.records_loaded = resolved.records.len() as u64;
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
            self.with_room_retry(|budget| {
                t.push_new(budget, w.hash, w.key, w.value, w.version, w.expires_at_ms)
            })?;
        }
        // Records keep their versions (all below the counter).
        t.reserve_records(&mut self.budget, resolved.records.len())?;
        for w in &resolved.records {
            self.with_room_retry(|budget| {
                t.push_record(budget, w.id, w.anchor, w.payload, w.version)
            })?;
        }
        Ok(())
    }
}
