//! Multi-operations on a shard: multiRead (stopping with `Truncated` before
//! the reply would overflow a frame), multiWrite and multiRemove (a status
//! per item, each item admitted on its own).

use bytes::BytesMut;
use insitu_engine::{EngineError, RejectRules};
use insitu_protocol::frame::MAX_BODY_BYTES;
use insitu_protocol::{Blob, ReadResult, Response, Status, WriteResult, blob, encode_error};

use crate::handler::{MAX_MULTI_ITEMS, REPLY_SLACK_BYTES, admit, engine_status, reply};
use crate::shard::ShardState;
use crate::stamped::{PlainOp, PlainWrite, Refused};

/// Refuse a request of more than `MAX_MULTI_ITEMS` items (the decoder's
/// limit too; checked again here so no path skips it).
pub(crate) fn too_many(out: &mut BytesMut, id: u64, n: usize, what: &str) -> bool {
    if n <= MAX_MULTI_ITEMS {
        return false;
    }
    encode_error(
        out,
        id,
        Status::BadRequest,
        format!("{n} {what} exceed the limit of {MAX_MULTI_ITEMS}"),
    );
    true
}

pub async fn write(
    state: &ShardState,
    id: u64,
    table: u64,
    items: &[(Blob<'_>, Blob<'_>)],
    out: &mut BytesMut,
) {
    if too_many(out, id, items.len(), "items") {
        return;
    }
    let results = if crate::stamped::needed(state) {
        let writes = items.iter().map(|(key, value)| PlainWrite {
            key,
            op: PlainOp::Put(value),
            expires_at_ms: 0,
            rules: RejectRules::default(),
        });
        apply_stamped(state, table, writes.collect()).await
    } else {
        let results = items.iter().map(|(key, value)| {
            apply_write(state, table, key, |engine| {
                engine.write(table, key, value, &RejectRules::default())
            })
        });
        results.collect()
    };
    reply(out, id, &Response::MultiWrite { results })
}

pub async fn remove(
    state: &ShardState,
    id: u64,
    table: u64,
    keys: &[Blob<'_>],
    out: &mut BytesMut,
) {
    if too_many(out, id, keys.len(), "keys") {
        return;
    }
    let results = if crate::stamped::needed(state) {
        let writes = keys.iter().map(|key| PlainWrite {
            key,
            op: PlainOp::Remove,
            expires_at_ms: 0,
            rules: RejectRules::default(),
        });
        apply_stamped(state, table, writes.collect()).await
    } else {
        let results = keys.iter().map(|key| {
            apply_write(state, table, key, |engine| {
                engine.remove(table, key, &RejectRules::default())
            })
        });
        results.collect()
    };
    reply(out, id, &Response::MultiRemove { results })
}

/// The items of a multiWrite / multiRemove while snapshots are read here
/// (`stamped.rs`): a status per item, in order.
async fn apply_stamped(
    state: &ShardState,
    table: u64,
    writes: Vec<PlainWrite<'_>>,
) -> Vec<WriteResult> {
    let applied = crate::stamped::apply(state, table, &writes).await;
    let results = applied.into_iter().map(|r| {
        let (status, version) = match r {
            Ok(applied) => (Status::Ok, applied.version),
            Err(Refused::Engine(e)) => (engine_status(&e), 0),
            Err(Refused::Status(status, _) | Refused::Admit(status)) => (status, 0),
        };
        WriteResult { status, version }
    });
    results.collect()
}

/// One item of a multiWrite / multiRemove: admit it, run `op` on the engine,
/// and turn the outcome into that item's status.
fn apply_write(
    state: &ShardState,
    table: u64,
    key: &[u8],
    op: impl FnOnce(&mut insitu_engine::Engine) -> Result<u64, EngineError>,
) -> WriteResult {
    if let Err(status) = admit(state, table, key, true) {
        return WriteResult { status, version: 0 };
    }
    crate::stamped::unstamped(state, table);
    match op(&mut state.engine.borrow_mut()) {
        Ok(version) => WriteResult {
            status: Status::Ok,
            version,
        },
        Err(e) => WriteResult {
            status: engine_status(&e),
            version: 0,
        },
    }
}

/// Returns the log mark after which every object it found is durable
/// (`Engine::read_held`), or None if a key was not found or refused (an
/// absence may come of a removal not yet replicated: the reply waits for
/// every change then).
pub fn read(
    state: &ShardState,
    id: u64,
    table: u64,
    keys: &[Blob<'_>],
    out: &mut BytesMut,
) -> Option<u64> {
    if too_many(out, id, keys.len(), "keys") {
        return None;
    }
    let engine = state.engine.borrow();
    let mut held_at = Some(0u64);
    reply_reads(out, id, keys, |key| {
        let found = admit(state, table, key, false).and_then(|()| {
            engine
                .read_held(table, key)
                .map_err(|e| crate::lost::refusal(state, table, key, &e).0)
        });
        match found {
            Ok((o, mark)) => {
                held_at = held_at.map(|m| m.max(mark));
                Ok((o.version, o.value))
            }
            Err(status) => {
                held_at = None;
                Err(status)
            }
        }
    });
    held_at
}

/// Answer a read of `keys` with `MultiRead`: `lookup` gives each key's
/// version and value (or its status). Stops with `Truncated` before the
/// reply would overflow a frame; nothing after a truncated key is served,
/// so the results keep the keys' order.
pub(crate) fn reply_reads<'v>(
    out: &mut BytesMut,
    id: u64,
    keys: &[Blob<'_>],
    mut lookup: impl FnMut(&[u8]) -> Result<(u64, &'v [u8]), Status>,
) {
    let budget = MAX_BODY_BYTES - REPLY_SLACK_BYTES;
    let mut used = 0usize;
    let mut results = Vec::with_capacity(keys.len());
    let empty = blob(&[]);
    let refused = |status| ReadResult {
        status,
        version: 0,
        value: empty,
    };
    for key in keys {
        // Per-entry overhead of the encoding: status, version varint, length varint.
        if used + 24 > budget {
            results.push(refused(Status::Truncated));
            continue;
        }
        match lookup(key) {
            Ok((_, value)) if used + 24 + value.len() > budget => {
                results.push(refused(Status::Truncated));
                used = budget; // keep order: nothing after a truncated key is served
            }
            Ok((version, value)) => {
                used += 24 + value.len();
                results.push(ReadResult {
                    status: Status::Ok,
                    version,
                    value: blob(value),
                });
            }
            Err(status) => {
                used += 24;
                results.push(refused(status));
            }
        }
    }
    reply(out, id, &Response::MultiRead { results })
}
