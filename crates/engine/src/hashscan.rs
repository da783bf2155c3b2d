//! Visiting a tablet in key-hash order, resumably: the engine side of
//! enumeration (`insitu scan`, `Client::scan`) and of chunked migration.
//!
//! A [`SortedHashes`] is the sorted, deduplicated list of a tablet's key
//! hashes at or after a cursor, taken once in O(n log n) and charged to the
//! memory budget (8 bytes per object). A caller then walks it in O(batch)
//! per step: each hash is looked up in the index again
//! ([`Engine::objects_with_hash`]), so the walk never holds a log position
//! and cleaning in between is harmless. The cursor is a key hash, so a lost
//! or stale list is only a cost (rebuild from the cursor), never an error.
//!
//! What a walk guarantees: an object present and unchanged from the moment
//! the list was taken until its hash is reached is returned exactly once
//! (hashes only grow along the walk, and all objects sharing a hash are
//! returned together). An object overwritten before its hash is reached is
//! returned with its newest value; one removed is skipped; one created after
//! the list was taken is not returned. With writes frozen (migration), the
//! walk is therefore exact: every object of the tablet exactly once.

use std::cell::Cell;

use crate::index::probe_hash;
use crate::{Engine, EngineError, HashRange, ObjectRef, TableId, TransientCharge};

/// Work done by hash-order walks, for tests and statistics: proves a walk
/// costs O(batch), not O(tablet), per step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HashScanWork {
    /// Index entries read while taking `SortedHashes` lists.
    pub entries_listed: u64,
    /// Index lookups by hash (`objects_with_hash`).
    pub index_probes: u64,
}

/// Counters behind `HashScanWork` (cells: the walks take `&self`).
#[derive(Default)]
pub(crate) struct WorkCounters {
    entries_listed: Cell<u64>,
    index_probes: Cell<u64>,
}

/// A tablet's distinct key hashes at or after a cursor, ascending; charged
/// to the engine's memory budget while it lives.
pub struct SortedHashes {
    table: TableId,
    start_hash: u64,
    /// The tablet instance and range it was taken from: a dropped,
    /// re-created or split tablet makes it stale.
    generation: u64,
    range: HashRange,
    hashes: Vec<u64>,
    /// `hashes` counted against the budget.
    _charge: TransientCharge,
}

impl SortedHashes {
    pub fn table(&self) -> TableId {
        self.table
    }

    /// Range start of the tablet it lists.
    pub fn start_hash(&self) -> u64 {
        self.start_hash
    }

    pub fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    /// Position of the first hash >= `hash`.
    pub fn position_of(&self, hash: u64) -> usize {
        self.hashes.partition_point(|&h| h < hash)
    }

    /// Bytes it holds (and charges to the budget).
    pub fn bytes(&self) -> u64 {
        (self.hashes.capacity() * 8) as u64
    }
}

/// Where a chunked extraction stands (see `Engine::extract_chunk`).
pub struct ExtractCursor {
    hashes: SortedHashes,
    /// Next position in `hashes`.
    pos: usize,
}

impl ExtractCursor {
    /// Whether every object was returned.
    pub fn is_done(&self) -> bool {
        self.pos >= self.hashes.hashes.len()
    }

    /// The next hash to copy (`None` when done): where a resumed copy stands.
    pub fn next_hash(&self) -> Option<u64> {
        self.hashes.hashes.get(self.pos).copied()
    }
}

/// One chunk of a tablet's objects, (key, value, version), with their copy
/// charged to the memory budget until dropped.
pub struct ExtractChunk {
    pub objects: Vec<(Vec<u8>, Vec<u8>, u64)>,
    /// Key and value bytes plus per-object overhead of `objects`.
    pub charge: TransientCharge,
}

/// Bytes one extracted object costs in memory: its bytes plus the two
/// `Vec` headers and the version.
fn extracted_bytes(o: &ObjectRef<'_>) -> u64 {
    (o.key.len() + o.value.len() + std::mem::size_of::<(Vec<u8>, Vec<u8>, u64)>()) as u64
}

impl Engine {
    /// Work counters of hash-order walks since the engine was created.
    pub fn hash_scan_work(&self) -> HashScanWork {
        HashScanWork {
            entries_listed: self.work.entries_listed.get(),
            index_probes: self.work.index_probes.get(),
        }
    }

