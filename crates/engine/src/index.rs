//! The per-tablet hash index: key hash -> log reference.
//!
//! A `hashbrown::HashTable` of 8-byte slots: 28 bits of the key's hash and
//! a 36-bit log reference, packed (`IndexEntry`). Why 8 bytes: the index was
//! 16-byte slots (the full 64-bit hash beside a 64-bit reference), which at
//! 1M objects (2^21 buckets, hashbrown's power-of-two tables) cost 35.7 B per
//! object, more than the object's entry header; packed, it is 18.9 B.
//!
//! Which 28 bits: the top ones of the hash's offset *within the tablet's
//! range*, scaled to the range's width (`Prefixer`). They are monotone in
//! the hash, so a hash-order walk can list and order a tablet from the index
//! alone (`hashscan.rs`: a walk step takes every key of one prefix), and
//! hashbrown's probe hash is computed from them alone (`probe_hash`), so
//! growth rehashes without reading the log. The price is a key comparison
//! in the log when another key shares the prefix: a range spreads over at
//! least 2^27 prefixes, so at 1M objects in a tablet at most 1 lookup in
//! 130 pays it, at 16M 1 in 8.
//!
//! The log reference: segment slot in the tablet's slab (14 bits: a tablet
//! holds at most 16,384 segments, 32 GiB of 2 MiB segments) and byte offset
//! in the segment (22 bits: segments are at most 4 MiB).

use crate::HashRange;

/// Bits of the key hash an index slot keeps.
pub(crate) const PREFIX_BITS: u32 = 28;
const SLOT_BITS: u32 = 14;
const OFFSET_BITS: u32 = 22;
const _: () = assert!(PREFIX_BITS + SLOT_BITS + OFFSET_BITS == 64);

/// Largest segment an index slot can point into.
pub(crate) const MAX_SEGMENT_BYTES: usize = 1 << OFFSET_BITS;
/// Most segments one tablet may hold at once (slots of its slab).
pub(crate) const MAX_TABLET_SEGMENTS: usize = 1 << SLOT_BITS;

/// One index slot: a key's hash prefix and where its live entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexEntry(u64);

impl IndexEntry {
    #[inline(always)]
    pub fn new(prefix: u32, loc: u64) -> IndexEntry {
        let (slot, offset) = (slot_of(loc) as u64, offset_of(loc) as u64);
        debug_assert!(u64::from(prefix) < 1 << PREFIX_BITS);
        debug_assert!(slot < 1 << SLOT_BITS && offset < 1 << OFFSET_BITS);
        IndexEntry(u64::from(prefix) << (SLOT_BITS + OFFSET_BITS) | slot << OFFSET_BITS | offset)
    }

    /// The key hash's prefix within its tablet (`Prefixer::prefix`).
    #[inline(always)]
    pub fn prefix(self) -> u32 {
        (self.0 >> (SLOT_BITS + OFFSET_BITS)) as u32
    }

    /// The log reference (`loc`).
    #[inline(always)]
    pub fn loc(self) -> u64 {
        let slot = (self.0 >> OFFSET_BITS) & ((1 << SLOT_BITS) - 1);
        let offset = self.0 & ((1 << OFFSET_BITS) - 1);
        loc(slot as u32, offset as u32)
    }

    #[inline(always)]
    pub fn set_loc(&mut self, loc: u64) {
        *self = IndexEntry::new(self.prefix(), loc);
    }
}

/// Maps a tablet's key hashes to their index prefixes, and back.
///
/// A prefix is the top `PREFIX_BITS` of the hash's offset from the range's
/// start, scaled by `shift` so the range's width fills at least half of the
/// prefix space (the top bit of the width lands on the prefix's top or next
/// bit). Why relative to the start and not the hash's own top bits: a narrow
/// range that straddles a high bit boundary (say 0x7fff..ff00 to
/// 0x8000..00ff) would share no top bits, and all its keys would get one or
/// two prefixes. Fixed when the tablet is made: a tablet split later keeps
/// it (offsets in a part of the range stay monotone), so no slot is ever
/// recomputed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prefixer {
    start: u64,
    /// Leading zero bits of the range's width (at most 64 - PREFIX_BITS).
    shift: u32,
}

impl Prefixer {
    pub fn new(range: HashRange) -> Prefixer {
        let shift = (range.end - range.start)
            .leading_zeros()
            .min(64 - PREFIX_BITS);
        Prefixer {
            start: range.start,
            shift,
        }
    }

    /// The prefix of a hash at or above the range's start: monotone in it.
    #[inline(always)]
    pub fn prefix(self, hash: u64) -> u32 {
        debug_assert!(hash >= self.start);
        ((hash.wrapping_sub(self.start) << self.shift) >> (64 - PREFIX_BITS)) as u32
    }

    /// The lowest hash with prefix `prefix`.
    #[inline]
    pub fn lowest(self, prefix: u32) -> u64 {
        self.start + (u64::from(prefix) << (64 - PREFIX_BITS) >> self.shift)
    }
}

