//! One client connection: read a frame, handle it, write the reply, repeat.
//!
//! Frames are cut by the protocol's `FrameCodec`. Bounded like a storage
//! shard's connections (see `ConnLimits`): a frame bigger than the base
//! buffer first takes its size from the coordinator's frame budget (waiting
//! until the frame's stall deadline, then closing with an error) and its
//! buffer is dropped once the frame is handled; a frame not completed within
//! `stall_timeout` of its first byte, a reply not taken within it, and a
//! connection silent for `idle_timeout` are closed. At the connection limit
//! the accept loop closes the longest-idle connection (`Shared::evict_oldest_idle`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
// The same connection limits as a storage server's shards.
pub use insitu_protocol::conn_limits::ConnLimits;
use insitu_protocol::conn_limits::MAX_FRAME_BYTES;
use insitu_protocol::frame::{MAX_BODY_BYTES, request_id_of};
use insitu_protocol::{
    FrameCodec, FrameKind, HEADER_BYTES, ProtocolError, Response, Status, decode_request,
    encode_error, encode_response,
};
use insitu_tls::{ReadHalf, Stream, WriteHalf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use insitu_auth::{Admission, Gate, Session};

use crate::service::Coordinator;

/// After a fatal framing error: how long / how much to drain before closing.
const DRAIN_TIME: Duration = Duration::from_secs(1);
const DRAIN_BYTES: usize = 1 << 20;
/// Input buffer every connection has; frames up to this need no budget.
/// Metadata requests are small, so 8 KiB covers nearly all of them.
const BASE_BUFFER_BYTES: usize = 8 * 1024;
/// The frame budget when `ConnLimits::frame_budget_bytes` is 0 (its
/// default). 16 MiB: metadata frames are small; this still lets a few big
/// ones (a large Enlist, say) arrive together.
const DEFAULT_FRAME_BUDGET_BYTES: usize = 16 << 20;

/// What every connection of the coordinator shares.
pub struct Shared {
    pub limits: ConnLimits,
    /// Who may connect and send what (`insitu_auth`).
    gate: Gate,
    /// Bytes of big frames being received (permits = bytes).
    budget: Semaphore,
    /// Idle connections by stamp, oldest first; notifying one closes it.
    idle: Mutex<BTreeMap<u64, Arc<Notify>>>,
    /// Next idle stamp (grows, so the first idle entry is the oldest).
    next_stamp: AtomicU64,
}

impl Shared {
    pub fn new(mut limits: ConnLimits, gate: Gate) -> anyhow::Result<Shared> {
        if limits.frame_budget_bytes == 0 {
            limits.frame_budget_bytes = DEFAULT_FRAME_BUDGET_BYTES;
        }
        anyhow::ensure!(
            limits.max_connections > 0,
            "the connection limit must be at least 1"
        );
        anyhow::ensure!(
            (MAX_FRAME_BYTES..=u32::MAX as usize).contains(&limits.frame_budget_bytes),
            "the frame budget must hold one max-size frame ({MAX_FRAME_BYTES} bytes), got {}",
            limits.frame_budget_bytes
        );
        Ok(Shared {
            gate,
            budget: Semaphore::new(limits.frame_budget_bytes),
            limits,
            idle: Mutex::new(BTreeMap::new()),
            next_stamp: AtomicU64::new(0),
        })
    }

    /// Bytes currently held by partly received big frames.
    pub fn buffered_frame_bytes(&self) -> usize {
        self.limits.frame_budget_bytes - self.budget.available_permits()
    }

    /// Close the longest-idle connection; false if none is idle.
    pub fn evict_oldest_idle(&self) -> bool {
        let oldest = self.idle.lock().ok().and_then(|mut m| m.pop_first());
        match oldest {
            Some((_, evict)) => {
                evict.notify_one();
                true
            }
            None => false,
        }
    }

    fn idle_register(&self, evict: Arc<Notify>) -> u64 {
        let stamp = self.next_stamp.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = self.idle.lock() {
            m.insert(stamp, evict);
        }
        stamp
    }

    fn idle_unregister(&self, stamp: u64) {
        if let Ok(mut m) = self.idle.lock() {
            m.remove(&stamp);
        }
    }

    async fn acquire(&self, bytes: usize, deadline: Instant) -> Option<SemaphorePermit<'_>> {
        let n = u32::try_from(bytes).ok()?;
        match tokio::time::timeout_at(deadline, self.budget.acquire_many(n)).await {
            Ok(Ok(p)) => Some(p),
            _ => None,
        }
    }
}

