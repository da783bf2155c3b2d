//! One client connection: read whatever frames have arrived, answer each into
//! one output buffer, write it with a single syscall. Pipelined requests are
//! thereby batched for free.

use bytes::BytesMut;
use insitu_protocol::frame::{HEADER_BYTES, MAX_BODY_BYTES, check_header};
use insitu_protocol::{FrameKind, Status, encode_error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::handler;
use crate::shard::ShardState;

/// Read buffer start size; grows up to one max frame.
const READ_BUFFER_BYTES: usize = 64 * 1024;

pub async fn serve(mut stream: TcpStream, state: &ShardState) -> std::io::Result<()> {
    let mut rbuf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    let mut wbuf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    loop {
        if stream.read_buf(&mut rbuf).await? == 0 {
            return Ok(());
        }
        loop {
            let (header, body_len) = match check_header(&rbuf, MAX_BODY_BYTES) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    // The stream cannot be re-synchronised: say why, then close.
                    encode_error(
                        &mut wbuf,
                        0,
                        Status::BadRequest,
                        format!("malformed frame: {e}"),
                    );
                    stream.write_all(&wbuf).await?;
                    return Ok(());
                }
            };
            if rbuf.len() < HEADER_BYTES + body_len {
                rbuf.reserve(HEADER_BYTES + body_len - rbuf.len());
                break;
            }
            let frame = rbuf.split_to(HEADER_BYTES + body_len);
            let body = &frame[HEADER_BYTES..];
            if header.kind != FrameKind::Request {
                encode_error(
                    &mut wbuf,
                    header.request_id,
                    Status::BadRequest,
                    "expected a request frame",
                );
                continue;
            }
            handler::handle(state, header.request_id, body, &mut wbuf).await;
            // Don't let a long pipeline of big replies pile up unbounded.
            if wbuf.len() >= MAX_BODY_BYTES {
                stream.write_all(&wbuf).await?;
                wbuf.clear();
            }
        }
        if !wbuf.is_empty() {
            stream.write_all(&wbuf).await?;
            wbuf.clear();
        }
    }
}
