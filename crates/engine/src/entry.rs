//! The byte format of one log entry, and the only code that reads or writes it.
//!
//! Entries are self-describing and checksummed so that one segment's bytes can
//! be validated and replayed alone (from a backup's disk) without any other
//! state. Layout (no padding between entries; a *varint* is unsigned LEB128:
//! 7 bits a byte, low group first, the high bit set on every byte but the
//! last, in its shortest form):
//!
//! ```text
//! offset size  field
//!      0    4  crc32c     seeded with the table id (8 bytes, little-endian),
//!                         then header bytes 4.. with the dead bit taken as 0,
//!                         then the key, then the value
//!      4    1  flags      bits 0-1 and 5: kind (0x01 object, 0x02 tombstone,
//!                         0x03 version mark, 0x21 side record, 0x22 side
//!                         record removed; bit 5 is set only in the last two)
//!                         bits 2-4: n - 1, the version's bytes
//!                         bit 7: dead (in memory only: set once superseded;
//!                         not in the CRC, ignored on replay); bit 6: the
//!                         object expires (objects only)
//!      5  1-8  version    little-endian, n bytes: the fewest that hold it
//!      .  0|8  expires    with bit 6 only: the deadline, Unix milliseconds
//!                         (u64 LE, >= 1); the object is absent from then on
//!      .  1-3  key_len    varint, <= MAX_KEY_BYTES (65,536)
//!      .  1-5  value_len  varint, < 2^32
//!      .    .  key        key_len bytes
//!      .    .  value      value_len bytes
//! ```
//!
//! An object with a 30-byte key and a 100-byte value at a version below 2^24
//! has a 10-byte header (4 + 1 + 3 + 1 + 1). Why the version's width is in
//! the flags rather than a varint: it is read with one load and a mask, no
//! loop, on every lookup and in the log walk. Why variable-width: the fixed
//! 32-byte header this replaced (4-byte lengths, an 8-byte table id and an
//! 8-byte version in every entry) was 16 % of such an object and half of
//! insitu's per-object overhead beyond key and value; most lengths fit one
//! byte and most versions three. Why the table id is only a CRC seed: a
//! segment belongs to one tablet, so the id was the same in every entry; it
//! was there to catch a segment replayed as the wrong table, which a seeded
//! checksum catches as well (the entry fails its check).
//!
//! Why the deadline is in the entry and not in a table beside the log: it
//! must survive a crash (replay reads it back from the backups' bytes), go
//! with the object through cleaning (a verbatim copy), splits and moves, and
//! vanish with it when a write supersedes it, which is exactly what the
//! entry's own bytes do. Why a flag bit and not a field in every entry: most
//! objects never expire and keep their exact bytes (bit 6 was reserved-zero
//! and covered by the CRC, so no entry written before could carry it).
//!
//! A tombstone's value is 8 bytes: the newest segment id of its tablet when
//! it was written (see `cleaner.rs` for why that, not the segment it landed in).
//! A version mark has no key and no value; its version is the tablet's next
//! version when it was written, so replay can restore the version counter even
//! after the cleaner dropped the tombstones that carried the highest versions.
//!
//! Side records (`records.rs`) are not objects: no read, walk or index sees
//! them. A record's key is its *anchor* (a key of the table; its hash decides
//! the tablet) and its value is `class: u8 | id: u64 LE | payload`. A record
//! removal's key is the anchor too and its value is `class | id LE | segment
//! id u64 LE` (17 bytes): the newest segment id of its tablet when it was
//! written, exactly like a tombstone's. Why bit 5 for them: the two new kinds
//! needed a third kind bit; bit 5 was reserved-zero and covered by the CRC,
//! so no entry written before could carry it, and the old kinds keep their
//! exact bytes.
//!
//! Parsing untrusted bytes (replay's `parse`, with its checked varint) is in
//! `entry_parse.rs`, the one path from a backup's bytes into this format.

use crate::{ObjectRef, RecordId};

/// Most bytes a header takes: crc, flags, the version at its widest (8)
/// and the two length varints at theirs (key_len 3, value_len 5). Room checks use this bound
/// (a header is rarely more than 12 bytes; the difference is at most a few
/// bytes left unused at the end of a segment).
pub(crate) const MAX_HEADER_BYTES: usize = 4 + 1 + 8 + EXPIRES_BYTES + 3 + 5;

/// Bytes of an expiring object's deadline.
const EXPIRES_BYTES: usize = 8;

