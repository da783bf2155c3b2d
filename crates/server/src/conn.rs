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

use std::time::Duration;

use bytes::BytesMut;
use insitu_protocol::frame::{HEADER_BYTES, MAX_BODY_BYTES, check_header};
use insitu_protocol::{FrameKind, Header, ProtocolError, Status, encode_error};
use insitu_tls::Stream;
use tokio::io::AsyncWriteExt;

use insitu_auth::Session;

use crate::handler;
use crate::inbox::{Inbox, Wait};
use crate::limits::{Closed, ConnLimits};
use crate::shard::ShardState;
use crate::stamped_batch::Batch;

pub use crate::inbox::BASE_BUFFER_BYTES;

pub async fn serve(mut stream: Stream, state: &ShardState) -> std::io::Result<Option<Closed>> {
    let limits = &state.limits;
    let mut inbox = Inbox::new();
    let mut wbuf = BytesMut::with_capacity(BASE_BUFFER_BYTES);
    // The log mark the replies in `wbuf` wait for (see `handler::Handled`).
    let mut need = 0u64;
    // What the connection authenticated as (see `insitu_auth::Gate`).
    let mut session = Session::default();
    // Plain writes held back to share one timestamp while snapshots are
    // read here (`stamped_batch.rs`): flushed before any other frame is
    // served and before replies are written, so replies keep their order.
    let mut batch = Batch::default();
    loop {
        // Answer every complete frame; learn the size of an incomplete one.
        let mut consumed = false;
        // Frames left before the next hint (`pipeline.rs`).
        let mut hinted = 0usize;
        let pending = loop {
            if hinted == 0 {
                hinted = crate::pipeline::hint_point_keys(state, &inbox.buf);
            }
            hinted = hinted.saturating_sub(1);
            let replied = wbuf.len();
            let (header, frame) = match split_frame(&mut inbox.buf, &mut wbuf) {
                Front::Frame(header, frame) => (header, frame),
                Front::Partial(total) => break total,
                Front::Malformed => {
                    // The held writes came first: their replies too.
                    let refusal = wbuf.split_off(replied);
                    flush(state, &mut batch, &mut wbuf, &mut need).await;
                    wbuf.extend_from_slice(&refusal);
                    replies_durable(state, &mut need).await?;
                    write(&mut stream, &wbuf, limits.stall_timeout).await?;
                    return Ok(None);
                }
            };
            consumed = true;
            let body = &frame[HEADER_BYTES..];
            if header.kind != FrameKind::Request {
                flush(state, &mut batch, &mut wbuf, &mut need).await;
                encode_error(
                    &mut wbuf,
                    header.request_id,
                    Status::BadRequest,
                    "expected a request frame",
                );
                continue;
            }
            let (id, out) = (header.request_id, &mut wbuf);
            let handled = handler::handle(state, &mut session, &mut batch, id, body, out).await;
            need = need.max(handled.need);
            if handled.close {
                // Refused at the gate: say why, then close (nothing after
                // this frame is read).
                replies_durable(state, &mut need).await?;
                write(&mut stream, &wbuf, limits.stall_timeout).await?;
                return Ok(Some(Closed::Unauthenticated));
            }
            // Don't let a long pipeline of big replies pile up unbounded.
            if wbuf.len() >= MAX_BODY_BYTES {
                replies_durable(state, &mut need).await?;
                write(&mut stream, &wbuf, limits.stall_timeout).await?;
                wbuf.clear();
            }
        };
        flush(state, &mut batch, &mut wbuf, &mut need).await;
        if !wbuf.is_empty() {
            replies_durable(state, &mut need).await?;
            write(&mut stream, &wbuf, limits.stall_timeout).await?;
            wbuf.clear();
        }
        if consumed {
            inbox.consumed();
        }
        // Give big buffers back once their frames are done.
        if wbuf.capacity() > BASE_BUFFER_BYTES {
            wbuf = BytesMut::with_capacity(BASE_BUFFER_BYTES);
        }
        let wait = inbox.fill(state, &mut stream, pending).await?;
        if let Some(end) =
            end_of_wait(wait, &mut stream, &mut wbuf, "server", pending, limits).await?
        {
            return Ok(end);
        }
    }
}

/// Apply and answer the held writes (`stamped_batch.rs`); their replies
/// show what they logged, so they wait for it (`need`).
async fn flush(state: &ShardState, batch: &mut Batch, wbuf: &mut BytesMut, need: &mut u64) {
    let mark = handler::flush_held(state, batch, wbuf).await;
    *need = (*need).max(mark);
}

