//! Single-key requests (`Read`, `Write`, `Remove`, `Increment`): a family of
//! handlers of their own, apart from dispatch (`handler.rs`), since they all
//! admit one key, run one engine call or one stamped write, and reply alike.

use bytes::BytesMut;
use insitu_engine::{Engine, EngineError};
use insitu_protocol::{Number, RejectRules, Response, blob, encode_error};

use crate::handler::{admit, reply, reply_engine_error, rules};
use crate::shard::ShardState;
use crate::stamped::{Applied, PlainOp, PlainWrite};

/// `Read`. `held_at`: the found object's own durable mark (see
/// `handler::Handled::need`).
pub(crate) fn read(
    state: &ShardState,
    id: u64,
    (table, key): (u64, &[u8]),
    out: &mut BytesMut,
    held_at: &mut Option<u64>,
) {
    if let Err(s) = admit(state, table, key, false) {
        return encode_error(out, id, s, s.to_string());
    }
    let engine = state.engine.borrow();
    let result = engine.read_held(table, key).map(|(obj, mark)| {
        *held_at = Some(mark);
        Response::Read {
            version: obj.version,
            value: blob(obj.value),
            expires_at_ms: obj.expires_at_ms,
        }
    });
    crate::lost::reply_keyed(state, (table, key), out, id, result);
}

/// `Write`: stamped while snapshots are read (`stamped.rs`), else written.
pub(crate) async fn write(
    state: &ShardState,
    id: u64,
    (table, key): (u64, &[u8]),
    (value, expires_at_ms): (&[u8], u64),
    r: RejectRules,
    out: &mut BytesMut,
) {
    if crate::stamped::needed(state) {
        let write = PlainWrite {
            key,
            op: PlainOp::Put(value),
            expires_at_ms,
            rules: rules(&r),
        };
        let written = |a: Applied| Response::Written { version: a.version };
        return crate::stamped::reply_one(state, id, (table, write), out, written).await;
    }
    write_keyed(state, id, (table, key), out, |engine| {
        let written = engine.write_expiring(table, key, value, expires_at_ms, &rules(&r));
        written.map(|version| Response::Written { version })
    })
}

/// `Remove`: stamped while snapshots are read (`stamped.rs`), else removed.
pub(crate) async fn remove(
    state: &ShardState,
    id: u64,
    (table, key): (u64, &[u8]),
    r: RejectRules,
    out: &mut BytesMut,
) {
    if crate::stamped::needed(state) {
        let write = PlainWrite {
            key,
            op: PlainOp::Remove,
            expires_at_ms: 0,
            rules: rules(&r),
        };
        let removed = |a: Applied| Response::Removed { version: a.version };
        return crate::stamped::reply_one(state, id, (table, write), out, removed).await;
    }
    write_keyed(state, id, (table, key), out, |engine| {
        let removed = engine.remove(table, key, &rules(&r));
        removed.map(|version| Response::Removed { version })
    })
}

/// `Increment`: refused for a lost key, stamped while snapshots are read
/// (`stamped.rs`), else added on the engine.
pub(crate) async fn increment(
    state: &ShardState,
    id: u64,
    (table, key): (u64, &[u8]),
    delta: Number,
    r: RejectRules,
    out: &mut BytesMut,
) {
    if let Err(s) = admit(state, table, key, true) {
        return encode_error(out, id, s, s.to_string());
    }
    // A lost counter must not silently start again from 0.
    if let Err((status, message)) = crate::lost::check_missing(state, table, key) {
        return encode_error(out, id, status, message);
    }
    if crate::stamped::needed(state) {
        let write = PlainWrite {
            key,
            op: PlainOp::Add(delta),
            expires_at_ms: 0,
            rules: rules(&r),
        };
        let incremented = |a: Applied| Response::Incremented {
            // Always set for an increment.
            value: a.number.unwrap_or(delta),
            version: a.version,
        };
        return crate::stamped::reply_one(state, id, (table, write), out, incremented).await;
    }
    crate::stamped::unstamped(state, table);
    let mut engine = state.engine.borrow_mut();
    let result = match delta {
        Number::I64(d) => engine
            .increment_i64(table, key, d, &rules(&r))
            .map(|(v, ver)| (Number::I64(v), ver)),
        Number::F64(d) => engine
            .increment_f64(table, key, d, &rules(&r))
            .map(|(v, ver)| (Number::F64(v), ver)),
    };
    let result = result.map(|(value, version)| Response::Incremented { value, version });
    reply_result(out, id, result);
}

/// Reply with the response of a single-key engine call, or its error as a
/// status: the tail every single-key branch shares, so all map errors alike.
fn reply_result(out: &mut BytesMut, id: u64, result: Result<Response<'_>, EngineError>) {
    match result {
        Ok(response) => reply(out, id, &response),
        Err(e) => reply_engine_error(out, id, &e),
    }
}

/// Serve a single-key write (`Write`, `Remove`): admit it, run `op` on the
/// engine, reply with its response (a refusal of a lost key worded as
/// `lost.rs` words it). One path, so both writes are admitted and refused alike.
fn write_keyed<'v>(
    state: &ShardState,
    id: u64,
    (table, key): (u64, &[u8]),
    out: &mut BytesMut,
    op: impl FnOnce(&mut Engine) -> Result<Response<'v>, EngineError>,
) {
    if let Err(s) = admit(state, table, key, true) {
        return encode_error(out, id, s, s.to_string());
    }
    crate::stamped::unstamped(state, table);
    let result = op(&mut state.engine.borrow_mut());
    crate::lost::reply_keyed(state, (table, key), out, id, result);
}