    /// The distinct key hashes >= `from_hash` of the tablet starting at
    /// `start_hash`, ascending. O(n log n); 8 bytes per object, charged to
    /// the budget (`OutOfMemory` if they do not fit).
    pub fn sorted_hashes(
        &self,
        table: TableId,
        start_hash: u64,
        from_hash: u64,
    ) -> Result<SortedHashes, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        let wanted = t.index.iter().filter(|e| e.hash >= from_hash).count();
        self.work
            .entries_listed
            .set(self.work.entries_listed.get() + 2 * t.index.len() as u64);
        let charge = self.try_charge_transient(wanted as u64 * 8)?;
        let mut hashes = Vec::new();
        hashes
            .try_reserve_exact(wanted)
            .map_err(|_| EngineError::OutOfMemory)?;
        hashes.extend(
            t.index
                .iter()
                .filter(|e| e.hash >= from_hash)
                .map(|e| e.hash),
        );
        hashes.sort_unstable();
        hashes.dedup();
        Ok(SortedHashes {
            table,
            start_hash,
            generation: t.generation,
            range: t.range,
            hashes,
            _charge: charge,
        })
    }

    /// Whether `list` was taken from the tablet that now starts at its
    /// start hash (same instance, same range). A stale list must be rebuilt.
    pub fn sorted_hashes_current(&self, list: &SortedHashes) -> bool {
        self.tablet_at(list.table, list.start_hash)
            .is_ok_and(|t| t.generation == list.generation && t.range == list.range)
    }

    /// Call `f` for every live object of the tablet whose key hash is
    /// exactly `hash`, in key order (distinct keys rarely share a hash).
    /// Returns how many there were. One index probe. The objects borrow
    /// from the engine, so a caller may keep them for a reply.
    pub fn objects_with_hash<'e>(
        &'e self,
        table: TableId,
        start_hash: u64,
        hash: u64,
        mut f: impl FnMut(ObjectRef<'e>),
    ) -> Result<usize, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        self.work.index_probes.set(self.work.index_probes.get() + 1);
        let mut found = t
            .index
            .iter_hash(probe_hash(hash))
            .filter(|e| e.hash == hash)
            .map(|e| t.object(e.loc));
        let Some(first) = found.next() else {
            return Ok(0);
        };
        let Some(second) = found.next() else {
            f(first);
            return Ok(1);
        };
        // A collision: collect (bounded by the colliding keys) and sort by key.
        let mut all = vec![first, second];
        all.extend(found);
        all.sort_unstable_by(|a, b| a.key.cmp(b.key));
        let n = all.len();
        all.into_iter().for_each(&mut f);
        Ok(n)
    }

    /// Start a chunked copy of the tablet's live objects (migration): takes
    /// its sorted hash list (8 bytes per object, charged to the budget).
    pub fn extract_begin(
        &self,
        table: TableId,
        start_hash: u64,
    ) -> Result<ExtractCursor, EngineError> {
        Ok(ExtractCursor {
            hashes: self.sorted_hashes(table, start_hash, 0)?,
            pos: 0,
        })
    }

    /// Copy the next objects of a chunked extraction, in hash order, until
    /// about `max_bytes` (at least one hash's objects, and never splitting
    /// the objects of one hash); empty once `cursor.is_done()`. O(chunk).
    /// The copy is charged to the budget (`OutOfMemory`, cursor unmoved, if
    /// it does not fit). Exact when the tablet is frozen between calls: each
    /// of its objects is returned exactly once. Cleaning in between is fine;
    /// writes in between follow the rule in this module's docs. Fails with
    /// `UnknownTablet` if the tablet was dropped, `BadTablet` if it was
    /// re-created or split since `extract_begin`.
    pub fn extract_chunk(
        &self,
        cursor: &mut ExtractCursor,
        max_bytes: usize,
    ) -> Result<ExtractChunk, EngineError> {
        let (table, start) = (cursor.hashes.table, cursor.hashes.start_hash);
        self.tablet_at(table, start)?;
        if !self.sorted_hashes_current(&cursor.hashes) {
            return Err(EngineError::BadTablet(
                "the tablet was re-created or split during its extraction".into(),
            ));
        }
        // First pass: how far this chunk goes and what it costs.
        let mut end = cursor.pos;
        let (mut bytes, mut count) = (0u64, 0usize);
        while let Some(&h) = cursor.hashes.hashes.get(end) {
            let mut group = 0u64;
            let n = self.objects_with_hash(table, start, h, |o| group += extracted_bytes(&o))?;
            if end > cursor.pos && bytes + group > max_bytes as u64 {
                break;
            }
            bytes += group;
            count += n;
            end += 1;
        }
        let charge = self.try_charge_transient(bytes)?;
        let mut objects = Vec::new();
        objects
            .try_reserve_exact(count)
            .map_err(|_| EngineError::OutOfMemory)?;
        let mut failed = false;
        for &h in &cursor.hashes.hashes[cursor.pos..end] {
            self.objects_with_hash(table, start, h, |o| {
                let copied = copy(o.key).zip(copy(o.value));
                match copied {
                    // Within the reserved count unless the tablet changed
                    // between the passes (it cannot: `&self` holds it).
                    Some((k, v)) if objects.len() < objects.capacity() => {
                        objects.push((k, v, o.version))
                    }
                    _ => failed = true,
                }
            })?;
        }
        if failed {
            return Err(EngineError::OutOfMemory);
        }
        cursor.pos = end;
        Ok(ExtractChunk { objects, charge })
    }
}

/// A fallible copy of a borrowed byte string (`None` when allocation fails).
fn copy(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes.len()).ok()?;
    v.extend_from_slice(bytes);
    Some(v)
}
