//! One client connection: read a frame, handle it, write the reply, repeat.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use insitu_protocol::{
    FrameCodec, FrameKind, HEADER_BYTES, ProtocolError, Response, Status, decode_request,
    encode_error, encode_response, frame::MAGIC,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::service::Coordinator;

/// A peer that does not read its replies cannot hold a connection task forever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// After a fatal framing error: how long / how much to drain before closing.
const DRAIN_TIME: Duration = Duration::from_secs(1);
const DRAIN_BYTES: usize = 1 << 20;

pub async fn serve(coordinator: Arc<Coordinator>, stream: TcpStream, shutdown: CancellationToken) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    stream.set_nodelay(true).ok();
    let (read_half, mut write_half) = stream.into_split();
    let mut frames = FramedRead::new(read_half, FrameCodec::default());
    let mut out = BytesMut::new();
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => break,
            next = frames.next() => next,
        };
        out.clear();
        let frame = match next {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(ProtocolError::Io(e))) => {
                debug!(%peer, "connection error: {e}");
                break;
            }
            Some(Err(e)) => {
                // The byte stream cannot be re-synchronized after a bad header:
                // say why, then close.
                warn!(%peer, "closing connection after a malformed frame: {e}");
                let request_id = peek_request_id(frames.read_buffer());
                encode_error(
                    &mut out,
                    request_id,
                    Status::BadRequest,
                    format!("malformed frame: {e}"),
                );
                if write(&mut write_half, &out).await {
                    let _ = tokio::time::timeout(WRITE_TIMEOUT, write_half.shutdown()).await;
                    // Closing with unread input would reset the connection and
                    // could destroy the reply before the peer reads it: drain a
                    // little first.
                    drain(frames.into_inner(), &shutdown).await;
                }
                return;
            }
        };
        let request_id = frame.header.request_id;
        if frame.header.kind != FrameKind::Request {
            encode_error(
                &mut out,
                request_id,
                Status::BadRequest,
                "expected a request frame",
            );
        } else {
            match decode_request(&frame.body) {
                Err(e) => {
                    debug!(%peer, "undecodable request: {e}");
                    encode_error(
                        &mut out,
                        request_id,
                        Status::BadRequest,
                        format!("cannot decode the request: {e}"),
                    );
                }
                Ok(request) => match coordinator.handle(request).await {
                    Ok(response) => encode_reply(&mut out, request_id, &response),
                    Err(reject) => {
                        encode_error(&mut out, request_id, reject.status, reject.message)
                    }
                },
            }
        }
        if !write(&mut write_half, &out).await {
            break;
        }
    }
    let _ = tokio::time::timeout(WRITE_TIMEOUT, write_half.shutdown()).await;
}

fn encode_reply(out: &mut BytesMut, request_id: u64, response: &Response<'_>) {
    if let Err(e) = encode_response(out, request_id, Status::Ok, response) {
        encode_error(
            out,
            request_id,
            Status::Internal,
            format!("cannot send the reply: {e}"),
        );
    }
}

/// Read and discard what the peer still sends, briefly and boundedly.
async fn drain(mut read_half: OwnedReadHalf, shutdown: &CancellationToken) {
    let mut scratch = vec![0u8; 16 * 1024];
    let mut left = DRAIN_BYTES;
    let deadline = tokio::time::sleep(DRAIN_TIME);
    tokio::pin!(deadline);
    while left > 0 {
        tokio::select! {
            _ = &mut deadline => return,
            _ = shutdown.cancelled() => return,
            n = read_half.read(&mut scratch) => match n {
                Ok(n) if n > 0 => left = left.saturating_sub(n),
                _ => return,
            },
        }
    }
}

async fn write(write_half: &mut OwnedWriteHalf, bytes: &[u8]) -> bool {
    matches!(
        tokio::time::timeout(WRITE_TIMEOUT, write_half.write_all(bytes)).await,
        Ok(Ok(()))
    )
}

/// The request id of a frame whose header was rejected, when the header at
/// least carries our magic (else 0).
fn peek_request_id(buf: &[u8]) -> u64 {
    if buf.len() < HEADER_BYTES || u16::from_le_bytes([buf[4], buf[5]]) != MAGIC {
        return 0;
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&buf[8..16]);
    u64::from_le_bytes(id)
}
