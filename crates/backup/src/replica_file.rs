//! The byte layout of one replica file, and reading it back without trusting it.
//!
//! A replica file holds one segment of one master's log, as a header followed
//! by the records the master sent, in order. Every record carries its own
//! crc32c and the segment offset it starts at, so a reader can tell a
//! complete record from a torn one and a gap from a continuation.
//!
//! ```text
//! header, 64 bytes (little-endian):
//!  0  8  magic   "INSITUBK"
//!  8  4  format  u32 = 1
//! 12  4  crc32c of bytes 0..12 and 16..64
//! 16  8  cluster id   a replica of another cluster is refused, not replayed
//! 24  8  master id    the server whose log this is
//! 32  8  log id       which log of that master (one per tablet)
//! 40  8  segment id   position of the segment in that log
//! 48  8  table id     the tablet whose log this is (table, start of its
//! 56  8  start hash   hash range): recovery finds a tablet's replicas by it
//!
//! record, 24-byte head then payload:
//!  0  4  payload_len u32  <= MAX_RECORD_PAYLOAD_BYTES, checked before use
//!  4  1  kind             1 data, 2 closed (payload empty: the segment is complete),
//!                         3 digest (payload: the log's digest, below; adds no
//!                         segment bytes, and may follow a close)
//!  5  3  reserved, 0
//!  8  8  offset u64       segment offset of the payload's first byte; must equal
//!                         the bytes of data before it (a gap is corruption)
//! 16  4  crc32c of head bytes 0..16 and the payload
//! 20  4  reserved, 0
//! 24  ..  payload
//!
//! digest payload (kind 3), little-endian:
//!  0  8  seq u64          grows with every digest the master makes of the log
//!  8  8n segment ids      u64 each, ascending, n <= MAX_DIGEST_SEGMENTS
//! ```
//!
//! Crash cases. Records are only ever appended. A crash during an append
//! leaves a prefix of the record on disk: its length runs past the end of the
//! file or its crc fails, so the reader stops there and reports the torn
//! tail; everything before it was written completely (each earlier record's
//! crc proves it). A flipped bit anywhere is caught by the crc of the record
//! it is in; the reader keeps the records before it and reports the rest
//! (after a bad record no length can be trusted, so nothing after it is read).
//! A file shorter than its header, or with a bad header, yields nothing.

use crate::{Digest, ReplicaId, Tablet};

pub const MAGIC: [u8; 8] = *b"INSITUBK";
pub const FORMAT: u32 = 1;
pub const HEADER_BYTES: usize = 64;
pub const RECORD_HEAD_BYTES: usize = 24;
/// Largest payload one record may carry. A master sends at most one
/// segment's worth per record; segments are 2 MiB by default, and 64 MiB is
/// far above any configured size, so a larger length can only be corruption.
pub const MAX_RECORD_PAYLOAD_BYTES: usize = 64 << 20;
/// Largest segment a replica may describe (the same bound, for the sum).
pub const MAX_SEGMENT_BYTES: u64 = 64 << 20;

pub const KIND_DATA: u8 = 1;
pub const KIND_CLOSED: u8 = 2;
pub const KIND_DIGEST: u8 = 3;
/// Most segment ids a digest record may list (the wire's limit).
pub const MAX_DIGEST_SEGMENTS: usize = insitu_protocol::MAX_DIGEST_SEGMENTS;

/// The 64-byte header of a replica of `id` (a segment of `tablet`'s log) in
/// cluster `cluster`.
pub fn encode_header(cluster: u64, id: ReplicaId, tablet: Tablet) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    h[16..24].copy_from_slice(&cluster.to_le_bytes());
    h[24..32].copy_from_slice(&id.master.to_le_bytes());
    h[32..40].copy_from_slice(&id.log.to_le_bytes());
    h[40..48].copy_from_slice(&id.segment.to_le_bytes());
    h[48..56].copy_from_slice(&tablet.table.to_le_bytes());
    h[56..64].copy_from_slice(&tablet.start_hash.to_le_bytes());
    let crc = header_crc(&h);
    h[12..16].copy_from_slice(&crc.to_le_bytes());
    h
}

fn header_crc(h: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&h[0..12]);
    crc32c::crc32c_append(crc, &h[16..HEADER_BYTES])
}