/// How reading the next frame ended, when it did not yield one.
enum Stop {
    Closed,
    Shutdown,
    Idle,
    Evicted,
    Stalled,
    NoRoom(usize),
    Bad(ProtocolError),
    Io(std::io::Error),
}

/// The reading side of a connection: the codec, its buffer, the budget held.
struct Reader<'s> {
    half: ReadHalf,
    codec: FrameCodec,
    buf: BytesMut,
    shared: &'s Shared,
    charge: Option<SemaphorePermit<'s>>,
    frame_started: Option<Instant>,
    last_active: Instant,
    evict: Arc<Notify>,
}

impl<'s> Reader<'s> {
    async fn next(&mut self, shutdown: &CancellationToken) -> Result<insitu_protocol::Frame, Stop> {
        let limits = &self.shared.limits;
        // The previous frame was handled and dropped: its budget is free.
        self.charge = None;
        loop {
            // Room for the frame being received: a big one takes budget first.
            let need = match insitu_protocol::frame::check_header(&self.buf, MAX_BODY_BYTES) {
                Ok(Some((_, body_len))) => HEADER_BYTES + body_len,
                _ => HEADER_BYTES,
            };
            if need > BASE_BUFFER_BYTES && self.charge.is_none() && self.buf.len() < need {
                let deadline =
                    self.frame_started.unwrap_or_else(Instant::now) + limits.stall_timeout;
                match self.shared.acquire(need, deadline).await {
                    Some(p) => self.charge = Some(p),
                    None => return Err(Stop::NoRoom(need)),
                }
            }
            match self.codec.decode(&mut self.buf) {
                Ok(Some(frame)) => {
                    // The frame holds its bytes (and the budget, until the next
                    // call); the buffer goes back to its base size.
                    if self.buf.capacity() > BASE_BUFFER_BYTES {
                        let mut fresh =
                            BytesMut::with_capacity(BASE_BUFFER_BYTES.max(self.buf.len()));
                        fresh.extend_from_slice(&self.buf);
                        self.buf = fresh;
                    }
                    self.frame_started = (!self.buf.is_empty()).then(Instant::now);
                    return Ok(frame);
                }
                Ok(None) => {}
                Err(e) => return Err(Stop::Bad(e)),
            }
            let idle = self.buf.is_empty();
            let deadline = match self.frame_started {
                None => self.last_active + limits.idle_timeout,
                Some(t) => t + limits.stall_timeout,
            };
            let stamp = idle.then(|| self.shared.idle_register(self.evict.clone()));
            let read = tokio::select! {
                _ = shutdown.cancelled() => Err(Stop::Shutdown),
                r = self.half.read_buf(&mut self.buf) => Ok(r),
                _ = tokio::time::sleep_until(deadline) => Err(if idle { Stop::Idle } else { Stop::Stalled }),
                _ = self.evict.notified(), if idle => Err(Stop::Evicted),
            };
            if let Some(stamp) = stamp {
                self.shared.idle_unregister(stamp);
            }
            match read? {
                Ok(0) => return Err(Stop::Closed),
                Ok(_) => {
                    self.last_active = Instant::now();
                    if self.frame_started.is_none() {
                        self.frame_started = Some(self.last_active);
                    }
                }
                Err(e) => return Err(Stop::Io(e)),
            }
        }
    }
}

