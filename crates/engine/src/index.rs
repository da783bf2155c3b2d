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
