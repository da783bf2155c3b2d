//! Parsing entries from untrusted bytes (replay): every length and flag of
//! a header checked before it is used, and the checksum verified, so a
//! damaged or hostile segment is reported, never a panic.
//!
//! Apart from `entry.rs` because it is the one reader of bytes the engine
//! did not write (replay from a backup's disk, and the fuzzers through it):
//! every check a hostile segment needs, easier to audit alone. The layout
//! it checks is documented in `entry.rs`.

use super::{
    EXPIRES_BIT, EXPIRES_BYTES, KIND_BITS, KIND_MARK, KIND_OBJECT, KIND_RECORD,
    KIND_RECORD_REMOVED, KIND_TOMBSTONE, OFF_FLAGS, OFF_VERSION, RECORD_ID_BYTES,
    RECORD_REMOVED_VALUE_BYTES, TOMBSTONE_VALUE_BYTES, checksum, get_le, version_width,
};

/// A varint of untrusted bytes: `None` if it runs past `buf`, is longer than
/// `max_bytes`, overflows 64 bits or is not in its shortest form.
pub(super) fn get_varint_checked(buf: &[u8], at: &mut usize, max_bytes: usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..max_bytes {
        let b = *buf.get(*at + i)?;
        let group = u64::from(b & 0x7f);
        if i == 9 && group > 1 {
            return None; // bits beyond 64
        }
        v |= group << (7 * i);
        if b < 0x80 {
            if i > 0 && b == 0 {
                return None; // a longer form than needed
            }
            *at += i + 1;
            return Some(v);
        }
    }
    None
}

/// A validated entry from untrusted bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parsed<'a> {
    pub kind: u8,
    pub version: u64,
    /// An object's deadline (Unix ms; 0: none).
    pub expires_at_ms: u64,
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// The whole entry, header to value, as verified: a replay re-appends
    /// it verbatim (`Segment::append_verified`) instead of encoding and
    /// checksumming it again. Its header is canonical (the checks above
    /// refuse wider-than-needed versions and lengths), so these are the
    /// bytes `append_parts` would write for the same fields.
    pub entry: &'a [u8],
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
}

/// Parse and verify the entry at `at` of an untrusted buffer, as an entry of
/// `table`. Never panics: every length is checked before it is used to slice.
pub(crate) fn parse(
    buf: &[u8],
    at: usize,
    table: u64,
    max_key_bytes: usize,
    max_value_bytes: usize,
) -> Result<Parsed<'_>, Bad> {
    let rest = buf.get(at..).unwrap_or(&[]);
    // Zero bytes are a segment's unwritten tail (a backup may store whole
    // segments). Checked only when the flags byte is 0, so a walk stays linear.
    let zero_tail = |rest: &[u8]| rest.iter().all(|&b| b == 0);
    if rest.len() <= OFF_VERSION {
        if zero_tail(rest) {
            return Err(Bad::End);
        }
        return Err(Bad::Stop(format!(
            "truncated header: {} bytes left",
            rest.len()
        )));
    }
    let flags = rest[OFF_FLAGS];
    if flags == 0 && zero_tail(rest) {
        return Err(Bad::End);
    }
    let kind = flags & KIND_BITS;
    let width = version_width(flags);
    let Some(version_le) = rest.get(OFF_VERSION..OFF_VERSION + width) else {
        return Err(Bad::Stop("truncated header: the version is cut".into()));
    };
    if width > 1 && version_le[width - 1] == 0 {
        return Err(Bad::Stop(format!(
            "version in {width} bytes where fewer hold it"
        )));
    }
    let version = get_le(version_le, 0, width);
    let mut p = OFF_VERSION + width;
    let mut expires_at_ms = 0;
    if flags & EXPIRES_BIT != 0 {
        let Some(deadline) = rest.get(p..p + EXPIRES_BYTES) else {
            return Err(Bad::Stop("truncated header: the deadline is cut".into()));
        };
        expires_at_ms = get_le(deadline, 0, EXPIRES_BYTES);
        // Its length is trusted below only for an object with a real deadline.
        if kind != KIND_OBJECT || expires_at_ms == 0 {
            return Err(Bad::Stop(format!(
                "a deadline of {expires_at_ms} on an entry of kind {kind}"
            )));
        }
        p += EXPIRES_BYTES;
    }
    let (Some(key_len), Some(value_len)) = (
        get_varint_checked(rest, &mut p, 3),
        get_varint_checked(rest, &mut p, 5),
    ) else {
        return Err(Bad::Stop("malformed or truncated header lengths".into()));
    };
    let header_len = p;
    let (key_len, value_len) = (key_len as usize, value_len as usize);
    let lengths_ok = match kind {
        KIND_OBJECT => (1..=max_key_bytes).contains(&key_len) && value_len <= max_value_bytes,
        KIND_TOMBSTONE => {
            (1..=max_key_bytes).contains(&key_len) && value_len == TOMBSTONE_VALUE_BYTES
        }
        KIND_MARK => key_len == 0 && value_len == 0,
        // A record's value is its id and a payload of at most what a write
        // accepts (`Engine::put_record`: id + payload <= max_value_bytes).
        KIND_RECORD => {
            (1..=max_key_bytes).contains(&key_len)
                && (RECORD_ID_BYTES..=max_value_bytes).contains(&value_len)
        }
        KIND_RECORD_REMOVED => {
            (1..=max_key_bytes).contains(&key_len) && value_len == RECORD_REMOVED_VALUE_BYTES
        }
        other => return Err(Bad::Stop(format!("unknown entry kind {other}"))),
    };
    if !lengths_ok {
        return Err(Bad::Stop(format!(
            "impossible lengths for kind {kind}: key {key_len}, value {value_len}"
        )));
    }
    let total = header_len + key_len + value_len;
    if rest.len() < total {
        return Err(Bad::Stop(format!(
            "truncated entry: needs {total} bytes, {} left",
            rest.len()
        )));
    }
    let header = &rest[..header_len];
    let key = &rest[header_len..header_len + key_len];
    let value = &rest[header_len + key_len..total];
    let stored = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let computed = checksum(table, header, key, value);
    if stored != computed {
        return Err(Bad::Stop(format!(
            "checksum mismatch (or an entry of another table): stored {stored:#010x}, computed {computed:#010x}"
        )));
    }
    let next = at + total;
    Ok(Parsed {
        kind,
        version,
        expires_at_ms,
        key,
        value,
        entry: &rest[..total],
        next,
    })
}
