//! The per-tablet hash index: key hash -> log reference.
//!
//! A `hashbrown::HashTable` of 16-byte entries. Keeping the full 64-bit key
//! hash beside the reference makes growth cheap (no log access to rehash)
//! and rejects almost every non-matching probe without touching the log; the
//! key itself is compared in the log only when the hashes are equal.

/// One index slot: the key's hash and where its live entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    pub hash: u64,
    pub loc: u64,
}

/// The hash hashbrown probes with. A tablet is a range of key hashes, so its
/// keys share their top bits; hashbrown takes its 7-bit tag from the top bits
/// and the bucket from the low ones. Rotating moves well-mixed low bits to
/// the top (tag) and keeps the shared bits far from the bucket bits.
#[inline(always)]
pub(crate) fn probe_hash(key_hash: u64) -> u64 {
    key_hash.rotate_right(16)
}

/// For hashbrown's rehash on growth: no log access needed.
#[inline(always)]
pub(crate) fn rehash(e: &IndexEntry) -> u64 {
    probe_hash(e.hash)
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
/// entries (16 bytes each, already a multiple of the 16-byte control
/// alignment), one control byte per bucket, and one trailing group
/// (`TableLayout::calculate_layout_for` in hashbrown 0.17).
pub(crate) fn table_bytes(buckets: usize) -> usize {
    if buckets == 0 {
        return 0;
    }
    buckets * std::mem::size_of::<IndexEntry>() + buckets + GROUP_BYTES
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
    let len = index.len();
    if additional <= index.capacity() - len {
        return 0;
    }
    let allocated = index.allocation_size();
    // table_bytes(b) <= allocated < table_bytes(2b) for any group width.
    let buckets = if allocated == 0 {
        0
    } else {
        let per = std::mem::size_of::<IndexEntry>() + 1;
        1usize << (usize::BITS - 1 - (allocated / per).leading_zeros())
    };
    let new_items = len.saturating_add(additional);
    let full = full_capacity(buckets);
    if buckets > 0 && new_items <= full / 2 {
        return 0;
    }
    table_bytes(buckets_for_capacity(new_items.max(full + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hashbrown::HashTable;

    #[test]
    fn predicted_growth_matches_what_hashbrown_allocates() {
        let mut t: HashTable<IndexEntry> = HashTable::new();
        assert_eq!(t.allocation_size(), 0);
        for i in 0..100_000u64 {
            let before = t.allocation_size();
            let predicted = growth_bytes(&t, 1);
            t.try_reserve(1, rehash).expect("reserve");
            let after = t.allocation_size();
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
            let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            t.insert_unique(probe_hash(h), IndexEntry { hash: h, loc: i }, rehash);
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
