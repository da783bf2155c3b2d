//! Framing: how a message is cut out of a TCP byte stream.
//!
//! ```text
//! offset size field
//!  0     4    body_len   u32 LE: bytes of the body that follows the header
//!  4     2    magic      u16 LE: 0x1A5E — rejects stray traffic early
//!  6     1    kind       u8: 0 request, 1 response
//!  7     1    reserved   u8: 0
//!  8     8    request_id u64 LE: echoed in the response, so a connection pipelines
//! 16     2    status     u16 LE: Status of a response (0 in a request)
//! 18     2    reserved   u16: 0
//! 20     ..   body       postcard-encoded `Request` or `Response`
//! ```
//! The header is checked (magic, kind, `body_len <= max`) before a single
//! body byte is buffered, so a huge length costs nothing but an error.

use bytes::{Buf, BufMut, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::{ProtocolError, Status};

pub const HEADER_BYTES: usize = 20;
pub const MAGIC: u16 = 0x1A5E;
/// Largest body a peer may send. Requests larger than this are split by the client.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Request = 0,
    Response = 1,
}

/// A frame's fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub request_id: u64,
    pub status: Status,
}

/// A whole frame: header plus the still-encoded body.
#[derive(Debug)]
pub struct Frame {
    pub header: Header,
    pub body: BytesMut,
}

/// Tokio codec for frames. `max_body_bytes` bounds what one frame may allocate.
#[derive(Clone, Debug)]
pub struct FrameCodec {
    pub max_body_bytes: usize,
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec {
            max_body_bytes: MAX_BODY_BYTES,
        }
    }
}

/// Check the header at the front of `src` without consuming it.
/// Ok(None): not enough bytes yet. Ok(Some((header, body_len))): valid header.
pub fn check_header(
    src: &[u8],
    max_body_bytes: usize,
) -> Result<Option<(Header, usize)>, ProtocolError> {
    if src.len() < HEADER_BYTES {
        return Ok(None);
    }
    let body_len = u32::from_le_bytes([src[0], src[1], src[2], src[3]]) as usize;
    let magic = u16::from_le_bytes([src[4], src[5]]);
    if magic != MAGIC {
        return Err(ProtocolError::BadMagic(magic));
    }
    let kind = match src[6] {
        0 => FrameKind::Request,
        1 => FrameKind::Response,
        other => return Err(ProtocolError::BadKind(other)),
    };
    if body_len > max_body_bytes {
        return Err(ProtocolError::FrameTooLarge {
            len: body_len,
            max: max_body_bytes,
        });
    }
    let request_id = u64::from_le_bytes(src[8..16].try_into().expect("8 bytes"));
    let status_raw = u16::from_le_bytes([src[16], src[17]]);
    let status = Status::from_u16(status_raw).ok_or(ProtocolError::BadStatus(status_raw))?;
    Ok(Some((
        Header {
            kind,
            request_id,
            status,
        },
        body_len,
    )))
}

/// The request id of the header at the front of `src` when it at least
/// carries our magic (so the id means something), even if `check_header`
/// refuses it: an error reply can then name the request it refuses.
pub fn request_id_of(src: &[u8]) -> Option<u64> {
    if src.len() < HEADER_BYTES || u16::from_le_bytes([src[4], src[5]]) != MAGIC {
        return None;
    }
    Some(u64::from_le_bytes(src[8..16].try_into().ok()?))
}

/// Append a header for a body of `body_len` bytes.
pub fn put_header(dst: &mut BytesMut, header: &Header, body_len: usize) {
    debug_assert!(body_len <= u32::MAX as usize);
    dst.put_u32_le(body_len as u32);
    dst.put_u16_le(MAGIC);
    dst.put_u8(header.kind as u8);
    dst.put_u8(0);
    dst.put_u64_le(header.request_id);
    dst.put_u16_le(header.status as u16);
    dst.put_u16_le(0);
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, ProtocolError> {
        let Some((header, body_len)) = check_header(src, self.max_body_bytes)? else {
            src.reserve(HEADER_BYTES);
            return Ok(None);
        };
        let total = HEADER_BYTES + body_len;
        if src.len() < total {
            // Bounded by max_body_bytes, checked above.
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(HEADER_BYTES);
        let body = src.split_to(body_len);
        Ok(Some(Frame { header, body }))
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = ProtocolError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), ProtocolError> {
        if frame.body.len() > self.max_body_bytes {
            return Err(ProtocolError::FrameTooLarge {
                len: frame.body.len(),
                max: self.max_body_bytes,
            });
        }
        dst.reserve(HEADER_BYTES + frame.body.len());
        put_header(dst, &frame.header, frame.body.len());
        dst.extend_from_slice(&frame.body);
        Ok(())
    }
}
