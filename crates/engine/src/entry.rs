//! The byte format of one log entry, and the only code that reads or writes it.
//!
//! Entries are self-describing and checksummed so that one segment's bytes can
//! be validated and replayed alone (from a backup's disk) without any other
//! state. Layout (all integers little-endian, no padding between entries):
//!
//! ```text
//! offset size field
//!      0    4 crc32c     over bytes 4..32 of the header with byte 5 taken as 0,
//!                        then the key, then the value
//!      4    1 kind       1 object, 2 tombstone, 3 version mark
//!      5    1 dead       in-memory only: 1 once superseded; not in the CRC,
//!                        ignored on replay
//!      6    2 reserved   0
//!      8    4 key_len
//!     12    4 value_len
//!     16    8 table      table id
//!     24    8 version
//!     32    . key        key_len bytes
//!      .    . value      value_len bytes
//! ```
//!
//! A tombstone's value is 8 bytes: the newest segment id of its tablet when
//! it was written (see `cleaner.rs` for why that, not the segment it landed in).
//! A version mark has no key and no value; its version is the tablet's next
//! version when it was written, so replay can restore the version counter even
//! after the cleaner dropped the tombstones that carried the highest versions.

use crate::ObjectRef;

pub(crate) const HEADER_BYTES: usize = 32;

pub(crate) const KIND_OBJECT: u8 = 1;
pub(crate) const KIND_TOMBSTONE: u8 = 2;
pub(crate) const KIND_MARK: u8 = 3;

/// Value length of a tombstone: the segment id it records.
pub(crate) const TOMBSTONE_VALUE_BYTES: usize = 8;

pub(crate) const OFF_KIND: usize = 4;
pub(crate) const OFF_DEAD: usize = 5;
const OFF_RESERVED: usize = 6;
const OFF_KEY_LEN: usize = 8;
const OFF_VALUE_LEN: usize = 12;
const OFF_TABLE: usize = 16;
const OFF_VERSION: usize = 24;

/// Total bytes of an entry with these lengths.
#[inline]
pub(crate) const fn entry_bytes(key_len: usize, value_len: usize) -> usize {
    HEADER_BYTES + key_len + value_len
}

#[inline(always)]
pub(crate) fn read_u32(buf: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(a)
}

#[inline(always)]
pub(crate) fn read_u64(buf: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(a)
}

/// CRC of an entry: header bytes 4..32 with the dead flag zeroed, key, value.
fn checksum(header: &[u8], key: &[u8], value: &[u8]) -> u32 {
    debug_assert_eq!(header.len(), HEADER_BYTES);
    let mut covered = [0u8; HEADER_BYTES - 4];
    covered.copy_from_slice(&header[4..HEADER_BYTES]);
    covered[OFF_DEAD - 4] = 0; // the flag changes in memory after the write
    let crc = crc32c::crc32c(&covered);
    crc32c::crc32c_append(crc32c::crc32c_append(crc, key), value)
}

/// Append a complete entry to `buf`. The caller has checked that it fits
/// (the segment's capacity never grows).
pub(crate) fn append(
    buf: &mut Vec<u8>,
    kind: u8,
    table: u64,
    version: u64,
    key: &[u8],
    value: &[u8],
) {
    let mut header = [0u8; HEADER_BYTES];
    header[OFF_KIND] = kind;
    header[OFF_KEY_LEN..OFF_KEY_LEN + 4].copy_from_slice(&(key.len() as u32).to_le_bytes());
    header[OFF_VALUE_LEN..OFF_VALUE_LEN + 4].copy_from_slice(&(value.len() as u32).to_le_bytes());
    header[OFF_TABLE..OFF_TABLE + 8].copy_from_slice(&table.to_le_bytes());
    header[OFF_VERSION..OFF_VERSION + 8].copy_from_slice(&version.to_le_bytes());
    let crc = checksum(&header, key, value);
    header[0..4].copy_from_slice(&crc.to_le_bytes());
    debug_assert!(buf.len() + entry_bytes(key.len(), value.len()) <= buf.capacity());
    buf.extend_from_slice(&header);
    buf.extend_from_slice(key);
    buf.extend_from_slice(value);
}

// ---- reading our own segments (trusted: written by `append`) -------------

#[inline(always)]
pub(crate) fn kind(buf: &[u8], at: usize) -> u8 {
    buf[at + OFF_KIND]
}

