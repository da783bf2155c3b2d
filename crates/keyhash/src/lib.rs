//! The key hash that places every object: tablets are ranges of it.
//!
//! Client and server must compute the same value for the same key, so this
//! crate is the single definition both sides link. XXH3 is a fixed,
//! published algorithm (stable across versions and platforms) and hashes a
//! 30-byte key in a few nanoseconds.

/// 64-bit hash of `key` within table `table_id`.
///
/// Seeded by the table id so two tables' tablets split keys independently.
#[inline]
pub fn key_hash(table_id: u64, key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, table_id)
}

/// An inclusive range of key hashes: `start..=end`.
///
/// Inclusive so that one range can cover the whole `u64` space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HashRange {
    pub start: u64,
    pub end: u64,
}

impl HashRange {
    /// Every hash.
    pub const FULL: HashRange = HashRange {
        start: 0,
        end: u64::MAX,
    };

    pub fn new(start: u64, end: u64) -> Option<HashRange> {
        (start <= end).then_some(HashRange { start, end })
    }

    #[inline]
    pub fn contains(&self, hash: u64) -> bool {
        self.start <= hash && hash <= self.end
    }

    /// Split the full hash space into `n` contiguous ranges of (almost) equal width.
    pub fn split_even(n: u64) -> Vec<HashRange> {
        assert!(n >= 1, "at least one range");
        let width = u64::MAX / n;
        (0..n)
            .map(|i| {
                let start = i * width;
                let end = if i == n - 1 {
                    u64::MAX
                } else {
                    (i + 1) * width - 1
                };
                HashRange { start, end }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_even_covers_everything_without_gaps() {
        for n in [1u64, 2, 3, 7, 16, 1000] {
            let r = HashRange::split_even(n);
            assert_eq!(r.len() as u64, n);
            assert_eq!(r[0].start, 0);
            assert_eq!(r.last().unwrap().end, u64::MAX);
            for w in r.windows(2) {
                assert_eq!(w[0].end + 1, w[1].start);
            }
        }
    }

    #[test]
    fn hash_depends_on_table() {
        assert_ne!(key_hash(1, b"k"), key_hash(2, b"k"));
        assert_eq!(key_hash(7, b"abc"), key_hash(7, b"abc"));
    }
}
