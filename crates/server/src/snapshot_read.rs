//! `Request::SnapshotRead`: keys of one table as of a snapshot timestamp
//! `S`, for a read-only transaction that never aborts (the client's
//! `Snapshot`). The point-read sibling of a snapshot scan (`snapshot.rs`),
//! with the same argument in ARCHITECTURE.md, "Snapshot reads", narrowed
//! to the keys read:
//!
//! - a transaction that commits at or before `S` locked its keys before its
//!   timestamp was handed out, so when this request arrives it holds the
//!   lock of each key it writes here, or has applied: the read waits for
//!   the holders of the keys' locks at arrival (not the whole tablet's);
//! - a commit later than `S` applied here before the read is in the kept
//!   versions (kept since the floor, at or below `S`): the read answers the
//!   version and value it replaced.
//!
//! The read itself is one synchronous step after the waits, so the engine
//! and the kept versions agree; a tablet that arrived during the waits was
//! not admitted, and its keys answer `Retry` (the client asks again).

use std::collections::HashSet;

use bytes::BytesMut;
use insitu_engine::key_hash;
use insitu_protocol::{Blob, Status, encode_error};

use crate::handler::{admit, engine_status};
use crate::multi::{reply_reads, too_many};
use crate::scan_run::Refusal;
use crate::shard::ShardState;
use crate::snapshot::{Snap, admit_floor, admitted, check_end, wait_for};

pub(crate) async fn read(
    state: &ShardState,
    id: u64,
    (table, ts): (u64, u64),
    keys: &[Blob<'_>],
    out: &mut BytesMut,
) {
    if too_many(out, id, keys.len(), "keys") {
        return;
    }
    if ts == 0 {
        let why = "a snapshot read needs a timestamp from the oracle (0 is none)";
        return encode_error(out, id, Status::BadRequest, why);
    }
    let snaps = match admit_all(state, table, ts, keys).await {
        Ok(snaps) => snaps,
        Err((status, message)) => return encode_error(out, id, status, message),
    };
    // No yield from here to the reply: the engine, the locks and the kept
    // versions are read at one instant.
    let mut starts = HashSet::new();
    for snap in &snaps {
        // No reset, arrival or floor rise past `ts` since it was admitted.
        if let Err((status, message)) = check_end(state, snap) {
            return encode_error(out, id, status, message);
        }
        starts.insert(snap.tablet.1);
    }
    let engine = state.engine.borrow();
    // Expiry judged at the snapshot's instant: an object whose deadline
    // passed since is still there for it, one whose deadline came before it
    // is not, however late this read runs (the kept versions judge theirs
    // the same way, `versions::expired_at`).
    let _then = engine.pin_clock(crate::versions::clock_ms_at(ts));
    let versions = state.versions.borrow();
    let seq = versions.next_seq();
    reply_reads(out, id, keys, |key| {
        admit(state, table, key, false)?;
        let start = engine
            .tablet_for(table, key_hash(table, key))
            .ok_or(Status::UnknownTablet)?
            .start;
        if !starts.contains(&start) {
            // Arrived during the waits: its floor was not checked.
            return Err(Status::Retry);
        }
        match versions.as_of(table, key, ts, seq) {
            Some(Some(then)) => Ok(then),
            Some(None) => Err(Status::ObjectDoesntExist),
            None => engine
                .read(table, key)
                .map(|o| (o.version, o.value))
                .map_err(|e| engine_status(&e)),
        }
    })
}

/// Admit the snapshot on every tablet of `keys` here (learning floors),
/// then wait for the transactions holding the keys' locks.
async fn admit_all(
    state: &ShardState,
    table: u64,
    ts: u64,
    keys: &[Blob<'_>],
) -> Result<Vec<Snap>, Refusal> {
    let mut starts = Vec::new();
    for key in keys
        .iter()
        .filter(|k| admit(state, table, k, false).is_ok())
    {
        let tablet = state
            .engine
            .borrow()
            .tablet_for(table, key_hash(table, key));
        if let Some(range) = tablet
            && !starts.contains(&range.start)
        {
            starts.push(range.start);
        }
    }
    let mut snaps = Vec::with_capacity(starts.len());
    for start in starts {
        admit_floor(state, table, start, ts).await?;
        snaps.push(admitted(state, table, start, ts));
    }
    let holders: HashSet<u64> = {
        let p = state.txns.participant.borrow();
        keys.iter()
            .filter_map(|k| p.locks().holder(table, k))
            .collect()
    };
    let tablets: Vec<(u64, u64)> = snaps.iter().map(|s| s.tablet).collect();
    let what = format!("on keys of table {table}");
    wait_for(state, holders, &tablets, &what).await?;
    Ok(snaps)
}