pub(crate) const KIND_OBJECT: u8 = 1;
pub(crate) const KIND_TOMBSTONE: u8 = 2;
pub(crate) const KIND_MARK: u8 = 3;
/// A live-or-superseded side record (`records.rs`): key = anchor, value =
/// class | id LE | payload.
pub(crate) const KIND_RECORD: u8 = 0x21;
/// A side record's removal: key = anchor, value = class | id LE | segment id LE.
pub(crate) const KIND_RECORD_REMOVED: u8 = 0x22;

/// Value length of a tombstone: the segment id it records.
pub(crate) const TOMBSTONE_VALUE_BYTES: usize = 8;
/// Bytes of a record's value before its payload: class (1) and id (8, LE).
pub(crate) const RECORD_ID_BYTES: usize = 9;
/// Value length of a record removal: class, id, and the segment id it records.
pub(crate) const RECORD_REMOVED_VALUE_BYTES: usize = RECORD_ID_BYTES + 8;

const OFF_FLAGS: usize = 4;
/// The version's first byte.
const OFF_VERSION: usize = 5;
/// Bits 0-1 and 5: the kind. Bit 5 is set only by the side-record kinds.
const KIND_BITS: u8 = 0x23;
/// The version's byte count minus one.
const VERSION_WIDTH_SHIFT: u32 = 2;
const VERSION_WIDTH_BITS: u8 = 0x07 << VERSION_WIDTH_SHIFT;
const DEAD_BIT: u8 = 0x80;
/// The object carries a deadline after its version.
const EXPIRES_BIT: u8 = 0x40;
/// Flag bits with no meaning: none is left. (While one was, an entry
/// setting it with a valid CRC was reported and skipped on replay.) A new
/// meaning for a flag would need a new format byte somewhere.
const RESERVED_BITS: u8 = !(KIND_BITS | VERSION_WIDTH_BITS | DEAD_BIT | EXPIRES_BIT);
const _: () = assert!(RESERVED_BITS == 0, "every flag bit is parsed");

/// Bytes the deadline takes for these flags (0 or 8).
#[inline(always)]
fn expires_bytes(flags: u8) -> usize {
    if flags & EXPIRES_BIT != 0 {
        EXPIRES_BYTES
    } else {
        0
    }
}

/// Bytes the version takes: the fewest that hold it (at least one).
#[inline(always)]
const fn version_bytes(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(8)
}

/// The version's byte count, from the flags.
#[inline(always)]
fn version_width(flags: u8) -> usize {
    usize::from((flags & VERSION_WIDTH_BITS) >> VERSION_WIDTH_SHIFT) + 1
}

/// The `width`-byte little-endian number at `p`. One 8-byte load and a mask
/// when 8 bytes are there (always, but at a segment's last entry).
#[inline(always)]
fn get_le(buf: &[u8], p: usize, width: usize) -> u64 {
    debug_assert!((1..=8).contains(&width));
    let mask = u64::MAX >> (64 - 8 * width as u32);
    match buf.get(p..p + 8) {
        Some(b) => {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a) & mask
        }
        None => buf[p..p + width]
            .iter()
            .rev()
            .fold(0u64, |v, &b| v << 8 | u64::from(b)),
    }
}

