//! insitu's wire protocol. The only crate that knows the bytes on the wire.
//!
//! A frame is a fixed little-endian header followed by a postcard body (see
//! `frame`). Requests and responses are the enums in `message`. Everyone
//! else calls `encode_*` / `decode_*` and never touches bytes directly.

pub mod conn_limits;
pub mod frame;
pub mod json_path;
pub mod limits;
pub mod message;
pub mod parts;
pub mod plan;
pub mod query;
pub mod schema;
pub mod txn;

use bytes::{BufMut, BytesMut};
use serde::{Deserialize, Serialize};

pub use frame::{Frame, FrameCodec, FrameKind, HEADER_BYTES, Header, MAX_BODY_BYTES};
pub use limits::{
    MAX_BACKUP_OPS, MAX_DIGEST_SEGMENTS, MAX_LOG_DIGESTS, MAX_MULTI_ITEMS, MAX_REPLICA_INFOS,
    MAX_SHARD_ADDRS,
};
pub use message::*;
pub use parts::encode_request_parts;

/// Outcome of a request (frame header) or of one object in a multi-operation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    Ok = 0,
    /// This shard does not own the key's tablet: refresh the tablet map.
    UnknownTablet = 1,
    ObjectDoesntExist = 2,
    ObjectExists = 3,
    WrongVersion = 4,
    OutOfMemory = 5,
    /// The request could not be decoded or is not valid.
    BadRequest = 6,
    KeyTooLarge = 7,
    ValueTooLarge = 8,
    NotANumber = 9,
    /// Temporarily unavailable (tablet moving): retry shortly.
    Retry = 10,
    UnknownTable = 11,
    TableExists = 12,
    NoServers = 13,
    Internal = 14,
    /// Not processed because the reply would have overflowed the frame.
    Truncated = 15,
    EmptyKey = 16,
    UnknownServer = 17,
    /// The request's map version does not match the tablet's.
    StaleMap = 18,
    /// A backup refuses a master that the coordinator declared dead.
    Fenced = 19,
    /// A backup has no room for the replica (disk budget or disk full).
    NoSpace = 20,
    /// The tablet's objects were lost (its server died with no replicas,
    /// R = 0) and an operator has not acknowledged it yet.
    DataLost = 21,
    /// A paged query's held pages are gone (expired or evicted): run that
    /// tablet's query again from its start.
    CursorExpired = 22,
    /// A transaction did not commit: a key it read changed, or another
    /// transaction holds one of its keys. Run it again.
    Conflict = 23,
    /// The connection has not presented a token this cluster accepts (or
    /// presented a wrong one): it is closed after this reply.
    Unauthenticated = 24,
    /// A cluster-internal request (tablet control, enlistment, replication)
    /// from a connection that authenticated with a client token.
    Forbidden = 25,
    /// A snapshot read's timestamp is older than the versions the shard
    /// keeps (or the shard has just started keeping them): take a new
    /// timestamp and run the whole operation again.
    SnapshotTooOld = 26,
}

impl Status {
    pub fn from_u16(v: u16) -> Option<Status> {
        use Status::*;
        const ALL: [Status; 27] = [
            Ok,
            UnknownTablet,
            ObjectDoesntExist,
            ObjectExists,
            WrongVersion,
            OutOfMemory,
            BadRequest,
            KeyTooLarge,
            ValueTooLarge,
            NotANumber,
            Retry,
            UnknownTable,
            TableExists,
            NoServers,
            Internal,
            Truncated,
            EmptyKey,
            UnknownServer,
            StaleMap,
            Fenced,
            NoSpace,
            DataLost,
            CursorExpired,
            Conflict,
            Unauthenticated,
            Forbidden,
            SnapshotTooOld,
        ];
        ALL.get(v as usize).copied().filter(|s| *s as u16 == v)
    }

