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
    /// The whole verified entry (`Parsed::entry`): an object winner is
    /// re-appended verbatim, not encoded and checksummed again.
    pub entry: &'s [u8],
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
    /// The newest entry of every key, tombstones too, in the order of each
    /// key's first entry.
    winners: Vec<Winner<'s>>,
    /// Where in `winners` the live objects are: grouped by segment in
    /// feeding order, and within a group in log order only up to `sorted`
    /// (see `object`). Why indices: grouping moves 8 bytes per object, not
    /// an 80-byte winner, in the one piece `finish` runs in.
    order: Vec<usize>,
    /// The end, in `order`, of each segment's group (one per segment fed).
    group_ends: Vec<usize>,
    /// Groups sorted so far, and the objects they cover.
    groups_sorted: usize,
    sorted: usize,
    /// Live side records anchored in the range, in log order.
    pub records: Vec<RecordWinner<'s>>,
    /// The counter the rebuilt tablet must start from.
    pub next_version: u64,
}

impl<'s> Resolved<'s> {
    /// How many live objects the tablet gets.
    pub fn objects(&self) -> usize {
        self.order.len()
    }

    /// The `i`th live object in log order. Each segment's group is sorted
    /// by offset when the first of its objects is asked for. Why not one
    /// sort at `finish`: that sort ran in one piece, 18-47 ms for a 128 MB
    /// tablet of 1 KB objects (measured on a recovery master's shard), while
    /// a group holds at most one segment's entries and is sorted in a step
    /// of the rebuild, between which the shard serves other requests.
    pub fn object(&mut self, i: usize) -> Winner<'s> {
        self.sort_through(i);
        self.winners[self.order[i]]
    }

    /// Put `order[..=i]` in log order (see `object`).
    pub fn sort_through(&mut self, i: usize) {
        while self.sorted <= i && self.groups_sorted < self.group_ends.len() {
            let end = self.group_ends[self.groups_sorted];
            let winners = &self.winners;
            self.order[self.sorted..end].sort_unstable_by_key(|&k| winners[k].position.1);
            self.sorted = end;
            self.groups_sorted += 1;
        }
        debug_assert!(i >= self.order.len() || self.sorted > i);
    }

    /// The positions of the first `n` objects as they stand, without
    /// sorting anything (what a test checks `sort_through` against).
    #[cfg(test)]
    pub fn positions(&self, n: usize) -> Vec<(usize, usize)> {
        self.order[..n]
            .iter()
            .map(|&k| self.winners[k].position)
            .collect()
    }

    /// The keys of every live object, in no particular order.
    #[cfg(test)]
    pub fn keys(&self) -> Vec<&'s [u8]> {
        self.order.iter().map(|&k| self.winners[k].key).collect()
    }
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

#[cfg(test)]
pub(crate) fn resolve<'s>(
    table: TableId,
    range: HashRange,
    segments: impl IntoIterator<Item = &'s [u8]>,
    max_key_bytes: usize,
    max_value_bytes: usize,
    report: &mut ReplayReport,
) -> Result<Resolved<'s>, EngineError> {
    let mut r = Resolver::new(table, range, max_key_bytes, max_value_bytes);
    for buf in segments {
        r.feed(buf, report)?;
    }
    r.finish()
}

/// The newest entry of every key and record seen so far, fed one segment at
/// a time (so a caller may yield between segments: `replay_steps.rs`).
pub(crate) struct Resolver<'s> {
    /// The tablet's table: entries of another table are corrupt.
    table: TableId,
    /// Objects outside it are skipped (records compete across ranges).
    range: HashRange,
    /// Limits an entry is checked against before it is believed.
    max_key_bytes: usize,
    max_value_bytes: usize,
    /// Objects and tombstones, by key: (full key hash, index in `winners`).
    /// Why an index and not the winner: the table doubles as it grows and
    /// a rehash moves every entry in one piece, which the shard cannot
    /// yield in; at 16 bytes an entry instead of a winner's 80 that pause
    /// is a fifth (it was up to 18 ms for one segment's feed of a 128 MB
    /// tablet). The hash is kept so that a rehash reads no winner.
    newest: HashTable<(u64, usize)>,
    /// The newest entry of every key, in order of the key's first entry.
    winners: Vec<Winner<'s>>,
    /// Side records and their removals, by id.
    newest_records: HashMap<RecordId, RecordWinner<'s>>,
    /// Highest version seen plus one, or a mark's counter.
    next_version: u64,
    /// Index of the next segment fed (positions and corrupt reports).
    segments: usize,
}

