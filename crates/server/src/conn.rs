//! One client connection: read whatever frames have arrived, answer each into
//! one output buffer, write it with a single syscall. Pipelined requests are
//! thereby batched for free.
//!
//! Bounded (see `ConnLimits`): a connection keeps a small base buffer; a frame
//! larger than that first takes its size from the shard's `FrameBudget`
//! (waiting for room until the frame's stall deadline, then closing with an
//! error), and the big buffer is returned as soon as the frame is handled. A
//! frame that does not complete within `stall_timeout` of its first byte,
//! and a reply the peer does not read within it, close the connection; so does
//! `idle_timeout` without a byte. At the connection limit the shard closes the
//! longest-idle connection to make room (`shard.rs`).
//!
//! Replies leave only once the shard's changes are held by R backups
//! (`replies_durable`, see `replicate`).

use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use insitu_protocol::frame::{HEADER_BYTES, MAX_BODY_BYTES, check_header};
use insitu_protocol::{FrameKind, Status, encode_error};
use insitu_tls::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::time::Instant;

use insitu_auth::Session;

use crate::handler;
use crate::limits::Closed;
use crate::shard::ShardState;

/// Base buffer size (input and output): frames up to this need no budget.
/// Small enough that the connection limit bounds base buffers (4,096 x 2 x
/// 64 KiB = 512 MiB at worst, touched pages far less), big enough to batch a
/// pipeline of point requests per syscall.
pub const BASE_BUFFER_BYTES: usize = 64 * 1024;

pub async fn serve(mut stream: Stream, state: &ShardState) -> std::io::Result<Option<Closed>> {
    let limits = &state.limits;
    let mut rbuf = BytesMut::with_capacity(BASE_BUFFER_BYTES);
    let mut wbuf = BytesMut::with_capacity(BASE_BUFFER_BYTES);
    // Budget held for the big frame being received, if any.
    let mut charge: Option<tokio::sync::SemaphorePermit<'_>> = None;
    // When the first byte of the frame being received arrived.
    let mut frame_started: Option<Instant> = None;
    let mut last_active = Instant::now();
    let evict = Rc::new(Notify::new());
    // Whether a reply in `wbuf` may show data (see `handler::handle`).
    let mut exposes = false;
    // What the connection authenticated as (see `insitu_auth::Gate`).
    let mut session = Session::default();
    loop {
        // Answer every complete frame; learn the size of an incomplete one.
        let mut pending: Option<usize> = None;
        let mut consumed = false;
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
                    replies_durable(state, &mut exposes).await?;
                    write(&mut stream, &wbuf, limits.stall_timeout).await?;
                    return Ok(None);
                }
            };
            let total = HEADER_BYTES + body_len;
            if rbuf.len() < total {
                pending = Some(total);
                break;
            }
            let frame = rbuf.split_to(total);
            consumed = true;
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
            let handled =
                handler::handle(state, &mut session, header.request_id, body, &mut wbuf).await;
            exposes |= handled.exposes;
            if handled.close {
                // Refused at the gate: say why, then close (nothing after
                // this frame is read).
                replies_durable(state, &mut exposes).await?;
                write(&mut stream, &wbuf, limits.stall_timeout).await?;
                return Ok(Some(Closed::Unauthenticated));
            }
            // Don't let a long pipeline of big replies pile up unbounded.
            if wbuf.len() >= MAX_BODY_BYTES {
                replies_durable(state, &mut exposes).await?;
                write(&mut stream, &wbuf, limits.stall_timeout).await?;
                wbuf.clear();
            }
        }
        if !wbuf.is_empty() {
            replies_durable(state, &mut exposes).await?;
            write(&mut stream, &wbuf, limits.stall_timeout).await?;
            wbuf.clear();
        }
        if consumed {
            // The next frame's clock starts now (or with its first byte).
            frame_started = (!rbuf.is_empty()).then(Instant::now);
        }
        // Give big buffers back once their frames are done.
        if wbuf.capacity() > BASE_BUFFER_BYTES {
            wbuf = BytesMut::with_capacity(BASE_BUFFER_BYTES);
        }
        let need = pending.unwrap_or(HEADER_BYTES);
        if need <= BASE_BUFFER_BYTES {
            charge = None;
            if rbuf.capacity() > BASE_BUFFER_BYTES {
                rbuf = rebuffer(&rbuf, BASE_BUFFER_BYTES);
            }
        }
        if need > rbuf.capacity() {
            if need > BASE_BUFFER_BYTES && charge.is_none() {
                let deadline = frame_started.unwrap_or_else(Instant::now) + limits.stall_timeout;
                match state.frame_budget.acquire(need, deadline).await {
                    Some(permit) => charge = Some(permit),
                    None => {
                        encode_error(
                            &mut wbuf,
                            0,
                            Status::Retry,
                            format!(
                                "server busy: no room to buffer a {need}-byte frame within {} ms; closing",
                                limits.stall_timeout.as_millis()
                            ),
                        );
                        write(&mut stream, &wbuf, limits.stall_timeout).await?;
                        return Ok(Some(Closed::NoRoom));
                    }
                }
            }
            // Exactly the frame's size, so reading never over-allocates.
            rbuf = rebuffer(&rbuf, need.max(BASE_BUFFER_BYTES));
        } else if rbuf.len() == rbuf.capacity() {
            // A split-off tail with no room left: a fresh base buffer.
            rbuf = rebuffer(&rbuf, BASE_BUFFER_BYTES);
        }
        debug_assert!(rbuf.capacity() > rbuf.len());

        // Wait for bytes: an idle connection until `idle_timeout` (and it may
        // be evicted), a partly received frame until its stall deadline.
        let idle = rbuf.is_empty();
        let deadline = match frame_started {
            None => last_active + limits.idle_timeout,
            Some(t) => t + limits.stall_timeout,
        };
        let idle_stamp = idle.then(|| state.idle_register(evict.clone()));
        let read = tokio::select! {
            r = stream.read_buf(&mut rbuf) => Some(r),
            _ = tokio::time::sleep_until(deadline) => None,
            _ = evict.notified(), if idle => {
                return Ok(Some(Closed::Evicted));
            }
        };
        if let Some(stamp) = idle_stamp {
            state.idle_unregister(stamp);
        }
        match read {
            None if idle => return Ok(Some(Closed::Idle)),
            None => {
                encode_error(
                    &mut wbuf,
                    0,
                    Status::BadRequest,
                    format!(
                        "frame not completed within {} ms; closing",
                        limits.stall_timeout.as_millis()
                    ),
                );
                let _ = write(&mut stream, &wbuf, limits.stall_timeout).await;
                return Ok(Some(Closed::Stalled));
            }
            Some(Ok(0)) => return Ok(None),
            Some(Ok(_)) => {
                last_active = Instant::now();
                if frame_started.is_none() {
                    frame_started = Some(last_active);
                }
            }
            Some(Err(e)) => return Err(e),
        }
    }
}