/// The hash hashbrown probes with, from the prefix alone (so growth needs no
/// log access). hashbrown takes its 7-bit tag from the top bits and the
/// bucket from the low ones; a multiplication by an odd constant spreads the
/// prefix over the top bits and keeps its low bits (already uniform: they
/// come from the middle of the key hash) at the bottom.
#[inline(always)]
pub(crate) fn probe_hash(prefix: u32) -> u64 {
    {
        let x = u64::from(prefix).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^ (x >> 32)
    }
}

/// For hashbrown's rehash on growth: no log access needed.
#[inline(always)]
pub(crate) fn rehash(e: &IndexEntry) -> u64 {
    probe_hash(e.prefix())
}

/// A log reference: segment slot in the tablet's slab (high 32 bits) and
/// byte offset inside that segment (low 32 bits).
#[inline(always)]
pub(crate) fn loc(slot: u32, offset: u32) -> u64 {
    (u64::from(slot) << 32) | u64::from(offset)
}

#[inline(always)]
pub(crate) fn slot_of(loc: u64) -> usize {
    (loc >> 32) as usize
}

#[inline(always)]
pub(crate) fn offset_of(loc: u64) -> usize {
    loc as u32 as usize
}

// ---- memory of the index, for the budget ------------------------------------

/// hashbrown's control-byte group width, upper bound over platforms (16
/// with SSE2, 8 otherwise): a table holds this many trailing control bytes.
const GROUP_BYTES: usize = 16;

/// Bytes hashbrown allocates for a table of `buckets` index entries: the
/// entries (8 bytes each; `buckets` >= 4, so their size is a multiple of the
/// 16-byte control alignment only from 2 buckets on: rounded up below), one
/// control byte per bucket, and one trailing group
/// (`TableLayout::calculate_layout_for` in hashbrown 0.17).
pub(crate) fn table_bytes(buckets: usize) -> usize {
    table_bytes_of(buckets, std::mem::size_of::<IndexEntry>())
}

/// `table_bytes` for items of `item_bytes` (at most 16-byte aligned): also
/// what a tablet's map of side records (`records.rs`) allocates.
pub(crate) fn table_bytes_of(buckets: usize, item_bytes: usize) -> usize {
    if buckets == 0 {
        return 0;
    }
    (buckets * item_bytes).next_multiple_of(GROUP_BYTES) + buckets + GROUP_BYTES
}

/// Buckets hashbrown chooses for a capacity (`capacity_to_buckets`): at
/// least 4, then 8, 16, and above 14 items a power of two at <= 7/8 load.
fn buckets_for_capacity(capacity: usize) -> usize {
    match capacity {
        0..4 => 4,
        4..8 => 8,
        8..15 => 16,
        _ => (capacity.saturating_mul(8) / 7).next_power_of_two(),
    }
}

/// Bytes of a table that has grown to hold `objects` items.
pub(crate) fn bytes_for_objects(objects: usize) -> usize {
    table_bytes(buckets_for_capacity(objects))
}

/// Items a table of `buckets` holds before it must grow (`bucket_mask_to_capacity`).
fn full_capacity(buckets: usize) -> usize {
    if buckets <= 8 {
        buckets.saturating_sub(1)
    } else {
        buckets / 8 * 7
    }
}

/// Bytes `index.try_reserve(additional)` would newly allocate: 0 if the
/// items fit (or fit after an in-place rehash that drops deleted slots),
/// else the whole new table, which exists beside the old one while the
/// entries are moved. An upper bound; the budget then charges the table's
/// actual `allocation_size`.
pub(crate) fn growth_bytes(index: &hashbrown::HashTable<IndexEntry>, additional: usize) -> usize {
    growth_bytes_of(
        (index.len(), index.capacity(), index.allocation_size()),
        std::mem::size_of::<IndexEntry>(),
        additional,
    )
}

/// `growth_bytes` of any hashbrown table given as (len, capacity,
/// allocation_size), of items of `item_bytes`.
pub(crate) fn growth_bytes_of(
    (len, capacity, allocated): (usize, usize, usize),
    item_bytes: usize,
    additional: usize,
) -> usize {
    if additional <= capacity - len {
        return 0;
    }
    // table_bytes(b) <= allocated < table_bytes(2b) for any group width.
    let buckets = if allocated == 0 {
        0
    } else {
        let per = item_bytes + 1;
        1usize << (usize::BITS - 1 - (allocated / per).leading_zeros())
    };
    let new_items = len.saturating_add(additional);
    let full = full_capacity(buckets);
    if buckets > 0 && new_items <= full / 2 {
        return 0;
    }
    table_bytes_of(buckets_for_capacity(new_items.max(full + 1)), item_bytes)
}