/// After `Inbox::fill` on a port that speaks frames (a shard's, the backup
/// port): a wait that ends the connection for lack of room or a stalled
/// frame is first explained to the peer (`who` names the port). Returns
/// what `ended_by` says.
pub(crate) async fn end_of_wait(
    wait: Wait,
    stream: &mut Stream,
    wbuf: &mut BytesMut,
    who: &str,
    need: usize,
    limits: &ConnLimits,
) -> std::io::Result<Option<Option<Closed>>> {
    match wait {
        Wait::NoRoom => {
            no_room(wbuf, who, need, limits.stall_timeout);
            write(stream, wbuf, limits.stall_timeout).await?;
        }
        Wait::Stalled => {
            stalled_frame(wbuf, limits.stall_timeout);
            // The peer may be gone; the connection closes either way.
            let _ = write(stream, wbuf, limits.stall_timeout).await;
        }
        _ => {}
    }
    Ok(ended_by(&wait))
}

/// Whether `wait` (from `Inbox::fill`) ends the connection, and how: None,
/// it goes on; Some(what `serve` returns: None for the peer's EOF). The same
/// on every port, which only says why in its own protocol first.
pub(crate) fn ended_by(wait: &Wait) -> Option<Option<Closed>> {
    match wait {
        Wait::Data => None,
        Wait::Eof => Some(None),
        Wait::Idle => Some(Some(Closed::Idle)),
        Wait::Evicted => Some(Some(Closed::Evicted)),
        Wait::NoRoom => Some(Some(Closed::NoRoom)),
        Wait::Stalled => Some(Some(Closed::Stalled)),
    }
}

/// What `split_frame` found at the front of a connection's input.
pub(crate) enum Front {
    /// A whole frame, taken off the input: its header and its bytes (the
    /// header's included).
    Frame(Header, BytesMut),
    /// Part of one: how many bytes the whole frame takes (a header at least).
    Partial(usize),
    /// Bytes that are not a frame header: the stream cannot be
    /// re-synchronised, so the reply saying why is in the output and the
    /// connection closes once it is written.
    Malformed,
}

/// Take the next whole frame off `input` (or reply into `out` to bytes that
/// are not one): one framing for the shard port and the backup port.
pub(crate) fn split_frame(input: &mut BytesMut, out: &mut BytesMut) -> Front {
    let (header, body_len) = match check_header(input, MAX_BODY_BYTES) {
        Ok(Some(h)) => h,
        Ok(None) => return Front::Partial(HEADER_BYTES),
        Err(e) => {
            malformed_frame(out, &e);
            return Front::Malformed;
        }
    };
    let total = HEADER_BYTES + body_len;
    if input.len() < total {
        return Front::Partial(total);
    }
    Front::Frame(header, input.split_to(total))
}

/// The reply to bytes that are not a frame header, before the connection
/// closes: one wording for the shard port and the backup port.
pub(crate) fn malformed_frame(out: &mut BytesMut, e: &ProtocolError) {
    encode_error(out, 0, Status::BadRequest, format!("malformed frame: {e}"));
}

/// The reply when no room in the frame budget came for a `need`-byte frame
/// by its stall deadline, before the connection closes: one wording for both
/// frame ports, `who` naming which one is busy ("server", "backup").
pub(crate) fn no_room(out: &mut BytesMut, who: &str, need: usize, stall_timeout: Duration) {
    let ms = stall_timeout.as_millis();
    let message =
        format!("{who} busy: no room to buffer a {need}-byte frame within {ms} ms; closing");
    encode_error(out, 0, Status::Retry, message);
}

/// The reply to a frame not completed within `stall_timeout` of its first
/// byte, before the connection closes: one wording for both frame ports.
pub(crate) fn stalled_frame(out: &mut BytesMut, stall_timeout: Duration) {
    let ms = stall_timeout.as_millis();
    let message = format!("frame not completed within {ms} ms; closing");
    encode_error(out, 0, Status::BadRequest, message);
}

/// Before replies leave: wait until the engine's changes up to `need`
/// (reset here; the largest of the buffered replies' marks, see
/// `handler::Handled`) are held by R backups (group commit: all connections
/// of the shard wait on the same rounds). Reads wait too, since a reply may
/// show a write that is not yet durable. With R = 0, or `need` already
/// durable (0: the replies show nothing), this is one compare.
#[inline]
pub(crate) async fn replies_durable(state: &ShardState, need: &mut u64) -> std::io::Result<()> {
    let target = std::mem::take(need);
    if !state.repl.behind(target) {
        return Ok(());
    }
    state.repl.wait_durable(target).await.map_err(|_| {
        std::io::Error::other("the server was declared dead by the coordinator; closing")
    })
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
