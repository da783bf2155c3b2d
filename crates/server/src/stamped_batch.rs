//! A connection's pipelined plain writes, stamped together: while snapshots
//! are read here, consecutive `Write`, `Remove` and `Increment` frames of one
//! connection to one table are held back and applied as one stamped batch
//! (`stamped::apply`: their keys locked, one timestamp from the oracle, the
//! writes applied in order), then answered in order.
//!
//! Why: a shard answers one connection's frames in order, and each stamped
//! write waits for the oracle with its keys locked (`stamped.rs`). One at a
//! time, a pipeline of 16 writes paid 16 oracle round trips back to back;
//! batched, it pays one (measured: `insitu bench kv --vs snapshots`,
//! BENCHMARKS.md).
//!
//! Why it is correct: a batch is what a `MultiWrite` of the same writes in
//! the same order is, and `stamped.rs` argues for that (every key locked
//! before the timestamp is taken, applied with no request in between). No
//! write is answered before it is applied, and the replies keep the
//! frames' order: `handler::handle` holds a write here after decoding it
//! and passing the gate, and flushes the batch before it answers anything
//! else; the connection loop (`conn.rs`) flushes it before any reply of
//! its own and before it writes its replies out. A key
//! written twice in a batch is locked once and written twice in order, the
//! later write winning, as one after the other would.
//!
//! Bounds: a batch lives for one pass over the connection's input buffer
//! (flushed before the replies are written), so it holds copies of at most
//! the frames that buffer held: `BASE_BUFFER_BYTES` (64 KiB) of small
//! frames, or one frame within the shard's frame budget. `stamped::apply`
//! cuts it into parts of at most `PART_ITEMS` writes and `PART_BYTES`, each
//! with its own timestamp, as it does a `MultiWrite`.

use bytes::BytesMut;
use insitu_protocol::frame::check_header;
use insitu_protocol::{Number, Request, Response, Status};

use crate::handler::rules;
use crate::shard::ShardState;
use crate::stamped::{Applied, PlainOp, PlainWrite, Refused};

/// One held write, owning what it writes.
struct Held {
    /// The request id its reply carries.
    id: u64,
    key: Vec<u8>,
    op: HeldOp,
    /// The deadline of a put (Unix ms; 0: none).
    expires_at_ms: u64,
    rules: insitu_engine::RejectRules,
}

/// What a held write does (`PlainOp`, owning its value).
enum HeldOp {
    Put(Vec<u8>),
    Remove,
    Add(Number),
}

impl HeldOp {
    /// The request's name, for the shard's request counts.
    fn kind(&self) -> &'static str {
        match self {
            HeldOp::Put(_) => "Write",
            HeldOp::Remove => "Remove",
            HeldOp::Add(_) => "Increment",
        }
    }
}

/// The writes held for one connection (see the module).
#[derive(Default)]
pub(crate) struct Batch {
    /// The table of every held write: a batch is one table's.
    table: u64,
    held: Vec<Held>,
}

impl Batch {
    /// Hold `request` if it is a plain single-key write to be stamped (it
    /// passed the gate), after flushing the batch into `out` if it is for
    /// another table or full. False: not one (or no snapshot is read
    /// here); the caller flushes, then serves it the usual way.
    pub async fn hold(
        &mut self,
        state: &ShardState,
        id: u64,
        request: &Request<'_>,
        out: &mut BytesMut,
    ) -> bool {
        // First: this runs for every request, and nothing is held (nor a
        // value copied) while no snapshot is read here.
        if !crate::stamped::needed(state) {
            return false;
        }
        let (table, key, op, expires_at_ms, r) = match request {
            Request::Write {
                table,
                key,
                value,
                rules,
                expires_at_ms,
            } => (
                *table,
                key,
                HeldOp::Put(value.to_vec()),
                *expires_at_ms,
                rules,
            ),
            Request::Remove { table, key, rules } => (*table, key, HeldOp::Remove, 0, rules),
            Request::Increment {
                table,
                key,
                delta,
                rules,
            } => (*table, key, HeldOp::Add(*delta), 0, rules),
            _ => return false,
        };
        if !self.held.is_empty() && table != self.table {
            self.flush(state, out).await;
        }
        self.table = table;
        self.held.push(Held {
            id,
            key: key.to_vec(),
            op,
            expires_at_ms,
            rules: rules(r),
        });
        true
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Apply the held writes as one stamped batch and answer each into
    /// `out`, in the order they came. Nothing held: nothing done.
    pub async fn flush(&mut self, state: &ShardState, out: &mut BytesMut) {
        if self.held.is_empty() {
            return;
        }
        let held = std::mem::take(&mut self.held);
        let table = self.table;
        // A lost counter must not silently start again from 0 (as
        // `point::increment` refuses it); those are answered at once,
        // in their place.
        let refusals: Vec<Option<(Status, String)>> = held
            .iter()
            .map(|h| match h.op {
                HeldOp::Add(_) => crate::lost::check_missing(state, table, &h.key).err(),
                _ => None,
            })
            .collect();
        let writes: Vec<PlainWrite<'_>> = held
            .iter()
            .zip(&refusals)
            .filter(|(_, refused)| refused.is_none())
            .map(|(h, _)| PlainWrite {
                key: &h.key,
                op: match &h.op {
                    HeldOp::Put(v) => PlainOp::Put(v),
                    HeldOp::Remove => PlainOp::Remove,
                    HeldOp::Add(d) => PlainOp::Add(*d),
                },
                expires_at_ms: h.expires_at_ms,
                rules: h.rules,
            })
            .collect();
        let mut results = crate::stamped::apply(state, table, &writes)
            .await
            .into_iter();
        for (h, refused) in held.iter().zip(refusals) {
            let reply_at = out.len();
            let result = match refused {
                Some((status, why)) => Err(Refused::Status(status, why)),
                None => results.next().unwrap_or_else(|| {
                    Err(Refused::Status(
                        Status::Internal,
                        "no result for a write".into(),
                    ))
                }),
            };
            let response = |a: Applied| match &h.op {
                HeldOp::Put(_) => Response::Written { version: a.version },
                HeldOp::Remove => Response::Removed { version: a.version },
                HeldOp::Add(d) => Response::Incremented {
                    // Always set for an increment.
                    value: a.number.unwrap_or(*d),
                    version: a.version,
                },
            };
            crate::stamped::reply_applied(state, h.id, (table, &h.key), result, out, response);
            let status = match check_header(&out[reply_at..], usize::MAX) {
                Ok(Some((header, _))) => header.status,
                _ => Status::Internal,
            };
            state.metrics.record(h.op.kind(), status, None);
        }
        debug_assert!(results.next().is_none(), "a result for every write");
    }
}
