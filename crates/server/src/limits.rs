//! Connection limits of a shard: how many connections, how long one may stay
//! idle or leave a frame unfinished (the protocol's `ConnLimits`, as the
//! coordinator has them too), and the bytes of partly received big frames
//! the shard buffers in total (`FrameBudget`).

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

pub use insitu_protocol::conn_limits::{ConnLimits, MAX_FRAME_BYTES};

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