/// Bytes of `v` as a varint.
#[inline(always)]
const fn varint_bytes(v: u64) -> usize {
    // 1 + floor(bits / 7), with 0 taking one byte.
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Bytes of a header for these fields, without a deadline.
#[cfg(test)]
#[inline(always)]
pub(crate) const fn header_bytes(key_len: usize, value_len: usize, version: u64) -> usize {
    header_bytes_expiring(key_len, value_len, version, 0)
}

/// Bytes of a header for these fields (`expires_at_ms` 0: no deadline).
#[inline(always)]
pub(crate) const fn header_bytes_expiring(
    key_len: usize,
    value_len: usize,
    version: u64,
    expires_at_ms: u64,
) -> usize {
    OFF_VERSION
        + version_bytes(version)
        + if expires_at_ms != 0 { EXPIRES_BYTES } else { 0 }
        + varint_bytes(key_len as u64)
        + varint_bytes(value_len as u64)
}

/// Total bytes of an entry with these fields, without a deadline.
#[inline(always)]
pub(crate) const fn entry_bytes(key_len: usize, value_len: usize, version: u64) -> usize {
    entry_bytes_expiring(key_len, value_len, version, 0)
}

/// Total bytes of an entry with these fields (`expires_at_ms` 0: no deadline).
#[inline(always)]
pub(crate) const fn entry_bytes_expiring(
    key_len: usize,
    value_len: usize,
    version: u64,
    expires_at_ms: u64,
) -> usize {
    header_bytes_expiring(key_len, value_len, version, expires_at_ms) + key_len + value_len
}

/// Most bytes an entry with these lengths takes, whatever its version: what
/// room checks ask for before the version is taken.
#[inline(always)]
pub(crate) const fn max_entry_bytes(key_len: usize, value_len: usize) -> usize {
    MAX_HEADER_BYTES + key_len + value_len
}

#[inline(always)]
fn put_varint(out: &mut [u8], at: &mut usize, mut v: u64) {
    while v >= 0x80 {
        out[*at] = (v as u8) | 0x80;
        *at += 1;
        v >>= 7;
    }
    out[*at] = v as u8;
    *at += 1;
}

/// A varint of our own bytes (trusted: written by `put_varint`).
#[inline(always)]
fn get_varint(buf: &[u8], at: &mut usize) -> u64 {
    let b = buf[*at];
    *at += 1;
    if b < 0x80 {
        return u64::from(b); // the common case: one byte
    }
    let mut v = u64::from(b & 0x7f);
    let mut shift = 7;
    loop {
        let b = buf[*at];
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return v;
        }
        shift += 7;
        debug_assert!(shift < 64, "varint longer than 10 bytes in our own log");
    }
}

/// The fields of a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Kind bits only (the dead bit is in `dead`).
    pub kind: u8,
    pub dead: bool,
    pub key_len: usize,
    pub value_len: usize,
    pub version: u64,
    /// An object's deadline in Unix ms; 0: none.
    pub expires_at_ms: u64,
    /// Bytes of the header: the key starts here, relative to the entry.
    pub header_len: usize,
}

impl Header {
    #[inline(always)]
    pub fn entry_len(&self) -> usize {
        self.header_len + self.key_len + self.value_len
    }
}

/// The header of the entry at `at` of our own segment.
///
/// Why a fast path: the log walk is a dependent chain (the next entry's
/// offset comes from this one's lengths), so its speed is the latency of
/// decoding one header. The common header (a version of at most 5 bytes, a
/// key under 128 bytes, a value under 16 KiB) is decoded from one 8-byte
/// load with shifts and masks; anything else takes the general path.
#[inline(always)]
pub(crate) fn header(buf: &[u8], at: usize) -> Header {
    if let Some(bytes) = buf.get(at + OFF_FLAGS..at + OFF_FLAGS + 8) {
        let mut a = [0u8; 8];
        a.copy_from_slice(bytes);
        let word = u64::from_le_bytes(a);
        let flags = word as u8;
        let width = version_width(flags);
        // An expiring object takes the general path: its lengths follow
        // the deadline, beyond this load.
        if width <= 4 && flags & EXPIRES_BIT == 0 {
            // Bytes of `word`: flags, version (width), key_len, value_len...
            let byte = |i: usize| (word >> (8 * i)) as u8;
            let (k, v0, v1) = (byte(1 + width), byte(2 + width), byte(3 + width));
            if k < 0x80 && (v0 < 0x80 || v1 < 0x80) {
                let (value_len, value_bytes) = if v0 < 0x80 {
                    (usize::from(v0), 1)
                } else {
                    (usize::from(v0 & 0x7f) | usize::from(v1) << 7, 2)
                };
                return Header {
                    kind: flags & KIND_BITS,
                    dead: flags & DEAD_BIT != 0,
                    key_len: usize::from(k),
                    value_len,
                    version: (word >> 8) & (u64::MAX >> (64 - 8 * width as u32)),
                    expires_at_ms: 0,
                    header_len: OFF_VERSION + width + 1 + value_bytes,
                };
            }
        }
    }
    header_general(buf, at)
}

/// `header` for any header.
#[inline(never)]
fn header_general(buf: &[u8], at: usize) -> Header {
    let flags = buf[at + OFF_FLAGS];
    let width = version_width(flags);
    let version = get_le(buf, at + OFF_VERSION, width);
    let mut p = at + OFF_VERSION + width;
    let expires_at_ms = if flags & EXPIRES_BIT != 0 {
        p += EXPIRES_BYTES;
        get_le(buf, p - EXPIRES_BYTES, EXPIRES_BYTES)
    } else {
        0
    };
    let key_len = get_varint(buf, &mut p) as usize;
    let value_len = get_varint(buf, &mut p) as usize;
    Header {
        kind: flags & KIND_BITS,
        dead: flags & DEAD_BIT != 0,
        key_len,
        value_len,
        version,
        expires_at_ms,
        header_len: p - at,
    }
}

