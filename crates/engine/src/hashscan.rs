//! Visiting a tablet in key-hash order, resumably: the engine side of
//! enumeration (`insitu scan`, `Client::scan`) and of chunked migration.
//!
//! The walk's unit is a *hash group*: the keys of one index prefix (the 28
//! bits of the hash an index slot keeps, `index.rs`), almost always one key.
//! A [`SortedHashes`] is the list of a tablet's distinct prefixes at or
//! after a cursor, in ascending order, charged to the memory budget (4 bytes
//! per object). Taking it costs two passes over the index that place every
//! prefix in one of `BUCKETS` buckets by its top bits (bucket b's prefixes
//! are all below bucket b+1's); each bucket is sorted only when the walk
//! reaches it. Why: sorting 1M hashes at once held the shard for ~20 ms, two
//! O(n) passes take a few, and a bucket of ~1,000 sorts in microseconds. A
//! caller then walks it in O(batch) per step: each group is looked up in the
//! index again ([`Engine::objects_in_hash_group`]), so the walk never holds
//! a log position and cleaning in between is harmless. A step's cursor is
//! the lowest hash of its group (or the list's cursor, for the first), so a
//! lost or stale list is only a cost (rebuild from the cursor), never an error.
//!
//! What a walk guarantees: an object present and unchanged from the moment
//! the list was taken until its group is reached is returned exactly once
//! (groups are disjoint hash intervals visited in ascending order, and all
//! objects of a group are returned together). An object overwritten before
//! its group is reached is returned with its newest value; one removed is
//! skipped; one created after the list was taken is returned only if its
//! group was listed. With writes frozen (migration), the walk is therefore
//! exact: every object of the tablet exactly once.

use std::cell::Cell;

use crate::index::{PREFIX_BITS, Prefixer, probe_hash};
use crate::tablet::Tablet;
use crate::{Engine, EngineError, HashRange, ObjectRef, TableId, TransientCharge};

/// Work done by hash-order walks, for tests and statistics: proves a walk
/// costs O(batch), not O(tablet), per step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HashScanWork {
    /// Index entries read while taking `SortedHashes` lists.
    pub entries_listed: u64,
    /// Index lookups by hash or hash group (`objects_with_hash`,
    /// `objects_in_hash_group`).
    pub index_probes: u64,
}

/// Counters behind `HashScanWork` (cells: the walks take `&self`).
#[derive(Default)]
pub(crate) struct WorkCounters {
    entries_listed: Cell<u64>,
    index_probes: Cell<u64>,
}

/// Buckets of a [`SortedHashes`]: ~1,000 prefixes each at 1M objects, so
/// sorting one when the walk reaches it costs microseconds, and the bounds
/// cost 16 KiB per list. A prefix's bucket is its top 10 bits (a tablet's
/// prefixes fill at least half of their space, so at least 512 are used).
const BUCKET_BITS: u32 = 10;
const BUCKETS: usize = 1 << BUCKET_BITS;

#[inline(always)]
fn bucket(prefix: u32) -> usize {
    (prefix >> (PREFIX_BITS - BUCKET_BITS)) as usize
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
    prefixer: Prefixer,
    /// The cursor it was taken from (clamped to the range): the first
    /// group's objects below it are not returned.
    from: u64,
    /// The prefixes grouped by bucket: bucket b is `prefixes[bounds[b]..bounds[b + 1]]`.
    prefixes: Vec<u32>,
    /// `BUCKETS + 1` offsets into `prefixes`.
    bounds: Vec<usize>,
    /// Buckets below this are sorted and deduplicated; bucket b's distinct
    /// prefixes are then `prefixes[bounds[b]..ends[b]]` (the rest is stale).
    sorted: usize,
    ends: Vec<usize>,
    /// `prefixes` and the offsets counted against the budget.
    _charge: TransientCharge,
}

