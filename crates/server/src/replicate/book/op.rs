//! One op of a replication round as the round holds it: owning its bytes,
//! so the round can await while the engine changes, and shareable with the
//! sends to every backup and with this server's own backup thread.

use std::sync::Arc;

use bytes::Bytes;
use insitu_protocol::{BackupOp, blob};

/// One op of a round, owning its bytes (copied out of the engine, so the
/// round can await while the engine changes).
#[derive(Clone, Debug)]
pub enum OwnedOp {
    Append {
        log: u64,
        table: u64,
        start_hash: u64,
        segment: u64,
        offset: u64,
        bytes: Bytes,
        close: bool,
    },
    Free {
        log: u64,
        segment: u64,
    },
    Digest {
        log: u64,
        segment: u64,
        seq: u64,
        /// Shared with the log's book entry (`listed`); `Arc`, not `Rc`:
        /// the op may travel to this server's own backup thread.
        segments: Arc<[u64]>,
    },
}

impl OwnedOp {
    /// Segment bytes the op carries.
    pub fn len(&self) -> usize {
        match self {
            OwnedOp::Append { bytes, .. } => bytes.len(),
            OwnedOp::Free { .. } | OwnedOp::Digest { .. } => 0,
        }
    }

    /// The bytes the Append ops of `ops` carry, to send them without a copy
    /// (`RpcConn::call_sharing`).
    pub fn shared(ops: &[OwnedOp]) -> Vec<Bytes> {
        ops.iter()
            .filter_map(|op| match op {
                OwnedOp::Append { bytes, .. } => Some(bytes.clone()),
                OwnedOp::Free { .. } | OwnedOp::Digest { .. } => None,
            })
            .collect()
    }

    /// The wire form, borrowing the bytes.
    pub fn as_op(&self) -> BackupOp<'_> {
        match self {
            OwnedOp::Append {
                log,
                table,
                start_hash,
                segment,
                offset,
                bytes,
                close,
            } => BackupOp::Append {
                log: *log,
                table: *table,
                start_hash: *start_hash,
                segment: *segment,
                offset: *offset,
                bytes: blob(bytes),
                close: *close,
            },
            OwnedOp::Free { log, segment } => BackupOp::Free {
                log: *log,
                segment: *segment,
            },
            OwnedOp::Digest {
                log,
                segment,
                seq,
                segments,
            } => BackupOp::Digest {
                log: *log,
                segment: *segment,
                seq: *seq,
                segments: segments.to_vec(),
            },
        }
    }
}