/// Checks a `growth_bytes` prediction made before reservation `i` against
/// the allocation before and after it: never under, exact on x86_64 (where
/// hashbrown's group width is known), 0 when nothing was allocated. For the
/// tests of every map whose growth is charged (the index, the records map).
#[cfg(test)]
pub(crate) fn assert_growth_predicted(i: u64, before: usize, predicted: usize, after: usize) {
    if after != before {
        assert!(
            predicted >= after,
            "at {i}: predicted {predicted} < {after}"
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(predicted, after, "at {i}");
    } else {
        assert_eq!(predicted, 0, "at {i}: no growth expected");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hashbrown::HashTable;

    #[test]
    fn slots_pack_and_unpack_at_the_limits() {
        for (p, slot, off) in [
            (0u32, 0u32, 0u32),
            (
                (1 << PREFIX_BITS) - 1,
                (1 << SLOT_BITS) - 1,
                (1 << OFFSET_BITS) - 1,
            ),
            (12345, 77, 2 * 1024 * 1024 - 1),
        ] {
            let mut e = IndexEntry::new(p, loc(slot, off));
            assert_eq!((e.prefix(), e.loc()), (p, loc(slot, off)));
            e.set_loc(loc(1, 2));
            assert_eq!((e.prefix(), e.loc()), (p, loc(1, 2)));
        }
        assert_eq!(std::mem::size_of::<IndexEntry>(), 8);
    }

    #[test]
    fn prefixes_are_monotone_and_invertible_in_any_range() {
        let ranges = [
            HashRange::FULL,
            HashRange::new(0, 0).unwrap(),
            HashRange::new(5, 5 + 1000).unwrap(),
            HashRange::new(u64::MAX / 3, u64::MAX / 3 * 2).unwrap(),
            HashRange::new(0x1234_5600_0000_0000, 0x1234_56ff_ffff_ffff).unwrap(),
            HashRange::new(u64::MAX - 10, u64::MAX).unwrap(),
            HashRange::new(0x7fff_ffff_ffff_ff00, 0x8000_0000_0000_00ff).unwrap(),
            HashRange::new(0x7fff_ff00_0000_0000, 0x8000_00ff_ffff_ffff).unwrap(),
        ];
        for r in ranges {
            let px = Prefixer::new(r);
            let width = r.end - r.start;
            let mut last = 0;
            for i in 0..=10_000u64 {
                let h = r.start + (u128::from(width) * u128::from(i) / 10_000) as u64;
                let p = px.prefix(h);
                assert!(u64::from(p) < 1 << PREFIX_BITS);
                assert!(p >= last, "not monotone in {r:?} at {h:#x}");
                last = p;
                let lo = px.lowest(p);
                assert!(lo <= h, "lowest {lo:#x} above {h:#x} in {r:?}");
                assert_eq!(px.prefix(lo), p);
            }
        }
        // A range 2^40 wide uses the 28 bits below its width's top bit.
        let px =
            Prefixer::new(HashRange::new(0x1234_5600_0000_0000, 0x1234_56ff_ffff_ffff).unwrap());
        assert_eq!(px.prefix(0x1234_56ab_cdef_0000), 0xabc_def0);
        // A narrow range across a high bit boundary still spreads its keys
        // over at least half of the prefixes.
        let r = HashRange::new(0x7fff_ff00_0000_0000, 0x8000_00ff_ffff_ffff).unwrap();
        let px = Prefixer::new(r);
        assert_eq!(px.prefix(r.start), 0);
        assert!(px.prefix(r.end) >= 1 << (PREFIX_BITS - 1));
        // A range narrower than 2^28 keeps each hash's exact offset.
        let r = HashRange::new(0x7fff_ffff_ffff_ff00, 0x8000_0000_0000_00ff).unwrap();
        let px = Prefixer::new(r);
        assert_eq!((px.prefix(r.start), px.prefix(r.end)), (0, 0x1ff));
    }

    #[test]
    fn predicted_growth_matches_what_hashbrown_allocates() {
        let mut t: HashTable<IndexEntry> = HashTable::new();
        assert_eq!(t.allocation_size(), 0);
        for i in 0..100_000u64 {
            let before = t.allocation_size();
            let predicted = growth_bytes(&t, 1);
            t.try_reserve(1, rehash).expect("reserve");
            assert_growth_predicted(i, before, predicted, t.allocation_size());
            let p = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 36) as u32;
            let e = IndexEntry::new(p, loc(i as u32 % 1000, i as u32));
            t.insert_unique(probe_hash(p), e, rehash);
        }
        // A reservation of many at once, as replay and split make.
        for n in [1usize, 3, 7, 14, 15, 100, 1000, 12345] {
            let mut t: HashTable<IndexEntry> = HashTable::new();
            let predicted = growth_bytes(&t, n);
            t.try_reserve(n, rehash).expect("reserve");
            assert!(predicted >= t.allocation_size(), "reserving {n}");
            #[cfg(target_arch = "x86_64")]
            assert_eq!(predicted, t.allocation_size(), "reserving {n}");
        }
    }
}
