//! A request encoded as a frame in parts: the big byte strings it borrows
//! from `Bytes` the caller names are referenced, not copied.
//!
//! Why: a replication round sends each segment's new bytes to R backups.
//! Encoded the usual way, every send copies those bytes into a fresh frame
//! buffer on the shard thread (and faults the buffer's pages in) before the
//! kernel copies them again into the socket: for a recovery's rebuilt tablet
//! (~128 MB, sent to two backups) that is most of what the recovering shard
//! spends beside the replay. In parts, the kernel's copy is the only one.
//!
//! How a borrowed string is recognised: postcard hands a byte string to its
//! output as the very slice the message borrows, so a slice with the address
//! and length of one of `shared` is that `Bytes`. The two are compared,
//! never converted (no unsafe code); a string not found is copied as usual,
//! so the parts always concatenate to exactly `encode_request`'s frame.

use bytes::{BufMut, Bytes, BytesMut};
use postcard::ser_flavors::Flavor;

use crate::frame::{self, FrameKind, HEADER_BYTES, Header, MAX_BODY_BYTES};
use crate::{ProtocolError, Request, Status};

/// Byte strings shorter than this are copied even when shared: a part of
/// their own would cost a write of its own for less than a page of copying.
pub const SHARED_MIN_BYTES: usize = 4096;

/// Encode `request` (id `request_id`) as a request frame in parts, in order:
/// each byte string of at least `SHARED_MIN_BYTES` that is one of `shared`
/// (same address, same length) is a clone of that `Bytes`; everything else
/// is copied into small parts between them, the first led by the header (a
/// frame with no shared string is one part). Refused like `encode_request`
/// (a body over `MAX_BODY_BYTES`, or one that does not serialize).
pub fn encode_request_parts(
    request_id: u64,
    request: &Request<'_>,
    shared: &[Bytes],
) -> Result<Vec<Bytes>, ProtocolError> {
    // The header leads the first part (its length is written once known),
    // so a frame with no shared string is one part: one write, as before.
    // Sized for the bytes that will be copied (all but the shared strings),
    // so a small frame is one allocation, not a few doublings.
    let shared_bytes: usize = shared
        .iter()
        .filter(|b| b.len() >= SHARED_MIN_BYTES)
        .map(Bytes::len)
        .sum();
    let copied = crate::encoded_len(request).saturating_sub(shared_bytes);
    let mut open = BytesMut::with_capacity(HEADER_BYTES + copied.min(MAX_BODY_BYTES));
    let (kind, status) = (FrameKind::Request, Status::Ok);
    let header = Header {
        kind,
        request_id,
        status,
    };
    frame::put_header(&mut open, &header, 0);
    let parts = Parts {
        first: None,
        done: Vec::new(),
        open,
        shared,
        next: 0,
        body_len: 0,
    };
    let (first, done, body_len) = postcard::serialize_with_flavor(request, parts)
        .map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    if body_len > MAX_BODY_BYTES {
        return Err(ProtocolError::FrameTooLarge {
            len: body_len,
            max: MAX_BODY_BYTES,
        });
    }
    let mut first = first.expect("finalize always closes the first part");
    debug_assert!(first.len() >= HEADER_BYTES);
    first[0..4].copy_from_slice(&(body_len as u32).to_le_bytes());
    let mut out = Vec::with_capacity(1 + done.len());
    out.push(first.freeze());
    out.extend(done);
    Ok(out)
}

/// The postcard output that builds the parts.
struct Parts<'s> {
    /// The first part, header first (kept mutable until the body's length
    /// is known).
    first: Option<BytesMut>,
    /// Finished parts after the first, in order.
    done: Vec<Bytes>,
    /// The small bytes since the last shared string (the header too, until
    /// the first part is closed).
    open: BytesMut,
    /// The strings that are referenced rather than copied.
    shared: &'s [Bytes],
    /// Where the search for the next shared string starts: a message names
    /// them in order, so the next one is almost always here.
    next: usize,
    /// Body bytes so far (parts and open bytes, the header not counted).
    body_len: usize,
}

impl Parts<'_> {
    /// Index of the shared string that is `data` itself, if any.
    fn find(&self, data: &[u8]) -> Option<usize> {
        let n = self.shared.len();
        (0..n).map(|k| (self.next + k) % n).find(|&i| {
            let b = &self.shared[i];
            b.len() == data.len() && std::ptr::eq(b.as_ptr(), data.as_ptr())
        })
    }

    fn close_open(&mut self) {
        if self.first.is_none() {
            self.first = Some(self.open.split());
        } else if !self.open.is_empty() {
            self.done.push(self.open.split().freeze());
        }
    }
}