/// CRC of an entry: table id, header bytes 4.. with the dead bit cleared, key, value.
fn checksum(table: u64, header: &[u8], key: &[u8], value: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&table.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &[header[OFF_FLAGS] & !DEAD_BIT]);
    let crc = crc32c::crc32c_append(crc, &header[OFF_VERSION..]);
    crc32c::crc32c_append(crc32c::crc32c_append(crc, key), value)
}

/// Append a complete entry to `buf`; returns its length. The caller has
/// checked that it fits (the segment's capacity never grows).
#[inline]
pub(crate) fn append(
    buf: &mut Vec<u8>,
    kind: u8,
    table: u64,
    version: u64,
    key: &[u8],
    value: &[u8],
) -> usize {
    append_parts(buf, kind, table, version, 0, key, value, &[])
}

/// `append` with the value given in two parts (`head` then `tail`), so a
/// record's class and id need not be copied beside its payload first, and
/// with an object's deadline (`expires_at_ms`, Unix ms; 0: none).
#[allow(clippy::too_many_arguments)] // the entry's fields, one each
pub(crate) fn append_parts(
    buf: &mut Vec<u8>,
    kind: u8,
    table: u64,
    version: u64,
    expires_at_ms: u64,
    key: &[u8],
    head: &[u8],
    tail: &[u8],
) -> usize {
    debug_assert!(kind & !KIND_BITS == 0 && kind != 0);
    debug_assert!(
        expires_at_ms == 0 || kind == KIND_OBJECT,
        "only objects expire"
    );
    let value_len = head.len() + tail.len();
    let mut header = [0u8; MAX_HEADER_BYTES];
    let width = version_bytes(version);
    header[OFF_FLAGS] = kind | ((width - 1) as u8) << VERSION_WIDTH_SHIFT;
    header[OFF_VERSION..OFF_VERSION + width].copy_from_slice(&version.to_le_bytes()[..width]);
    let mut n = OFF_VERSION + width;
    if expires_at_ms != 0 {
        header[OFF_FLAGS] |= EXPIRES_BIT;
        header[n..n + EXPIRES_BYTES].copy_from_slice(&expires_at_ms.to_le_bytes());
        n += EXPIRES_BYTES;
    }
    put_varint(&mut header, &mut n, key.len() as u64);
    put_varint(&mut header, &mut n, value_len as u64);
    let crc = crc32c::crc32c_append(checksum(table, &header[..n], key, head), tail);
    header[0..4].copy_from_slice(&crc.to_le_bytes());
    let len = n + key.len() + value_len;
    debug_assert_eq!(
        len,
        entry_bytes_expiring(key.len(), value_len, version, expires_at_ms)
    );
    debug_assert!(buf.len() + len <= buf.capacity());
    buf.extend_from_slice(&header[..n]);
    buf.extend_from_slice(key);
    buf.extend_from_slice(head);
    buf.extend_from_slice(tail);
    len
}

/// The value head of a record or record removal: class, then id LE.
#[inline]
pub(crate) fn record_id_bytes(id: RecordId) -> [u8; RECORD_ID_BYTES] {
    let mut out = [0u8; RECORD_ID_BYTES];
    out[0] = id.class;
    out[1..].copy_from_slice(&id.id.to_le_bytes());
    out
}

/// The id a record value starts with and the rest (payload, or a removal's
/// segment id); `None` if the value is too short. Safe on untrusted bytes.
#[inline]
pub(crate) fn split_record_value(value: &[u8]) -> Option<(RecordId, &[u8])> {
    let (&class, rest) = value.split_first()?;
    let (id, rest) = rest.split_first_chunk::<8>()?;
    Some((
        RecordId {
            class,
            id: u64::from_le_bytes(*id),
        },
        rest,
    ))
}

// ---- reading our own segments (trusted: written by `append`) -------------

#[inline(always)]
pub(crate) fn kind(buf: &[u8], at: usize) -> u8 {
    buf[at + OFF_FLAGS] & KIND_BITS
}