#[inline(always)]
pub(crate) fn is_dead(buf: &[u8], at: usize) -> bool {
    buf[at + OFF_DEAD] != 0
}

#[inline(always)]
pub(crate) fn set_dead(buf: &mut [u8], at: usize) {
    debug_assert_eq!(buf[at + OFF_DEAD], 0, "entry superseded twice");
    buf[at + OFF_DEAD] = 1;
}

#[inline(always)]
pub(crate) fn key_len(buf: &[u8], at: usize) -> usize {
    read_u32(buf, at + OFF_KEY_LEN) as usize
}

#[inline(always)]
pub(crate) fn value_len(buf: &[u8], at: usize) -> usize {
    read_u32(buf, at + OFF_VALUE_LEN) as usize
}

#[inline(always)]
pub(crate) fn version(buf: &[u8], at: usize) -> u64 {
    read_u64(buf, at + OFF_VERSION)
}

/// Length of the whole entry at `at`.
#[inline(always)]
pub(crate) fn len_at(buf: &[u8], at: usize) -> usize {
    entry_bytes(key_len(buf, at), value_len(buf, at))
}

#[inline(always)]
pub(crate) fn key_at(buf: &[u8], at: usize) -> &[u8] {
    let k = key_len(buf, at);
    &buf[at + HEADER_BYTES..at + HEADER_BYTES + k]
}

/// The object entry at `at` as an `ObjectRef`.
#[inline(always)]
pub(crate) fn object_at(buf: &[u8], at: usize) -> ObjectRef<'_> {
    let k = key_len(buf, at);
    let v = value_len(buf, at);
    let key_start = at + HEADER_BYTES;
    let value_start = key_start + k;
    ObjectRef {
        key: &buf[key_start..value_start],
        value: &buf[value_start..value_start + v],
        version: version(buf, at),
    }
}

/// The segment id a tombstone records.
#[inline]
pub(crate) fn tombstone_segment(buf: &[u8], at: usize) -> u64 {
    debug_assert_eq!(kind(buf, at), KIND_TOMBSTONE);
    read_u64(buf, at + HEADER_BYTES + key_len(buf, at))
}

// ---- parsing untrusted bytes (replay) -------------------------------------

/// A validated entry from untrusted bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parsed<'a> {
    pub kind: u8,
    pub table: u64,
    pub version: u64,
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// Offset of the next entry.
    pub next: usize,
}

/// Why an entry could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Bad {
    /// The rest of the buffer is zero: the unwritten tail of a segment.
    End,
    /// Corrupt, and its length cannot be trusted: stop reading this segment.
    Stop(String),
    /// Corrupt but its length is trusted (the CRC matched): skip to `next`.
    Skip { reason: String, next: usize },
}