impl<'s> Resolver<'s> {
    pub fn new(
        table: TableId,
        range: HashRange,
        max_key_bytes: usize,
        max_value_bytes: usize,
    ) -> Resolver<'s> {
        Resolver {
            table,
            range,
            max_key_bytes,
            max_value_bytes,
            newest: HashTable::new(),
            winners: Vec::new(),
            newest_records: HashMap::new(),
            next_version: 1,
            segments: 0,
        }
    }

    /// Resolve the entries of the next segment against those seen.
    pub fn feed(&mut self, buf: &'s [u8], report: &mut ReplayReport) -> Result<(), EngineError> {
        let (table, range) = (self.table, self.range);
        let si = self.segments;
        self.segments += 1;
        let mut at = 0;
        loop {
            let p = match entry::parse(buf, at, table, self.max_key_bytes, self.max_value_bytes) {
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
                self.next_version = self.next_version.max(p.version);
                continue;
            }
            self.next_version = self.next_version.max(p.version + 1);
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
                match self.newest_records.get_mut(&id) {
                    Some(w) => {
                        if p.version > w.version {
                            *w = candidate;
                        }
                    }
                    None => {
                        self.newest_records.try_reserve(1).map_err(oom)?;
                        self.newest_records.insert(id, candidate);
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
                entry: p.entry,
                expires_at_ms: p.expires_at_ms,
            };
            let winners = &mut self.winners;
            let found = self.newest.find(winner_probe(hash), |&(h, i)| {
                h == hash && winners[i].key == p.key
            });
            match found {
                // Equal versions are copies of one entry (a cleaner copy): keep the first.
                Some(&(_, i)) => {
                    let w = &mut winners[i];
                    if p.version > w.version {
                        *w = candidate;
                    }
                }
                None => {
                    winners.try_reserve(1).map_err(oom)?;
                    self.newest
                        .try_reserve(1, |&(h, _)| winner_probe(h))
                        .map_err(oom)?;
                    self.newest.insert_unique(
                        winner_probe(hash),
                        (hash, winners.len()),
                        |&(h, _)| winner_probe(h),
                    );
                    winners.push(candidate);
                }
            }
        }
        Ok(())
    }

    pub fn table(&self) -> TableId {
        self.table
    }

    pub fn range(&self) -> HashRange {
        self.range
    }

    /// The live winners, grouped by segment (each group put in log order
    /// as the build reaches it: `Resolved::object`), and the counter.
    pub fn finish(self) -> Result<Resolved<'s>, EngineError> {
        let range = self.range;
        drop(self.newest);
        // Group the live winners by segment (a counting sort of indices:
        // two passes); each group is put in offset order later, in steps.
        let mut group_ends = Vec::new();
        group_ends.try_reserve_exact(self.segments).map_err(oom)?;
        group_ends.resize(self.segments, 0usize);
        let live = || {
            self.winners
                .iter()
                .enumerate()
                .filter(|(_, w)| w.kind == KIND_OBJECT)
        };
        for (_, w) in live() {
            group_ends[w.position.0] += 1;
        }
        let mut next = Vec::new();
        next.try_reserve_exact(self.segments).map_err(oom)?;
        let mut end = 0;
        for count in &mut group_ends {
            next.push(end);
            end += *count;
            *count = end;
        }
        let mut order = Vec::new();
        order.try_reserve_exact(end).map_err(oom)?;
        order.resize(end, 0usize);
        for (k, w) in live() {
            let slot = &mut next[w.position.0];
            order[*slot] = k;
            *slot += 1;
        }
        let kept = |w: &RecordWinner<'_>| w.kind == KIND_RECORD && range.contains(w.hash);
        let mut records = Vec::new();
        records
            .try_reserve_exact(self.newest_records.values().filter(|w| kept(w)).count())
            .map_err(oom)?;
        records.extend(self.newest_records.into_values().filter(kept));
        records.sort_unstable_by_key(|w| w.position);
        Ok(Resolved {
            winners: self.winners,
            order,
            group_ends,
            groups_sorted: 0,
            sorted: 0,
            records,
            next_version: self.next_version,
        })
    }
}

impl Engine {
    /// Rebuild the tablet `range` of `table` (which must not exist yet) from
    /// segment byte buffers: newest version wins, tombstones respected,
    /// corrupt entries reported and never loaded. Side records are rebuilt
    /// the same way (newest version per record id; see the module comment).
    /// One call: `replay_in_steps` does the same in pieces.
    pub fn replay<'s>(
        &mut self,
        table: TableId,
        range: HashRange,
        segments: impl IntoIterator<Item = &'s [u8]>,
    ) -> Result<ReplayReport, EngineError> {
        let mut resolver = self.replay_in_steps(table, range)?;
        for segment in segments {
            resolver.feed(segment)?;
        }
        let mut build = resolver.build(self)?;
        match build.step(self, usize::MAX) {
            Ok(done) => debug_assert!(done),
            Err(e) => {
                build.abandon(self);
                return Err(e);
            }
        }
        build.finish(self)
    }
}