/// Sort `hashes` and move its distinct values to the front (keys may share
/// a prefix; the walk visits a group once); returns how many there are.
fn sort_distinct(hashes: &mut [u32]) -> usize {
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
            let distinct = sort_distinct(&mut self.prefixes[self.bounds[b]..self.bounds[b + 1]]);
            self.ends[b] = self.bounds[b] + distinct;
            self.sorted += 1;
        }
    }

    /// The first group at slot `pos` or after, as its cursor (its lowest
    /// hash, or the list's cursor for the group holding it), with its slot;
    /// `None` past the end. Slots only grow along the walk: the next call
    /// asks for the returned slot + 1.
    pub fn next_from(&mut self, mut pos: usize) -> Option<(usize, u64)> {
        loop {
            if pos >= self.prefixes.len() {
                return None;
            }
            self.sort_through(pos);
            // The bucket holding `pos`: the last one starting at or before it.
            let b = self.bounds[..self.sorted].partition_point(|&s| s <= pos) - 1;
            if pos < self.ends[b] {
                let hash = self.prefixer.lowest(self.prefixes[pos]).max(self.from);
                return Some((pos, hash));
            }
            pos = self.bounds[b + 1]; // past this bucket's duplicates
        }
    }

    /// Every group's cursor, ascending (sorts what is not sorted yet).
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
        list_bytes(self.prefixes.capacity())
    }
}

