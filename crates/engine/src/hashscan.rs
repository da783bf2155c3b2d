//! Visiting a tablet in key-hash order, resumably: the engine side of
//! enumeration (`insitu scan`, `Client::scan`) and of chunked migration.
//!
//! A [`SortedHashes`] is the list of a tablet's distinct key hashes at or
//! after a cursor, in ascending order, charged to the memory budget (8 bytes
//! per object). Taking it costs two passes over the index that place every
//! hash in one of `BUCKETS` buckets by its prefix within the tablet's range
//! (bucket b's hashes are all below bucket b+1's); each bucket is sorted
//! only when the walk reaches it. Why: sorting 1M hashes at once held the
//! shard for ~20 ms, two O(n) passes take a few, and a bucket of ~1,000
//! hashes sorts in microseconds. A caller then walks it in O(batch) per step: each hash is looked up in the index again
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

/// Buckets of a [`SortedHashes`]: ~1,000 hashes each at 1M objects, so
/// sorting one when the walk reaches it costs microseconds, and the bounds
/// cost 16 KiB per list.
const BUCKETS: usize = 1024;

/// A tablet's distinct key hashes at or after a cursor, ascending; charged
/// to the engine's memory budget while it lives.
pub struct SortedHashes {
    table: TableId,
    start_hash: u64,
    /// The tablet instance and range it was taken from: a dropped,
    /// re-created or split tablet makes it stale.
    generation: u64,
    range: HashRange,
    /// The hashes grouped by bucket: bucket b is `hashes[bounds[b]..bounds[b + 1]]`.
    hashes: Vec<u64>,
    /// `BUCKETS + 1` offsets into `hashes`.
    bounds: Vec<usize>,
    /// Buckets below this are sorted and deduplicated; bucket b's distinct
    /// hashes are then `hashes[bounds[b]..ends[b]]` (the rest of it is stale).
    sorted: usize,
    ends: Vec<usize>,
    /// `hashes` and the offsets counted against the budget.
    _charge: TransientCharge,
}

/// Maps a hash of a range to its bucket: the offset in the range scaled to
/// `0..BUCKETS` by one multiplication (monotone in the hash). The division
/// is done once per list, not per hash (a u128 division costs tens of ns).
#[derive(Clone, Copy)]
struct Bucketer {
    start: u64,
    scale: u128,
}

impl Bucketer {
    fn new(range: HashRange) -> Bucketer {
        let len = u128::from(range.end - range.start) + 1;
        Bucketer {
            start: range.start,
            scale: ((BUCKETS as u128) << 64) / len,
        }
    }

    #[inline]
    fn bucket(self, hash: u64) -> usize {
        let off = u128::from(hash.wrapping_sub(self.start));
        (((off * self.scale) >> 64) as usize).min(BUCKETS - 1)
    }
}

#[cfg(test)]
fn bucket_of(range: HashRange, hash: u64) -> usize {
    Bucketer::new(range).bucket(hash)
}

/// Sort `hashes` and move its distinct values to the front (two keys may
/// share a hash; the walk visits a hash once); returns how many there are.
fn sort_distinct(hashes: &mut [u64]) -> usize {
    hashes.sort_unstable();
    let mut distinct = 0;
    for i in 0..hashes.len() {
        if distinct == 0 || hashes[i] != hashes[distinct - 1] {
            hashes[distinct] = hashes[i];
            distinct += 1;
        }
    }
    distinct
}

impl SortedHashes {
    pub fn table(&self) -> TableId {
        self.table
    }

    /// Range start of the tablet it lists.
    pub fn start_hash(&self) -> u64 {
        self.start_hash
    }

    /// Sort (and deduplicate) buckets until the one holding slot `pos`.
    fn sort_through(&mut self, pos: usize) {
        while self.sorted < BUCKETS && self.bounds[self.sorted] <= pos {
            let b = self.sorted;
            let distinct = sort_distinct(&mut self.hashes[self.bounds[b]..self.bounds[b + 1]]);
            self.ends[b] = self.bounds[b] + distinct;
            self.sorted += 1;
        }
    }

    /// The first distinct hash at slot `pos` or after, with its slot; `None`
    /// past the end. Slots only grow along the walk: the next call asks for
    /// the returned slot + 1.
    pub fn next_from(&mut self, mut pos: usize) -> Option<(usize, u64)> {
        loop {
            if pos >= self.hashes.len() {
                return None;
            }
            self.sort_through(pos);
            // The bucket holding `pos`: the last one starting at or before it.
            let b = self.bounds[..self.sorted].partition_point(|&s| s <= pos) - 1;
            if pos < self.ends[b] {
                return Some((pos, self.hashes[pos]));
            }
            pos = self.bounds[b + 1]; // past this bucket's duplicates
        }
    }

    /// Every distinct hash, ascending (sorts what is not sorted yet).
    pub fn hashes(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut pos = 0;
        while let Some((p, h)) = self.next_from(pos) {
            out.push(h);
            pos = p + 1;
        }
        out
    }

    /// Bytes it holds (and charges to the budget).
    pub fn bytes(&self) -> u64 {
        list_bytes(self.hashes.capacity())
    }
}