    pub fn is_ok(self) -> bool {
        self == Status::Ok
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Status::Ok => "ok",
            Status::UnknownTablet => "this server does not own the key's tablet",
            Status::ObjectDoesntExist => "object does not exist",
            Status::ObjectExists => "object exists",
            Status::WrongVersion => "version check failed",
            Status::OutOfMemory => "out of memory",
            Status::BadRequest => "bad request",
            Status::KeyTooLarge => "key too large",
            Status::ValueTooLarge => "value too large",
            Status::NotANumber => "value is not an 8-byte number",
            Status::Retry => "temporarily unavailable, retry",
            Status::UnknownTable => "unknown table",
            Status::TableExists => "table exists",
            Status::NoServers => "no storage servers have enlisted",
            Status::Internal => "internal error",
            Status::Truncated => "not processed: reply full, ask again",
            Status::EmptyKey => "empty key",
            Status::UnknownServer => "unknown server",
            Status::StaleMap => "stale tablet map",
            Status::Fenced => "this master was declared dead; its writes are refused",
            Status::NoSpace => "the backup has no room for the replica",
            Status::DataLost => {
                "the tablet's objects were lost, or some are missing from its replicas"
            }
            Status::CursorExpired => "the query's held pages expired; run it again",
            Status::Conflict => "transaction conflict: it did not commit; run it again",
            Status::Unauthenticated => "authentication failed",
            Status::Forbidden => {
                "forbidden: a cluster-internal request needs the cluster credential"
            }
            Status::SnapshotTooOld => {
                "the snapshot is older than the versions kept; take a new one and run again"
            }
        };
        f.write_str(s)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("bad frame magic {0:#06x}: not an insitu peer")]
    BadMagic(u16),
    #[error("bad frame kind {0}")]
    BadKind(u8),
    #[error("bad status code {0}")]
    BadStatus(u16),
    #[error("frame body of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge { len: usize, max: usize },
    #[error("malformed message body: {0}")]
    Malformed(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Append a whole frame carrying `message` to `dst`.
/// On error (`FrameTooLarge`), `dst` is left as it was.
pub fn encode<T: Serialize>(
    dst: &mut BytesMut,
    kind: FrameKind,
    request_id: u64,
    status: Status,
    message: &T,
) -> Result<(), ProtocolError> {
    let start = dst.len();
    frame::put_header(
        dst,
        &Header {
            kind,
            request_id,
            status,
        },
        0,
    );
    let result = postcard::to_io(message, (&mut *dst).writer()).map(|_| ());
    let body_len = dst.len() - start - HEADER_BYTES;
    if let Err(e) = result {
        dst.truncate(start);
        return Err(ProtocolError::Malformed(e.to_string()));
    }
    if body_len > MAX_BODY_BYTES {
        dst.truncate(start);
        return Err(ProtocolError::FrameTooLarge {
            len: body_len,
            max: MAX_BODY_BYTES,
        });
    }
    dst[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    Ok(())
}

/// Encoded size of a message body, for callers that split batches to fit a frame.
pub fn encoded_len<T: Serialize>(message: &T) -> usize {
    postcard::experimental::serialized_size(message).unwrap_or(usize::MAX)
}

pub fn encode_request(
    dst: &mut BytesMut,
    request_id: u64,
    request: &Request<'_>,
) -> Result<(), ProtocolError> {
    encode(dst, FrameKind::Request, request_id, Status::Ok, request)
}

pub fn encode_response(
    dst: &mut BytesMut,
    request_id: u64,
    status: Status,
    response: &Response<'_>,
) -> Result<(), ProtocolError> {
    encode(dst, FrameKind::Response, request_id, status, response)
}

/// Encode an error reply: header status `status`, body `Response::Error`.
pub fn encode_error(
    dst: &mut BytesMut,
    request_id: u64,
    status: Status,
    message: impl Into<String>,
) {
    debug_assert!(status != Status::Ok);
    let mut message: String = message.into();
    // An error message never needs to be large; bound it so this cannot fail.
    if message.len() > 4096 {
        let mut cut = 4096;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    encode_response(dst, request_id, status, &Response::Error { message })
        .expect("a bounded error message always fits a frame");
}

fn decode_whole<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ProtocolError> {
    limits::clear_violation();
    let (value, rest) = postcard::take_from_bytes(body).map_err(|e| {
        // A limit refused a sequence before it was built: say which.
        ProtocolError::Malformed(limits::take_violation().unwrap_or_else(|| e.to_string()))
    })?;
    if !rest.is_empty() {
        return Err(ProtocolError::Malformed(format!(
            "{} trailing bytes after the message",
            rest.len()
        )));
    }
    Ok(value)
}

pub fn decode_request(body: &[u8]) -> Result<Request<'_>, ProtocolError> {
    decode_whole(body)
}

pub fn decode_response(body: &[u8]) -> Result<Response<'_>, ProtocolError> {
    decode_whole(body)
}