/// Bytes a list of `n` prefixes holds: the prefixes plus its two offset arrays.
fn list_bytes(n: usize) -> u64 {
    (n * 4 + (2 * BUCKETS + 1) * std::mem::size_of::<usize>()) as u64
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
    /// (key, value, version, deadline in Unix ms (0: none)); expired
    /// objects are left out, like from every other visit.
    pub objects: Vec<(Vec<u8>, Vec<u8>, u64, u64)>,
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

    /// The hash groups of the tablet starting at `start_hash` holding
    /// hashes >= `from_hash`, ascending. Two O(n) passes over the index now,
    /// each bucket sorted when the walk reaches it; 4 bytes per object,
    /// charged to the budget (`OutOfMemory` if they do not fit).
    pub fn sorted_hashes(
        &self,
        table: TableId,
        start_hash: u64,
        from_hash: u64,
    ) -> Result<SortedHashes, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        let range = t.range;
        let prefixer = t.prefixer;
        let from = from_hash.max(range.start);
        // Past the range's end nothing is listed; else every prefix at or
        // above the cursor's (its group may hold hashes below the cursor:
        // `objects_in_hash_group` leaves them out).
        let lowest = (from <= range.end).then(|| prefixer.prefix(from));
        let wanted_prefix = |p: u32| lowest.is_some_and(|l| p >= l);
        // Pass one: how many prefixes fall in each bucket.
        let mut bounds = vec![0usize; BUCKETS + 1];
        for e in t.index.iter().filter(|e| wanted_prefix(e.prefix())) {
            bounds[bucket(e.prefix()) + 1] += 1;
        }
        for b in 0..BUCKETS {
            bounds[b + 1] += bounds[b];
        }
        let wanted = bounds[BUCKETS];
        self.work
            .entries_listed
            .set(self.work.entries_listed.get() + 2 * t.index.len() as u64);
        let charge = self.try_charge_transient(list_bytes(wanted))?;
        let mut prefixes = Vec::new();
        prefixes
            .try_reserve_exact(wanted)
            .map_err(|_| EngineError::OutOfMemory)?;
        prefixes.resize(wanted, 0);
        // Pass two: place each prefix in its bucket.
        let mut fill = bounds.clone();
        for e in t.index.iter().filter(|e| wanted_prefix(e.prefix())) {
            let b = bucket(e.prefix());
            prefixes[fill[b]] = e.prefix();
            fill[b] += 1;
        }
        debug_assert_eq!(fill[..BUCKETS], bounds[1..]);
        Ok(SortedHashes {
            table,
            start_hash,
            generation: t.generation,
            range,
            prefixer,
            from,
            prefixes,
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
    /// Returns how many there were. One index probe (plus a hash of each
    /// key that shares the index prefix). The objects borrow from the
    /// engine, so a caller may keep them for a reply.
    pub fn objects_with_hash<'e>(
        &'e self,
        table: TableId,
        start_hash: u64,
        hash: u64,
        f: impl FnMut(ObjectRef<'e>),
    ) -> Result<usize, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        if !t.range.contains(hash) {
            return Ok(0);
        }
        Ok(self.group_of(t, hash, |h| h == hash, f))
    }

    /// Call `f` for every live object of the hash group that holds `from`
    /// (the keys of its index prefix) whose hash is >= `from`, in (hash,
    /// key) order: one step of a hash-order walk, whose cursors
    /// (`SortedHashes::next_from`) are such `from`s. Returns how many there
    /// were. One index probe.
    pub fn objects_in_hash_group<'e>(
        &'e self,
        table: TableId,
        start_hash: u64,
        from: u64,
        f: impl FnMut(ObjectRef<'e>),
    ) -> Result<usize, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        let from = from.max(t.range.start);
        if from > t.range.end {
            return Ok(0);
        }
        Ok(self.group_of(t, from, |h| h >= from, f))
    }

    /// The objects sharing `hash`'s index prefix whose own hash passes
    /// `keep`, in (hash, key) order.
    fn group_of<'e>(
        &'e self,
        t: &'e Tablet,
        hash: u64,
        keep: impl Fn(u64) -> bool,
        mut f: impl FnMut(ObjectRef<'e>),
    ) -> usize {
        self.work.index_probes.set(self.work.index_probes.get() + 1);
        let prefix = t.prefixer.prefix(hash);
        let now = std::cell::OnceCell::new(); // the clock, read only if a deadline is met
        let mut found = t
            .index
            .iter_hash(probe_hash(prefix))
            .filter(|e| e.prefix() == prefix)
            .map(|e| t.object(e.loc()))
            .filter(|o| o.expires_at_ms == 0 || !o.is_expired(*now.get_or_init(|| self.now_ms())))
            .map(|o| (crate::key_hash(t.table, o.key), o))
            .filter(|(h, _)| keep(*h));
        let Some(first) = found.next() else {
            return 0;
        };
        let Some(second) = found.next() else {
            f(first.1);
            return 1;
        };
        // Several (bounded by the keys of one prefix): sort by hash, then key.
        let mut all = vec![first, second];
        all.extend(found);
        all.sort_unstable_by(|a, b| (a.0, a.1.key).cmp(&(b.0, b.1.key)));
        let n = all.len();
        all.into_iter().for_each(|(_, o)| f(o));
        n
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
            let n =
                self.objects_in_hash_group(table, start, h, |o| group += extracted_bytes(&o))?;
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
            self.objects_in_hash_group(table, start, h, |o| {
                let copied = copy(o.key).zip(copy(o.value));
                match copied {
                    // Within the reserved count unless the tablet changed
                    // between the passes (it cannot: `&self` holds it).
                    Some((k, v)) if objects.len() < objects.capacity() => {
                        objects.push((k, v, o.version, o.expires_at_ms))
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
    fn buckets_are_monotone_and_in_bounds() {
        let mut last = 0;
        for p in (0..1u32 << PREFIX_BITS)
            .step_by(997)
            .chain([(1 << PREFIX_BITS) - 1])
        {
            let b = bucket(p);
            assert!(b < BUCKETS && b >= last, "prefix {p:#x}");
            last = b;
        }
        assert_eq!((bucket(0), last), (0, BUCKETS - 1));
    }

    #[test]
    fn sort_distinct_keeps_each_hash_once() {
        let mut v = vec![5, 1, 5, 3, 1, 1, 9];
        let n = sort_distinct(&mut v);
        assert_eq!(&v[..n], &[1, 3, 5, 9]);
        assert_eq!(sort_distinct(&mut []), 0);
    }
}
