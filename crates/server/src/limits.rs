//! Connection limits of a shard: how many connections, how long one may stay
//! idle or leave a frame unfinished, and how many bytes of partly received
//! big frames the shard buffers in total.

use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use insitu_protocol::frame::{HEADER_BYTES, MAX_BODY_BYTES};

/// One max-size frame, header included.
pub const MAX_FRAME_BYTES: usize = HEADER_BYTES + MAX_BODY_BYTES;

#[derive(Clone, Debug)]
pub struct ConnLimits {
    /// Connections one shard serves at once. At the limit the longest-idle
    /// connection is closed to admit a new one (so idle sockets can never lock
    /// out clients or the cluster's own calls); only when none is idle is the
    /// new one refused.
    pub max_connections: usize,
    /// Bytes of partly received frames bigger than a connection's base buffer
    /// one shard holds at once. 0 = the default (see `ServerConfig`).
    pub frame_budget_bytes: usize,
    /// A connection without a byte for this long is closed. 300 s: far longer
    /// than any client's pause between requests (clients reconnect anyway),
    /// short enough that abandoned sockets free their slot within minutes.
    pub idle_timeout: Duration,
    /// A frame must complete within this of its first byte, and a reply must be
    /// taken by the peer within it. 10 s: a 4 MiB frame then needs only
    /// ~3.4 Mbit/s, while a stalled peer holds its buffer for seconds, not forever.
    pub stall_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: 4096,
            frame_budget_bytes: 0,
            idle_timeout: Duration::from_secs(300),
            stall_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a connection was closed by the shard, for the log.
#[derive(Debug)]
pub enum Closed {
    Idle,
    Stalled,
    Evicted,
    NoRoom,
    /// Bytes that are not the protocol (RESP: the stream cannot be re-synchronised).
    Malformed,
    /// No token, or a wrong one (`insitu_auth::Gate`).
    Unauthenticated,
}

/// The bytes a shard may buffer for big frames being received.
pub struct FrameBudget {
    permits: Semaphore,
    /// The budget in bytes (the semaphore's initial permits).
    total: usize,
}

impl FrameBudget {
    pub fn new(total: usize) -> FrameBudget {
        assert!(
            total >= MAX_FRAME_BYTES,
            "a frame budget must hold one max-size frame"
        );
        FrameBudget {
            permits: Semaphore::new(total),
            total,
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes currently taken by partly received frames.
    pub fn buffered_bytes(&self) -> usize {
        self.total - self.permits.available_permits()
    }

    /// Take `bytes` (one frame), waiting for room until `deadline`; None if
    /// there is none by then. Released when the permit is dropped.
    pub async fn acquire(&self, bytes: usize, deadline: Instant) -> Option<SemaphorePermit<'_>> {
        let n = u32::try_from(bytes).ok().filter(|_| bytes <= self.total)?;
        match tokio::time::timeout_at(deadline, self.permits.acquire_many(n)).await {
            Ok(Ok(permit)) => Some(permit),
            _ => None,
        }
    }
}
