//! A connection's input: the buffer its requests arrive in and the wait for
//! more bytes, with the limits every listener applies (a shard's native
//! port, `conn.rs`, its Redis port, `resp/conn.rs`, and the backup port,
//! `backup_service.rs`; each is a `Port`).
//!
//! - A base buffer of `BASE_BUFFER_BYTES`; a unit (frame or command) larger
//!   than that first takes its size from the port's `FrameBudget`, waiting
//!   for room until the unit's stall deadline, and the big buffer is given
//!   back as soon as the unit is consumed. When a unit's known size grows
//!   (a Redis command learns its length one argument at a time) the charge
//!   is taken again for the new size: the budget always covers the buffer.
//! - A unit not completed within `stall_timeout` of its first byte ends the
//!   connection (`Wait::Stalled`); so does `idle_timeout` without a byte
//!   (`Wait::Idle`). An idle connection may be evicted at the connection
//!   limit (`Wait::Evicted`, see `shard.rs`).
//!
//! The caller says why in its own protocol before closing.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use bytes::BytesMut;
use insitu_tls::Stream;
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, SemaphorePermit};
use tokio::time::Instant;

use crate::limits::{ConnLimits, FrameBudget};

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
    /// No room in the port's frame budget for the unit within its stall
    /// deadline (the caller knows the size it asked `fill` for).
    NoRoom,
}

/// What a listener lends its connections' inboxes: a shard (both its ports)
/// or the backup port.
pub trait Port {
    fn limits(&self) -> &ConnLimits;
    /// Bytes of big units being received, shared by the port's connections.
    fn frame_budget(&self) -> &FrameBudget;
    /// The port's idle connections, which the connection limit evicts from.
    fn idle(&self) -> &IdleList;
}

/// A port's connections waiting idle, oldest first: the one to close when
/// the connection limit is reached. Notifying one closes it.
#[derive(Default)]
pub struct IdleList {
    /// By stamp; stamps grow, so the first entry is the longest idle.
    conns: RefCell<BTreeMap<u64, Rc<Notify>>>,
    next_stamp: Cell<u64>,
}

impl IdleList {
    /// Record a connection as idle; returns its stamp for `unregister`.
    pub fn register(&self, evict: Rc<Notify>) -> u64 {
        let stamp = self.next_stamp.get();
        self.next_stamp.set(stamp + 1);
        self.conns.borrow_mut().insert(stamp, evict);
        stamp
    }

    pub fn unregister(&self, stamp: u64) {
        self.conns.borrow_mut().remove(&stamp);
    }

    /// Close the longest-idle connection; false if none is idle.
    pub fn evict_oldest(&self) -> bool {
        match self.conns.borrow_mut().pop_first() {
            Some((_, evict)) => {
                // Stored as a permit if the connection is not polling right now.
                evict.notify_one();
                true
            }
            None => false,
        }
    }
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
    /// None: a unit's size is known whole from its start (a frame header),
    /// so a big buffer is made exactly that size. Some(most bytes a unit may
    /// take): the size is learned piece by piece (a Redis command, argument
    /// by argument), so a big buffer at least doubles what it holds each
    /// time it grows, up to this.
    growing: Option<usize>,
}

impl<'s> Inbox<'s> {
    /// For units whose whole size the first bytes tell (frames).
    pub fn new() -> Inbox<'s> {
        Inbox {
            buf: BytesMut::with_capacity(BASE_BUFFER_BYTES),
            charge: None,
            started: None,
            last_active: Instant::now(),
            evict: Rc::new(Notify::new()),
            growing: None,
        }
    }

    /// For units whose size is learned as they arrive, of at most
    /// `max_unit_bytes`. Why grow by doubling: a buffer made exactly each
    /// new need would be copied whole at every step (every argument of a
    /// Redis command, and every byte of an argument's header line, since a
    /// parser asks for one more byte), quadratic in the command's length,
    /// and would read one step's bytes per syscall.
    pub fn growing(max_unit_bytes: usize) -> Inbox<'s> {
        Inbox {
            growing: Some(max_unit_bytes),
            ..Inbox::new()
        }
    }

    /// The buffer to make for a unit that needs `need` bytes in all.
    fn size_for(&self, need: usize) -> usize {
        let size = match self.growing {
            None => need,
            Some(most) => need.max((2 * self.buf.len()).min(most)),
        };
        size.max(BASE_BUFFER_BYTES)
    }

    /// At least one unit was taken from the buffer: the next one's stall
    /// clock starts now if its first bytes are here, else with its first byte.
    pub fn consumed(&mut self) {
        self.started = (!self.buf.is_empty()).then(Instant::now);
    }

    /// Make room for a unit of `need` bytes in all and wait for more bytes.
    pub async fn fill<P: Port>(
        &mut self,
        port: &'s P,
        stream: &mut Stream,
        need: usize,
    ) -> std::io::Result<Wait> {
        let limits = port.limits();
        if need <= BASE_BUFFER_BYTES {
            self.charge = None;
            if self.buf.capacity() > BASE_BUFFER_BYTES {
                self.buf = rebuffer(&self.buf, BASE_BUFFER_BYTES);
            }
        }
        if need > self.buf.capacity() {
            let size = self.size_for(need);
            if size > BASE_BUFFER_BYTES {
                // The charge covers the buffer about to be made: a smaller
                // one held for this unit's earlier size is given back first
                // (it counts as room), then the new size is taken whole.
                self.charge = None;
                let deadline = self.started.unwrap_or_else(Instant::now) + limits.stall_timeout;
                match port.frame_budget().acquire(size, deadline).await {
                    Some(permit) => self.charge = Some(permit),
                    None => return Ok(Wait::NoRoom),
                }
            }
            // A frame's exact size, so reading never over-allocates (see
            // `size_for` for units that grow).
            self.buf = rebuffer(&self.buf, size);
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
        let idle_stamp = idle.then(|| port.idle().register(self.evict.clone()));
        let read = tokio::select! {
            r = stream.read_buf(&mut self.buf) => Some(r),
            _ = tokio::time::sleep_until(deadline) => None,
            // Eviction took the stamp out of the idle list already.
            _ = self.evict.notified(), if idle => return Ok(Wait::Evicted),
        };
        if let Some(stamp) = idle_stamp {
            port.idle().unregister(stamp);
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