/// Before replies leave: wait until every change the engine has made so far
/// is held by R backups (group commit: all connections of the shard wait on
/// the same round). Reads wait too, since a reply may show a write that is
/// not yet durable. With R = 0 (or nothing new) this is one compare.
/// `exposes` (reset here): whether the buffered replies may show data.
#[inline]
pub(crate) async fn replies_durable(state: &ShardState, exposes: &mut bool) -> std::io::Result<()> {
    if !std::mem::take(exposes) {
        return Ok(());
    }
    let changes = state.engine.borrow().log_changes();
    if !state.repl.behind(changes) {
        return Ok(());
    }
    state.repl.wait_durable(changes).await.map_err(|_| {
        std::io::Error::other("the server was declared dead by the coordinator; closing")
    })
}

/// A fresh buffer of `capacity` holding `buf`'s bytes (which must fit).
pub(crate) fn rebuffer(buf: &BytesMut, capacity: usize) -> BytesMut {
    assert!(buf.len() <= capacity, "rebuffer would drop bytes");
    let mut fresh = BytesMut::with_capacity(capacity);
    fresh.extend_from_slice(buf);
    fresh
}

/// Write all of `bytes`, or fail if the peer does not take them in `timeout`.
/// Flushed, so a TLS stream holds back no records (free on plain TCP).
pub(crate) async fn write(
    stream: &mut Stream,
    bytes: &[u8],
    timeout: Duration,
) -> std::io::Result<()> {
    let all = async {
        stream.write_all(bytes).await?;
        stream.flush().await
    };
    match tokio::time::timeout(timeout, all).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "peer did not read its replies within {} ms",
                timeout.as_millis()
            ),
        )),
    }
}