#[inline(always)]
pub(crate) fn is_dead(buf: &[u8], at: usize) -> bool {
    buf[at + OFF_FLAGS] & DEAD_BIT != 0
}

#[inline(always)]
pub(crate) fn set_dead(buf: &mut [u8], at: usize) {
    debug_assert_eq!(buf[at + OFF_FLAGS] & DEAD_BIT, 0, "entry superseded twice");
    buf[at + OFF_FLAGS] |= DEAD_BIT;
}

/// Take back the dead bit of the entry at `at` (a verbatim copy of an entry
/// that was superseded where it came from is live where it lands). The
/// bit is outside the CRC, so the checksum stays valid.
#[inline(always)]
pub(crate) fn clear_dead(buf: &mut [u8], at: usize) {
    buf[at + OFF_FLAGS] &= !DEAD_BIT;
}

#[inline(always)]
pub(crate) fn version(buf: &[u8], at: usize) -> u64 {
    header(buf, at).version
}

/// Length of the whole entry at `at`.
#[inline(always)]
pub(crate) fn len_at(buf: &[u8], at: usize) -> usize {
    header(buf, at).entry_len()
}

/// The key of the entry at `at`: the version is skipped, not read, since
/// index probes compare keys.
#[inline(always)]
pub(crate) fn key_at(buf: &[u8], at: usize) -> &[u8] {
    let flags = buf[at + OFF_FLAGS];
    let mut p = at + OFF_VERSION + version_width(flags) + expires_bytes(flags);
    let k = get_varint(buf, &mut p) as usize;
    let _value_len = get_varint(buf, &mut p);
    &buf[p..p + k]
}

/// The object entry at `at` as an `ObjectRef`.
#[inline(always)]
pub(crate) fn object_at(buf: &[u8], at: usize) -> ObjectRef<'_> {
    let h = header(buf, at);
    let key_start = at + h.header_len;
    let value_start = key_start + h.key_len;
    ObjectRef {
        key: &buf[key_start..value_start],
        value: &buf[value_start..value_start + h.value_len],
        version: h.version,
        expires_at_ms: h.expires_at_ms,
    }
}

/// The deadline of the object at `at` (0: none), without decoding the rest.
#[inline(always)]
pub(crate) fn expires_at(buf: &[u8], at: usize) -> u64 {
    let flags = buf[at + OFF_FLAGS];
    if flags & EXPIRES_BIT == 0 {
        return 0;
    }
    get_le(buf, at + OFF_VERSION + version_width(flags), EXPIRES_BYTES)
}

/// The segment id a tombstone or a record removal records (a removal's
/// follows its class and id).
#[inline]
pub(crate) fn tombstone_segment(buf: &[u8], at: usize) -> u64 {
    let h = header(buf, at);
    let skip = match h.kind {
        KIND_TOMBSTONE => 0,
        KIND_RECORD_REMOVED => RECORD_ID_BYTES,
        other => unreachable!("entry kind {other:#x} records no segment"),
    };
    let v = at + h.header_len + h.key_len + skip;
    let mut a = [0u8; 8];
    a.copy_from_slice(&buf[v..v + 8]);
    u64::from_le_bytes(a)
}

/// A side record entry of our own log, decoded.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordRef<'a> {
    /// Which record (class and id, from the value's head).
    pub id: RecordId,
    /// The entry's key: decides the record's tablet.
    pub anchor: &'a [u8],
    /// The value after the id (a removal's: its recorded segment id).
    pub payload: &'a [u8],
    /// From the tablet's counter: newest wins on replay.
    pub version: u64,
}

/// The record (or record removal: its payload is then the segment id) at `at`.
#[inline]
pub(crate) fn record_at(buf: &[u8], at: usize) -> RecordRef<'_> {
    let o = object_at(buf, at);
    debug_assert!(matches!(kind(buf, at), KIND_RECORD | KIND_RECORD_REMOVED));
    let (id, payload) = split_record_value(o.value).expect("our own record holds its id");
    RecordRef {
        id,
        anchor: o.key,
        payload,
        version: o.version,
    }
}

// ---- parsing untrusted bytes (replay): in `entry_parse.rs` ----------------

#[path = "entry_parse.rs"]
mod parse;
#[cfg(test)]
use parse::get_varint_checked;
pub(crate) use parse::{Bad, parse};

#[cfg(test)]
#[path = "entry_tests.rs"]
mod tests;