pub async fn serve(
    coordinator: Arc<Coordinator>,
    shared: Arc<Shared>,
    stream: Stream,
    shutdown: CancellationToken,
) {
    let peer = stream
        .tcp()
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    stream.tcp().set_nodelay(true).ok();
    let (read_half, mut write_half) = stream.into_split();
    let stall = shared.limits.stall_timeout;
    let mut reader = Reader {
        half: read_half,
        codec: FrameCodec::default(),
        buf: BytesMut::with_capacity(BASE_BUFFER_BYTES),
        shared: &shared,
        charge: None,
        frame_started: None,
        last_active: Instant::now(),
        evict: Arc::new(Notify::new()),
    };
    let mut out = BytesMut::new();
    // What the connection authenticated as (see `insitu_auth::Gate`).
    let mut session = Session::default();
    loop {
        out.clear();
        let frame = match reader.next(&shutdown).await {
            Ok(frame) => frame,
            Err(Stop::Closed | Stop::Shutdown) => break,
            Err(Stop::Io(e)) => {
                debug!(%peer, "connection error: {e}");
                break;
            }
            Err(Stop::Idle) => {
                debug!(%peer, "closing an idle connection");
                break;
            }
            Err(Stop::Evicted) => {
                debug!(%peer, "closing the longest-idle connection: the connection limit was reached");
                break;
            }
            Err(Stop::Stalled) => {
                debug!(%peer, "closing a connection whose frame did not complete");
                let message = format!(
                    "frame not completed within {} ms; closing",
                    stall.as_millis()
                );
                encode_error(&mut out, 0, Status::BadRequest, message);
                let _ = write(&mut write_half, &out, stall).await;
                break;
            }
            Err(Stop::NoRoom(need)) => {
                warn!(%peer, "no room to buffer a {need}-byte frame; closing");
                let message = format!(
                    "coordinator busy: no room to buffer a {need}-byte frame within {} ms; closing",
                    stall.as_millis()
                );
                encode_error(&mut out, 0, Status::Retry, message);
                let _ = write(&mut write_half, &out, stall).await;
                break;
            }
            Err(Stop::Bad(e)) => {
                // The byte stream cannot be re-synchronized after a bad header:
                // say why, then close.
                warn!(%peer, "closing connection after a malformed frame: {e}");
                let request_id = request_id_of(&reader.buf).unwrap_or(0);
                encode_error(
                    &mut out,
                    request_id,
                    Status::BadRequest,
                    format!("malformed frame: {e}"),
                );
                if write(&mut write_half, &out, stall).await {
                    let _ = tokio::time::timeout(stall, write_half.shutdown()).await;
                    // Closing with unread input would reset the connection and
                    // could destroy the reply before the peer reads it: drain a
                    // little first.
                    drain(reader.half, &shutdown).await;
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
                Ok(request) => match shared.gate.admit(&mut session, &request) {
                    Admission::Proceed => {
                        let kind = request.name();
                        let started = Instant::now();
                        let handled = coordinator.handle(request).await;
                        crate::metrics::record(kind, handled.as_ref().err(), started.elapsed());
                        match handled {
                            Ok(response) => encode_reply(&mut out, request_id, &response),
                            Err(reject) => {
                                encode_error(&mut out, request_id, reject.status, reject.message)
                            }
                        }
                    }
                    Admission::Welcome { member } => {
                        encode_reply(&mut out, request_id, &Response::Welcome { member })
                    }
                    Admission::Refuse {
                        status,
                        message,
                        close,
                    } => {
                        let refusal = crate::service::Reject::new(status, "");
                        crate::metrics::record(request.name(), Some(&refusal), Duration::ZERO);
                        encode_error(&mut out, request_id, status, message);
                        if close {
                            debug!(%peer, "closing an unauthenticated connection");
                            let _ = write(&mut write_half, &out, stall).await;
                            break;
                        }
                    }
                },
            }
        }
        drop(frame);
        if !write(&mut write_half, &out, stall).await {
            break;
        }
        // Replies can be big (a table map); don't keep that memory while idle.
        if out.capacity() > BASE_BUFFER_BYTES {
            out = BytesMut::new();
        }
    }
    let _ = tokio::time::timeout(stall, write_half.shutdown()).await;
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
async fn drain(mut read_half: ReadHalf, shutdown: &CancellationToken) {
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

/// Write and flush (TLS may hold records back); false if the peer did not
/// take `bytes` within `timeout`.
async fn write(write_half: &mut WriteHalf, bytes: &[u8], timeout: Duration) -> bool {
    let all = async {
        write_half.write_all(bytes).await?;
        write_half.flush().await
    };
    matches!(tokio::time::timeout(timeout, all).await, Ok(Ok(())))
}