impl Flavor for Parts<'_> {
    type Output = (Option<BytesMut>, Vec<Bytes>, usize);

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.open.put_u8(data);
        self.body_len += 1;
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.body_len += data.len();
        if data.len() >= SHARED_MIN_BYTES
            && let Some(i) = self.find(data)
        {
            self.close_open();
            self.done.push(self.shared[i].clone());
            self.next = i + 1;
            return Ok(());
        }
        self.open.extend_from_slice(data);
        Ok(())
    }

    fn finalize(mut self) -> postcard::Result<Self::Output> {
        self.close_open();
        Ok((self.first, self.done, self.body_len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackupOp, blob, encode_request};

    fn append(bytes: &Bytes, segment: u64) -> BackupOp<'_> {
        BackupOp::Append {
            log: 3,
            table: 9,
            start_hash: 1 << 60,
            segment,
            offset: 4096 * segment,
            bytes: blob(bytes),
            close: segment.is_multiple_of(2),
        }
    }

    fn joined(parts: &[Bytes]) -> Vec<u8> {
        parts.iter().flat_map(|p| p.iter().copied()).collect()
    }

    /// The parts are exactly the frame `encode_request` makes; the shared
    /// strings are referenced (same memory), a small or unnamed one copied.
    #[test]
    fn parts_concatenate_to_the_encoded_frame_and_reference_the_shared_bytes() {
        let big: Vec<Bytes> = (0..3u8)
            .map(|i| Bytes::from(vec![i; SHARED_MIN_BYTES + 7 * i as usize]))
            .collect();
        let small = Bytes::from_static(b"tiny");
        let unnamed = Bytes::from(vec![7u8; SHARED_MIN_BYTES * 2]);
        let mut ops: Vec<BackupOp> = big.iter().zip(1..).map(|(b, s)| append(b, s)).collect();
        ops.insert(1, append(&small, 10));
        ops.push(BackupOp::Free { log: 3, segment: 2 });
        ops.push(append(&unnamed, 11));
        let request = Request::BackupWrite {
            cluster: 5,
            master: 6,
            ops,
        };
        let mut shared = big.clone();
        shared.push(small.clone());
        let parts = encode_request_parts(42, &request, &shared).unwrap();
        let mut whole = BytesMut::new();
        encode_request(&mut whole, 42, &request).unwrap();
        assert_eq!(joined(&parts), &whole[..]);
        for b in &big {
            let referenced = parts.iter().filter(|p| p.as_ptr() == b.as_ptr()).count();
            assert_eq!(
                referenced, 1,
                "each big shared string is one part, not a copy"
            );
        }
        assert!(parts.iter().all(|p| p.as_ptr() != small.as_ptr()));
        assert!(parts.iter().all(|p| p.as_ptr() != unnamed.as_ptr()));
        // Header with the first small bytes, then small parts only
        // between and after the three shared strings.
        assert!(parts.len() <= 3 + 4, "{} parts", parts.len());
        assert!(
            parts[0].len() > HEADER_BYTES,
            "the header leads the first part"
        );
    }

    /// With no shared string the frame is one part (one write).
    #[test]
    fn a_frame_without_shared_strings_is_one_part() {
        let bytes = Bytes::from(vec![3u8; SHARED_MIN_BYTES * 2]);
        let request = Request::BackupWrite {
            cluster: 5,
            master: 6,
            ops: vec![append(&bytes, 1)],
        };
        let parts = encode_request_parts(9, &request, &[]).unwrap();
        let mut whole = BytesMut::new();
        encode_request(&mut whole, 9, &request).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(&parts[0][..], &whole[..]);
    }

    /// Too big a body is refused as `encode_request` refuses it.
    #[test]
    fn a_body_over_the_frame_limit_is_refused() {
        let big = Bytes::from(vec![1u8; MAX_BODY_BYTES]);
        let request = Request::BackupWrite {
            cluster: 5,
            master: 6,
            ops: vec![append(&big, 1)],
        };
        let err = encode_request_parts(1, &request, std::slice::from_ref(&big)).unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge { .. }), "{err}");
    }
}
