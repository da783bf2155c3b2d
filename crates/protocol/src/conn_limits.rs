//! The limits a listener of this protocol puts on its connections: how many
//! it serves, how long one may stay idle or leave a frame unfinished, and how
//! many bytes of partly received big frames it buffers in total. One type
//! for the coordinator's port and a storage server's ports, so both are
//! configured, and read, alike.

use std::time::Duration;

use crate::frame::{HEADER_BYTES, MAX_BODY_BYTES};

/// One max-size frame, header included: the least a frame budget may hold.
pub const MAX_FRAME_BYTES: usize = HEADER_BYTES + MAX_BODY_BYTES;

/// Connection limits of one listener (the coordinator, or each shard of a
/// storage server).
#[derive(Clone, Debug)]
pub struct ConnLimits {
    /// Connections served at once. At the limit the longest-idle connection
    /// is closed to admit a new one (so idle sockets can never lock out
    /// clients, enlisting servers or the cluster's own calls); only when none
    /// is idle is the new one refused.
    pub max_connections: usize,
    /// Bytes of partly received frames bigger than a connection's base buffer
    /// held at once; at least `MAX_FRAME_BYTES`. 0 = the listener's default:
    /// 16 MiB on the coordinator, a share of the memory budget on a shard
    /// (see each one's configuration).
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