/// Bytes a list of `n` hashes holds: the hashes plus its two offset arrays.
fn list_bytes(n: usize) -> u64 {
    (n * 8 + (2 * BUCKETS + 1) * std::mem::size_of::<usize>()) as u64
}

/// Where a chunked extraction stands (see `Engine::extract_chunk`).
pub struct ExtractCursor {
    hashes: SortedHashes,
    /// The next slot and hash to copy (`None`: done).
    next: Option<(usize, u64)>,
}

impl ExtractCursor {
    /// Whether every object was returned.
    pub fn is_done(&self) -> bool {
        self.next.is_none()
    }

    /// The next hash to copy (`None` when done): where a resumed copy stands.
    pub fn next_hash(&self) -> Option<u64> {
        self.next.map(|(_, h)| h)
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
    /// `start_hash`, ascending. Two O(n) passes now, each bucket sorted when
    /// the walk reaches it; 8 bytes per object, charged to
    /// the budget (`OutOfMemory` if they do not fit).
    pub fn sorted_hashes(
        &self,
        table: TableId,
        start_hash: u64,
        from_hash: u64,
    ) -> Result<SortedHashes, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        let range = t.range;
        let bucketer = Bucketer::new(range);
        // Pass one: how many hashes fall in each bucket.
        let mut bounds = vec![0usize; BUCKETS + 1];
        for e in t.index.iter().filter(|e| e.hash >= from_hash) {
            bounds[bucketer.bucket(e.hash) + 1] += 1;
        }
        for b in 0..BUCKETS {
            bounds[b + 1] += bounds[b];
        }
        let wanted = bounds[BUCKETS];
        self.work
            .entries_listed
            .set(self.work.entries_listed.get() + 2 * t.index.len() as u64);
        let charge = self.try_charge_transient(list_bytes(wanted))?;
        let mut hashes = Vec::new();
        hashes
            .try_reserve_exact(wanted)
            .map_err(|_| EngineError::OutOfMemory)?;
        hashes.resize(wanted, 0);
        // Pass two: place each hash in its bucket.
        let mut fill = bounds.clone();
        for e in t.index.iter().filter(|e| e.hash >= from_hash) {
            let b = bucketer.bucket(e.hash);
            hashes[fill[b]] = e.hash;
            fill[b] += 1;
        }
        debug_assert_eq!(fill[..BUCKETS], bounds[1..]);
        Ok(SortedHashes {
            table,
            start_hash,
            generation: t.generation,
            range,
            hashes,
            bounds,
            sorted: 0,
            ends: vec![0; BUCKETS],
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
        let mut hashes = self.sorted_hashes(table, start_hash, 0)?;
        let next = hashes.next_from(0);
        Ok(ExtractCursor { hashes, next })
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
        // First pass: how far this chunk goes and what it costs. The list is
        // only advanced on a copy below; `next` is where the chunk stops.
        let mut chunk_hashes = Vec::new();
        let mut next = cursor.next;
        let (mut bytes, mut count) = (0u64, 0usize);
        while let Some((slot, h)) = next {
            let mut group = 0u64;
            let n = self.objects_with_hash(table, start, h, |o| group += extracted_bytes(&o))?;
            if !chunk_hashes.is_empty() && bytes + group > max_bytes as u64 {
                break;
            }
            bytes += group;
            count += n;
            chunk_hashes.push(h);
            next = cursor.hashes.next_from(slot + 1);
        }
        let charge = self.try_charge_transient(bytes)?;
        let mut objects = Vec::new();
        objects
            .try_reserve_exact(count)
            .map_err(|_| EngineError::OutOfMemory)?;
        let mut failed = false;
        for &h in &chunk_hashes {
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
        cursor.next = next;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_in_bounds_for_any_range() {
        let ranges = [
            HashRange::FULL,
            HashRange::new(0, 0).unwrap(),
            HashRange::new(5, 5 + 1000).unwrap(),
            HashRange::new(u64::MAX / 3, u64::MAX / 3 * 2).unwrap(),
            HashRange::new(u64::MAX - 10, u64::MAX).unwrap(),
        ];
        for r in ranges {
            let mut last = 0;
            let steps = 10_000u64;
            let width = r.end - r.start;
            for i in 0..=steps {
                let h = r.start + (u128::from(width) * u128::from(i) / u128::from(steps)) as u64;
                let b = bucket_of(r, h);
                assert!(b < BUCKETS, "{r:?} {h}");
                assert!(b >= last, "not monotone in {r:?} at {h}");
                last = b;
            }
            assert_eq!(bucket_of(r, r.start), 0);
            if width >= BUCKETS as u64 {
                assert_eq!(bucket_of(r, r.end), BUCKETS - 1, "{r:?}");
            }
        }
    }

    #[test]
    fn sort_distinct_keeps_each_hash_once() {
        let mut v = vec![5, 1, 5, 3, 1, 1, 9];
        let n = sort_distinct(&mut v);
        assert_eq!(&v[..n], &[1, 3, 5, 9]);
        assert_eq!(sort_distinct(&mut []), 0);
    }
}
