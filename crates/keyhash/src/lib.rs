//! The key hash that places every object: tablets are ranges of it.
//!
//! Client and server must compute the same value for the same key, so this
//! crate is the single definition both sides link. XXH3 is a fixed,
//! published algorithm (stable across versions and platforms) and hashes a
//! 30-byte key in a few nanoseconds.

/// 64-bit hash of `key` within table `table_id`.
///
/// Seeded by the table id so two tables' tablets split keys independently.
/// In a table placed by Redis hash slot (`SLOT_PLACED`) the top 14 bits are
/// the key's slot (`key_slot`), so a tablet whose range starts and ends on
/// slot boundaries holds whole slots, and the layout can be described to a
/// Redis Cluster client; the other 50 bits come from the same XXH3.
#[inline]
pub fn key_hash(table_id: u64, key: &[u8]) -> u64 {
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(key, table_id);
    if table_id & SLOT_PLACED == 0 {
        h
    } else {
        (u64::from(key_slot(key)) << SLOT_SHIFT) | (h >> SLOTS_BITS)
    }
}

/// Set in the id of a table whose keys are placed by Redis hash slot
/// (`key_hash`). Why a bit of the id rather than a property looked up:
/// every place that hashes a key (clients, shards, replay, migration)
/// already has the table id, so client and server agree with nothing more
/// to carry or cache. Bit 62, so ids stay positive as i64.
pub const SLOT_PLACED: u64 = 1 << 62;

/// Slots of a Redis cluster.
pub const SLOTS: u16 = 16384;
/// Bits of a slot number.
const SLOTS_BITS: u32 = 14;
/// Where a slot sits in a slot-placed table's key hash.
pub const SLOT_SHIFT: u32 = 64 - SLOTS_BITS;

/// Whether `table_id` places keys by hash slot.
#[inline]
pub fn slot_placed(table_id: u64) -> bool {
    table_id & SLOT_PLACED != 0
}

/// The slot a key hash of a slot-placed table belongs to.
#[inline]
pub fn slot_of_hash(hash: u64) -> u16 {
    (hash >> SLOT_SHIFT) as u16
}

/// Redis's slot of `key`: CRC16-XMODEM (polynomial 0x1021, initial 0) of
/// the key, or of the text between its first `{` and the next `}` when
/// that is not empty, mod 16,384.
#[inline]
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = memchr_byte(b'{', key).and_then(|open| {
        let rest = &key[open + 1..];
        let close = memchr_byte(b'}', rest)?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

#[inline]
fn memchr_byte(b: u8, bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&x| x == b)
}

/// CRC16-XMODEM by table, one lookup per byte: `key_hash` of a slot-placed
/// table runs it on every key (bit by bit it was ~8 ns a byte).
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

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

    /// Split the full hash space of a slot-placed table into `n` (1 to
    /// `SLOTS`) contiguous ranges of whole slots, as equal as they can be.
    pub fn split_slots(n: u16) -> Vec<HashRange> {
        assert!((1..=SLOTS).contains(&n), "1 to {SLOTS} ranges of slots");
        let first = |i: u32| (i * u32::from(SLOTS) / u32::from(n)) as u64;
        (0..u32::from(n))
            .map(|i| {
                let start = first(i) << SLOT_SHIFT;
                let end = if i + 1 == u32::from(n) {
                    u64::MAX
                } else {
                    (first(i + 1) << SLOT_SHIFT) - 1
                };
                HashRange { start, end }
            })
            .collect()
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
    fn slots_are_redis_s() {
        // Each slot as `CLUSTER KEYSLOT` of Redis 7.0.15 answered.
        for (key, slot) in [
            ("foo", 12182),
            ("{user1}.a", 8106),
            ("123456789", 12739),
            ("", 0),
            ("{}", 15257),
            ("foo{}{bar}", 8363),
            ("foo{{bar}}zap", 4015),
            ("foo{bar}{zap}", 5061),
            ("key:000000000042", 7803),
            ("{a", 10276),
        ] {
            assert_eq!(key_slot(key.as_bytes()), slot, "{key:?}");
        }
        assert_eq!(key_slot(b"{user1}.a"), key_slot(b"{user1}.b"));
    }

    #[test]
    fn a_slot_placed_table_puts_the_slot_on_top() {
        let table = 7 | SLOT_PLACED;
        assert!(slot_placed(table) && !slot_placed(7));
        for key in [&b"foo"[..], b"{user1}.a", b"", b"key:000000000042"] {
            let h = key_hash(table, key);
            assert_eq!(slot_of_hash(h), key_slot(key), "{key:?}");
            // The low 50 bits are XXH3's top ones (seeded by the id as is).
            let xxh = xxhash_rust::xxh3::xxh3_64_with_seed(key, table);
            assert_eq!(xxh >> SLOTS_BITS, h & ((1 << SLOT_SHIFT) - 1));
        }
        // Keys sharing a tag share a slot, not a hash.
        let (a, b) = (key_hash(table, b"{t}.a"), key_hash(table, b"{t}.b"));
        assert_eq!(slot_of_hash(a), slot_of_hash(b));
        assert_ne!(a, b);
    }

    #[test]
    fn split_slots_covers_everything_on_slot_boundaries() {
        for n in [1u16, 2, 3, 7, 16, 1000, SLOTS] {
            let r = HashRange::split_slots(n);
            assert_eq!(r.len(), usize::from(n));
            assert_eq!(r[0].start, 0);
            assert_eq!(r.last().unwrap().end, u64::MAX);
            for w in r.windows(2) {
                assert_eq!(w[0].end + 1, w[1].start);
                assert_eq!(
                    w[1].start & ((1 << SLOT_SHIFT) - 1),
                    0,
                    "on a slot boundary"
                );
                assert!(w[0].start < w[1].start, "no empty range");
            }
        }
        let r = HashRange::split_slots(3);
        let slots: Vec<(u16, u16)> = r
            .iter()
            .map(|r| (slot_of_hash(r.start), slot_of_hash(r.end)))
            .collect();
        assert_eq!(slots, [(0, 5460), (5461, 10921), (10922, 16383)]);
    }

    #[test]
    fn hash_depends_on_table() {
        assert_ne!(key_hash(1, b"k"), key_hash(2, b"k"));
        assert_eq!(key_hash(7, b"abc"), key_hash(7, b"abc"));
    }
}