/// Append the bytes of one record to `out`.
pub fn encode_record(out: &mut Vec<u8>, kind: u8, offset: u64, payload: &[u8]) {
    out.extend_from_slice(&record_head(kind, offset, payload));
    out.extend_from_slice(payload);
}

/// The head of the record `encode_record` writes: the record is this head
/// followed by `payload` itself.
pub fn record_head(kind: u8, offset: u64, payload: &[u8]) -> [u8; RECORD_HEAD_BYTES] {
    debug_assert!(payload.len() <= MAX_RECORD_PAYLOAD_BYTES);
    debug_assert!(
        kind == KIND_DATA || kind == KIND_DIGEST || (kind == KIND_CLOSED && payload.is_empty())
    );
    let mut head = [0u8; RECORD_HEAD_BYTES];
    head[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    head[4] = kind;
    head[8..16].copy_from_slice(&offset.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head[0..16]), payload);
    head[16..20].copy_from_slice(&crc.to_le_bytes());
    head
}

/// The payload of a digest record: `seq`, then the segment ids.
pub fn encode_digest(digest: &Digest) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 8 * digest.segments.len());
    out.extend_from_slice(&digest.seq.to_le_bytes());
    for s in &digest.segments {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

/// A digest record's payload read back; None if it is not a well-formed one
/// (its crc matched, so only a writer bug gets here).
fn decode_digest(payload: &[u8]) -> Option<Digest> {
    if payload.len() < 8 || !payload.len().is_multiple_of(8) {
        return None;
    }
    let n = payload.len() / 8 - 1;
    if n > MAX_DIGEST_SEGMENTS {
        return None;
    }
    let segments: Vec<u64> = (0..n).map(|i| u64_at(payload, 8 + 8 * i)).collect();
    if !segments.windows(2).all(|w| w[0] < w[1]) {
        return None;
    }
    Some(Digest {
        seq: u64_at(payload, 0),
        segments,
    })
}

/// What a replica file holds, as far as it can be trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedReplica {
    pub id: ReplicaId,
    pub cluster: u64,
    /// The tablet whose log the segment belongs to (from the header).
    pub tablet: Tablet,
    /// The segment's bytes from offset 0, concatenated from every valid record.
    pub data: Vec<u8>,
    /// A `closed` record was read: the master finished this segment.
    pub closed: bool,
    /// The digest with the highest `seq` among the file's digest records.
    pub digest: Option<Digest>,
    /// File bytes that were well-formed (header + valid records). Appends
    /// after a repair start here.
    pub valid_file_bytes: u64,
    /// Why reading stopped before the end of the file, if it did.
    pub cut: Option<String>,
}

/// Why a file is not a replica at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("file of {0} bytes is shorter than the {HEADER_BYTES}-byte replica header")]
    Short(usize),
    #[error("not a replica file (bad magic)")]
    Magic,
    #[error("replica format {0} is not supported (this build reads format {FORMAT})")]
    Format(u32),
    #[error("replica header checksum mismatch")]
    Checksum,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Read a replica file's bytes. Never panics, never allocates more than
/// `file.len()`: every length is checked against the bytes actually present.
pub fn parse(file: &[u8]) -> Result<ParsedReplica, HeaderError> {
    if file.len() < HEADER_BYTES {
        return Err(HeaderError::Short(file.len()));
    }
    let h = &file[..HEADER_BYTES];
    if h[0..8] != MAGIC {
        return Err(HeaderError::Magic);
    }
    let format = u32_at(h, 8);
    if format != FORMAT {
        return Err(HeaderError::Format(format));
    }
    if u32_at(h, 12) != header_crc(h) {
        return Err(HeaderError::Checksum);
    }
    let id = ReplicaId {
        master: u64_at(h, 24),
        log: u64_at(h, 32),
        segment: u64_at(h, 40),
    };
    let mut out = ParsedReplica {
        id,
        cluster: u64_at(h, 16),
        tablet: Tablet {
            table: u64_at(h, 48),
            start_hash: u64_at(h, 56),
        },
        // At most the file's bytes past its header: one allocation, not a
        // doubling per record (a replica is written in many small records).
        data: Vec::with_capacity(file.len().saturating_sub(HEADER_BYTES)),
        closed: false,
        digest: None,
        valid_file_bytes: HEADER_BYTES as u64,
        cut: None,
    };
    let mut at = HEADER_BYTES;
    while at < file.len() {
        match parse_record(&file[at..], out.data.len() as u64, out.closed) {
            Ok((kind, payload)) => {
                match kind {
                    KIND_CLOSED => out.closed = true,
                    KIND_DIGEST => {
                        let Some(d) = decode_digest(payload) else {
                            out.cut = Some(format!(
                                "malformed digest record at file offset {at}; {} trailing bytes ignored",
                                file.len() - at
                            ));
                            break;
                        };
                        if out.digest.as_ref().is_none_or(|old| old.seq < d.seq) {
                            out.digest = Some(d);
                        }
                    }
                    _ => out.data.extend_from_slice(payload),
                }
                at += RECORD_HEAD_BYTES + payload.len();
                out.valid_file_bytes = at as u64;
            }
            Err(why) => {
                out.cut = Some(format!(
                    "{why} at file offset {at}; {} trailing bytes ignored",
                    file.len() - at
                ));
                break;
            }
        }
    }
    Ok(out)
}