/// Parse and verify the entry at `at` of an untrusted buffer. Never panics:
/// every length is checked before it is used to slice.
pub(crate) fn parse(
    buf: &[u8],
    at: usize,
    table: u64,
    max_key_bytes: usize,
    max_value_bytes: usize,
) -> Result<Parsed<'_>, Bad> {
    let rest = buf.get(at..).unwrap_or(&[]);
    // Zero bytes are a segment's unwritten tail (a backup may store whole
    // segments). Checked only when the kind byte is 0, so a walk stays linear.
    let zero_tail = |rest: &[u8]| rest.iter().all(|&b| b == 0);
    if rest.len() < HEADER_BYTES {
        if zero_tail(rest) {
            return Err(Bad::End);
        }
        return Err(Bad::Stop(format!(
            "truncated header: {} bytes left",
            rest.len()
        )));
    }
    let kind = rest[OFF_KIND];
    if kind == 0 && zero_tail(rest) {
        return Err(Bad::End);
    }
    let key_len = read_u32(rest, OFF_KEY_LEN) as usize;
    let value_len = read_u32(rest, OFF_VALUE_LEN) as usize;
    let lengths_ok = match kind {
        KIND_OBJECT => (1..=max_key_bytes).contains(&key_len) && value_len <= max_value_bytes,
        KIND_TOMBSTONE => {
            (1..=max_key_bytes).contains(&key_len) && value_len == TOMBSTONE_VALUE_BYTES
        }
        KIND_MARK => key_len == 0 && value_len == 0,
        other => return Err(Bad::Stop(format!("unknown entry kind {other}"))),
    };
    if !lengths_ok {
        return Err(Bad::Stop(format!(
            "impossible lengths for kind {kind}: key {key_len}, value {value_len}"
        )));
    }
    let total = entry_bytes(key_len, value_len);
    if rest.len() < total {
        return Err(Bad::Stop(format!(
            "truncated entry: needs {total} bytes, {} left",
            rest.len()
        )));
    }
    let header = &rest[..HEADER_BYTES];
    let key = &rest[HEADER_BYTES..HEADER_BYTES + key_len];
    let value = &rest[HEADER_BYTES + key_len..total];
    let stored = read_u32(header, 0);
    let computed = checksum(header, key, value);
    if stored != computed {
        return Err(Bad::Stop(format!(
            "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
        )));
    }
    let next = at + total;
    if header[OFF_RESERVED] != 0 || header[OFF_RESERVED + 1] != 0 {
        return Err(Bad::Skip {
            reason: "reserved header bytes are not zero".into(),
            next,
        });
    }
    let entry_table = read_u64(header, OFF_TABLE);
    if entry_table != table {
        return Err(Bad::Skip {
            reason: format!("entry of table {entry_table}, replaying table {table}"),
            next,
        });
    }
    Ok(Parsed {
        kind,
        table: entry_table,
        version: read_u64(header, OFF_VERSION),
        key,
        value,
        next,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(kind: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut buf = Vec::with_capacity(entry_bytes(key.len(), value.len()));
        append(&mut buf, kind, 7, 42, key, value);
        buf
    }

    #[test]
    fn layout_is_as_documented() {
        let buf = one(KIND_OBJECT, b"key", b"value");
        assert_eq!(buf.len(), 32 + 3 + 5);
        assert_eq!(buf[4], KIND_OBJECT);
        assert_eq!(buf[5], 0);
        assert_eq!(&buf[6..8], &[0, 0]);
        assert_eq!(&buf[8..12], &3u32.to_le_bytes());
        assert_eq!(&buf[12..16], &5u32.to_le_bytes());
        assert_eq!(&buf[16..24], &7u64.to_le_bytes());
        assert_eq!(&buf[24..32], &42u64.to_le_bytes());
        assert_eq!(&buf[32..35], b"key");
        assert_eq!(&buf[35..40], b"value");
        let o = object_at(&buf, 0);
        assert_eq!(
            (o.key, o.value, o.version),
            (&b"key"[..], &b"value"[..], 42)
        );
    }

    #[test]
    fn parse_accepts_valid_and_ignores_dead_flag() {
        let mut buf = one(KIND_OBJECT, b"k", b"v");
        let p = parse(&buf, 0, 7, 64, 64).expect("valid entry");
        assert_eq!(
            (p.key, p.value, p.version, p.next),
            (&b"k"[..], &b"v"[..], 42, buf.len())
        );
        set_dead(&mut buf, 0);
        assert!(
            parse(&buf, 0, 7, 64, 64).is_ok(),
            "the dead flag is not covered by the CRC"
        );
    }

    #[test]
    fn parse_rejects_every_single_byte_flip_outside_the_flag() {
        let buf = one(KIND_TOMBSTONE, b"abc", &9u64.to_le_bytes());
        for i in 0..buf.len() {
            if i == OFF_DEAD {
                continue;
            }
            for bit in 0..8 {
                let mut bad = buf.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    parse(&bad, 0, 7, 64, 64).is_err(),
                    "flip of byte {i} bit {bit} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn parse_reports_end_truncation_and_wrong_table() {
        assert_eq!(parse(&[0u8; 100], 0, 7, 64, 64).unwrap_err(), Bad::End);
        let buf = one(KIND_OBJECT, b"k", b"value");
        assert!(matches!(parse(&buf[..20], 0, 7, 64, 64), Err(Bad::Stop(_))));
        assert!(matches!(
            parse(&buf[..buf.len() - 1], 0, 7, 64, 64),
            Err(Bad::Stop(_))
        ));
        assert!(
            matches!(parse(&buf, 0, 8, 64, 64), Err(Bad::Skip { next, .. }) if next == buf.len())
        );
        // Lengths beyond the configured limits are impossible, whatever the CRC says.
        assert!(matches!(parse(&buf, 0, 7, 64, 4), Err(Bad::Stop(_))));
    }
}
