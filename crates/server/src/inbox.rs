//! A connection's input: the buffer its requests arrive in and the wait for
//! more bytes, with the limits every port of a shard applies (the native
//! port, `conn.rs`, and the Redis port, `resp/conn.rs`).
//!
//! - A base buffer of `BASE_BUFFER_BYTES`; a unit (frame or command) larger
//!   than that first takes its size from the shard's `FrameBudget`, waiting
//!   for room until the unit's stall deadline, and the big buffer is given
//!   back as soon as the unit is consumed.
//! - A unit not completed within `stall_timeout` of its first byte ends the
//!   connection (`Wait::Stalled`); so does `idle_timeout` without a byte
//!   (`Wait::Idle`). An idle connection may be evicted at the connection
//!   limit (`Wait::Evicted`, see `shard.rs`).
//!
//! The caller says why in its own protocol before closing.

use std::rc::Rc;

use bytes::BytesMut;
use insitu_tls::Stream;
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, SemaphorePermit};
use tokio::time::Instant;

use crate::shard::ShardState;

/// Base buffer size (input and output): units up to this need no budget.
/// Small enough that the connection limit bounds base buffers (4,096 x 2 x
/// 64 KiB = 512 MiB at worst, touched pages far less), big enough to batch a
/// pipeline of point requests per syscall.
pub const BASE_BUFFER_BYTES: usize = 64 * 1024;

/// What waiting for bytes came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Wait {
    /// More bytes are in the buffer.
    Data,
    /// The peer closed its side.
    Eof,
    /// No byte within the idle timeout.
    Idle,
    /// Closed to make room for a new connection (it was the longest idle).
    Evicted,
    /// A unit was not completed within the stall timeout of its first byte.
    Stalled,
    /// No room in the shard's frame budget for the unit within its stall
    /// deadline (the need is in `Inbox::need`).
    NoRoom,
}

pub struct Inbox<'s> {
    /// Bytes received and not yet consumed.
    pub buf: BytesMut,
    /// Budget held for the big unit being received, if any.
    charge: Option<SemaphorePermit<'s>>,
    /// When the first byte of the unit being received arrived.
    started: Option<Instant>,
    /// When the last byte arrived (the idle timeout runs from it).
    last_active: Instant,
    /// Notified to close this connection while it waits idle.
    evict: Rc<Notify>,
    /// The size of the unit being waited for (for `Wait::NoRoom`'s message).
    pub need: usize,
}

impl<'s> Inbox<'s> {
    pub fn new() -> Inbox<'s> {
        Inbox {
            buf: BytesMut::with_capacity(BASE_BUFFER_BYTES),
            charge: None,
            started: None,
            last_active: Instant::now(),
            evict: Rc::new(Notify::new()),
            need: 0,
        }
    }

    /// At least one unit was taken from the buffer: the next one's stall
    /// clock starts now if its first bytes are here, else with its first byte.
    pub fn consumed(&mut self) {
        self.started = (!self.buf.is_empty()).then(Instant::now);
    }

    /// Make room for a unit of `need` bytes in all and wait for more bytes.
    pub async fn fill(
        &mut self,
        state: &'s ShardState,
        stream: &mut Stream,
        need: usize,
    ) -> std::io::Result<Wait> {
        let limits = &state.limits;
        self.need = need;
        if need <= BASE_BUFFER_BYTES {
            self.charge = None;
            if self.buf.capacity() > BASE_BUFFER_BYTES {
                self.buf = rebuffer(&self.buf, BASE_BUFFER_BYTES);
            }
        }
        if need > self.buf.capacity() {
            if need > BASE_BUFFER_BYTES && self.charge.is_none() {
                let deadline = self.started.unwrap_or_else(Instant::now) + limits.stall_timeout;
                match state.frame_budget.acquire(need, deadline).await {
                    Some(permit) => self.charge = Some(permit),
                    None => return Ok(Wait::NoRoom),
                }
            }
            // Exactly the unit's size, so reading never over-allocates.
            self.buf = rebuffer(&self.buf, need.max(BASE_BUFFER_BYTES));
        } else if self.buf.len() == self.buf.capacity() {
            // A split-off tail with no room left: a fresh base buffer.
            self.buf = rebuffer(&self.buf, BASE_BUFFER_BYTES);
        }
        debug_assert!(self.buf.capacity() > self.buf.len());

        // Wait for bytes: an idle connection until `idle_timeout` (and it may
        // be evicted), a partly received unit until its stall deadline.
        let idle = self.buf.is_empty();
        let deadline = match self.started {
            None => self.last_active + limits.idle_timeout,
            Some(t) => t + limits.stall_timeout,
        };
        let idle_stamp = idle.then(|| state.idle_register(self.evict.clone()));
        let read = tokio::select! {
            r = stream.read_buf(&mut self.buf) => Some(r),
            _ = tokio::time::sleep_until(deadline) => None,
            // Eviction took the stamp out of the idle list already.
            _ = self.evict.notified(), if idle => return Ok(Wait::Evicted),
        };
        if let Some(stamp) = idle_stamp {
            state.idle_unregister(stamp);
        }
        match read {
            None if idle => Ok(Wait::Idle),
            None => Ok(Wait::Stalled),
            Some(Ok(0)) => Ok(Wait::Eof),
            Some(Ok(_)) => {
                self.last_active = Instant::now();
                if self.started.is_none() {
                    self.started = Some(self.last_active);
                }
                Ok(Wait::Data)
            }
            Some(Err(e)) => Err(e),
        }
    }
}

/// A fresh buffer of `capacity` holding `buf`'s bytes (which must fit).
pub(crate) fn rebuffer(buf: &BytesMut, capacity: usize) -> BytesMut {
    assert!(buf.len() <= capacity, "rebuffer would drop bytes");
    let mut fresh = BytesMut::with_capacity(capacity);
    fresh.extend_from_slice(buf);
    fresh
}