/// One record at the start of `b`, given the segment bytes read so far.
fn parse_record(b: &[u8], data_so_far: u64, closed: bool) -> Result<(u8, &[u8]), String> {
    if b.len() < RECORD_HEAD_BYTES {
        return Err(format!(
            "torn record head ({} of {RECORD_HEAD_BYTES} bytes)",
            b.len()
        ));
    }
    let len = u32_at(b, 0) as usize;
    let kind = b[4];
    if len > MAX_RECORD_PAYLOAD_BYTES {
        return Err(format!(
            "record length {len} exceeds {MAX_RECORD_PAYLOAD_BYTES}"
        ));
    }
    if b.len() - RECORD_HEAD_BYTES < len {
        return Err(format!(
            "torn record ({} of {len} payload bytes)",
            b.len() - RECORD_HEAD_BYTES
        ));
    }
    let payload = &b[RECORD_HEAD_BYTES..RECORD_HEAD_BYTES + len];
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[0..16]), payload);
    if crc != u32_at(b, 16) {
        return Err("record checksum mismatch".to_string());
    }
    if b[5..8] != [0; 3] || b[20..24] != [0; 4] {
        // Bytes 20..24 are outside the crc: insist they are what the writer wrote.
        return Err("record reserved bytes are not zero".to_string());
    }
    // The crc matched, so the fields below are what the writer wrote; these
    // checks catch a writer bug or a replica spliced from two files.
    let offset = u64_at(b, 8);
    if offset != data_so_far {
        return Err(format!(
            "record starts at segment offset {offset}, expected {data_so_far}"
        ));
    }
    if closed && kind != KIND_DIGEST {
        return Err("record after the segment was closed".to_string());
    }
    match kind {
        KIND_DATA if data_so_far + len as u64 <= MAX_SEGMENT_BYTES => Ok((kind, payload)),
        KIND_DATA => Err(format!("segment would exceed {MAX_SEGMENT_BYTES} bytes")),
        KIND_CLOSED if len == 0 => Ok((kind, payload)),
        KIND_DIGEST if len >= 8 => Ok((kind, payload)),
        _ => Err(format!("unknown record kind {kind} (length {len})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: ReplicaId = ReplicaId {
        master: 3,
        log: 9,
        segment: 27,
    };

    const TABLET: Tablet = Tablet {
        table: 5,
        start_hash: 1 << 63,
    };

    fn file(records: &[(&[u8], bool)]) -> Vec<u8> {
        let mut f = encode_header(77, ID, TABLET).to_vec();
        let mut off = 0u64;
        for (payload, close) in records {
            encode_record(&mut f, KIND_DATA, off, payload);
            off += payload.len() as u64;
            if *close {
                encode_record(&mut f, KIND_CLOSED, off, &[]);
            }
        }
        f
    }

    #[test]
    fn round_trip() {
        let f = file(&[(b"hello ", false), (b"world", true)]);
        let p = parse(&f).unwrap();
        assert_eq!(p.id, ID);
        assert_eq!(p.cluster, 77);
        assert_eq!(p.tablet, TABLET);
        assert_eq!(p.data, b"hello world");
        assert!(p.closed);
        assert_eq!(p.valid_file_bytes, f.len() as u64);
        assert_eq!(p.cut, None);
    }

    #[test]
    fn every_torn_length_keeps_exactly_the_whole_records() {
        let f = file(&[(b"abc", false), (b"defgh", false)]);
        let first_end = HEADER_BYTES + RECORD_HEAD_BYTES + 3;
        for len in HEADER_BYTES..f.len() {
            let p = parse(&f[..len]).unwrap();
            let want: &[u8] = if len >= first_end { b"abc" } else { b"" };
            assert_eq!(p.data, want, "len {len}");
            assert!(p.cut.is_some() == (len != first_end && len != HEADER_BYTES));
        }
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let f = file(&[(b"abc", false), (b"defgh", true)]);
        for byte in 0..f.len() {
            for bit in 0..8 {
                let mut g = f.clone();
                g[byte] ^= 1 << bit;
                match parse(&g) {
                    Err(_) => assert!(byte < HEADER_BYTES),
                    Ok(p) => {
                        // Every header byte is covered by the header crc, so
                        // a flip there is an error too; so only record bytes
                        // get here, and they must cut the file.
                        assert!(p.cut.is_some(), "flip at {byte}.{bit} not caught");
                        assert!(b"abcdefgh".starts_with(&p.data));
                    }
                }
            }
        }
    }

    #[test]
    fn bad_headers_are_refused() {
        assert_eq!(parse(&[0; 10]), Err(HeaderError::Short(10)));
        let mut f = file(&[]);
        f[0] = b'X';
        assert_eq!(parse(&f), Err(HeaderError::Magic));
        let mut f = file(&[]);
        f[8] = 2;
        assert_eq!(parse(&f), Err(HeaderError::Format(2)));
        let mut f = file(&[]);
        f[50] = 1;
        assert_eq!(parse(&f), Err(HeaderError::Checksum));
    }

    #[test]
    fn a_huge_length_is_refused_before_use() {
        let mut f = encode_header(1, ID, TABLET).to_vec();
        let mut head = [0u8; RECORD_HEAD_BYTES];
        head[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        head[4] = KIND_DATA;
        f.extend_from_slice(&head);
        let p = parse(&f).unwrap();
        assert!(p.data.is_empty());
        assert!(p.cut.unwrap().contains("exceeds"));
    }

    fn digest(seq: u64, segments: &[u64]) -> Digest {
        Digest {
            seq,
            segments: segments.to_vec(),
        }
    }

    #[test]
    fn digests_add_no_segment_bytes_and_the_newest_is_kept() {
        let mut f = encode_header(1, ID, TABLET).to_vec();
        encode_record(&mut f, KIND_DATA, 0, b"ab");
        encode_record(&mut f, KIND_DIGEST, 2, &encode_digest(&digest(7, &[3, 27])));
        encode_record(&mut f, KIND_DATA, 2, b"cd");
        encode_record(&mut f, KIND_CLOSED, 4, &[]);
        // After the close, as a digest's carrier may be a sealed segment.
        encode_record(&mut f, KIND_DIGEST, 4, &encode_digest(&digest(9, &[27])));
        encode_record(&mut f, KIND_DIGEST, 4, &encode_digest(&digest(8, &[1, 27])));
        let p = parse(&f).unwrap();
        assert_eq!(p.cut, None);
        assert_eq!(p.data, b"abcd");
        assert!(p.closed);
        assert_eq!(p.digest, Some(digest(9, &[27])));
        // A torn last digest leaves the one before it.
        let p = parse(&f[..f.len() - 3]).unwrap();
        assert_eq!(p.digest, Some(digest(9, &[27])));
        assert!(p.cut.is_some());
    }

    #[test]
    fn a_malformed_digest_cuts_the_file() {
        for payload in [
            vec![0u8; 12],
            [encode_digest(&digest(1, &[5])), 4u64.to_le_bytes().to_vec()].concat(),
        ] {
            let mut f = encode_header(1, ID, TABLET).to_vec();
            encode_record(&mut f, KIND_DIGEST, 0, &payload);
            let p = parse(&f).unwrap();
            assert_eq!(p.digest, None);
            assert!(p.cut.unwrap().contains("malformed digest"));
        }
    }

    #[test]
    fn a_gap_is_refused() {
        let mut f = encode_header(1, ID, TABLET).to_vec();
        encode_record(&mut f, KIND_DATA, 0, b"ab");
        encode_record(&mut f, KIND_DATA, 5, b"cd");
        let p = parse(&f).unwrap();
        assert_eq!(p.data, b"ab");
        assert!(p.cut.unwrap().contains("expected 2"));
    }
}
