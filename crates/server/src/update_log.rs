//! Which pushdown updates a shard has applied, by operation id, so a resent
//! update is answered instead of applied twice (`--add 1` must add one).
//!
//! Two layers:
//! - In memory (per shard): `Running` while an update runs here, `Done`
//!   with its result once applied. Answers resends fast; lost in a crash.
//! - In the tablet's log, as side records of class `CLASS_UPDATE` (id = the
//!   operation id), so the answer survives a crash (they are replicated and
//!   replayed) and a tablet move (migration carries a tablet's records):
//!   `Started` is written before the update's first write, `Done` (with
//!   the result) after its last. A resend that finds `Done` gets the result;
//!   one that finds only `Started` learns the update was cut off by a crash
//!   part-way, so some objects may hold its change: it is refused, never
//!   applied a second time over the part that was.
//!
//! Record payload (little-endian):
//!
//! ```text
//! 0    u8   state: 1 started, 2 done
//! 1    u64  seq: the tablet's version counter when the update began (age, for eviction)
//! 9    u64  visited   \
//! 17   u64  matched    | done only: the result to answer a resend with
//! 25   u64  updated    |
//! 33   u64  server_nanos /
//! ```
//!
//! Limits: `KEPT_PER_TABLET` records per tablet (the oldest go first), and
//! `REMEMBERED_UPDATES` in memory per shard.

use std::collections::{HashMap, VecDeque};

use insitu_engine::{Record, RecordId};
use insitu_protocol::Status;
use insitu_protocol::plan::{Partial, ScanResult};

use crate::scan_run::Refusal;
use crate::shard::ShardState;

/// Record class of an update's progress. Classes 1-3 are the transactions'
/// (`insitu_txn::record`); a tablet's records of every class share one map.
pub const CLASS_UPDATE: u8 = 4;

/// Updates remembered durably per tablet. Why 64: a client resends within
/// its operation timeout (seconds), and a tablet runs one update at a time,
/// each a full scan of the tablet, so 64 covers far more than that window
/// at ~60 bytes of log and map each.
const KEPT_PER_TABLET: usize = 64;

/// Updates a shard remembers in memory. Why 4096: thousands of updates a
/// second on one shard stay within a resend window; a few hundred bytes
/// each keeps it under ~1 MB.
const REMEMBERED_UPDATES: usize = 4096;

const STARTED: u8 = 1;
const DONE: u8 = 2;
const STARTED_BYTES: usize = 9;
const DONE_BYTES: usize = 41;

/// What a shard knows of an update operation on one tablet.
#[derive(Clone, Debug, PartialEq)]
pub enum UpdateState {
    /// Running here now: a resend is told to retry.
    Running,
    /// Applied: a resend gets this result again.
    Done(ScanResult),
    /// Begun, then cut off (a crash, or a refused write): some objects may hold its change.
    Interrupted,
}

/// (table, tablet start_hash, op id): the name of one update on one tablet.
pub type UpdateKey = (u64, u64, u64);

/// The in-memory layer: state by key, keys oldest first for eviction.
#[derive(Default)]
struct UpdateLog {
    states: HashMap<UpdateKey, UpdateState>,
    order: VecDeque<UpdateKey>,
}

thread_local! {
    /// One shard per thread (see `shard.rs`), so this is the shard's own log.
    static UPDATES: std::cell::RefCell<UpdateLog> = std::cell::RefCell::new(UpdateLog::default());
}

/// What is known of update `key`: memory first, then the tablet's records.
pub fn lookup(state: &ShardState, key: UpdateKey) -> Option<UpdateState> {
    if let Some(s) = UPDATES.with(|u| u.borrow().states.get(&key).cloned()) {
        return Some(s);
    }
    lookup_durable(state, key)
}

/// What the tablet's records say of update `key`.
pub fn lookup_durable(state: &ShardState, key: UpdateKey) -> Option<UpdateState> {
    let (table, start_hash, op) = key;
    let id = RecordId {
        class: CLASS_UPDATE,
        id: op,
    };
    let records = state.engine.borrow().records(table, start_hash);
    let found = records.into_iter().find(|r| r.id == id)?;
    Some(match decode(&found.payload) {
        Some((_, Some(result))) => UpdateState::Done(result),
        // A started record, or one that cannot be read: assume the worst.
        _ => UpdateState::Interrupted,
    })
}

/// Set (or with `None`, forget) the in-memory state of update `key`.
pub fn remember(key: UpdateKey, state: Option<UpdateState>) {
    UPDATES.with(|u| {
        let mut u = u.borrow_mut();
        let UpdateLog { states, order } = &mut *u;
        match state {
            None => {
                states.remove(&key);
                order.retain(|k| *k != key);
            }
            Some(s) => {
                if states.insert(key, s).is_none() {
                    order.push_back(key);
                }
            }
        }
        // Evict the oldest finished ones; a running one stays (bounded by
        // the shard's connections) and is removed when it ends.
        let mut tries = order.len();
        while order.len() > REMEMBERED_UPDATES && tries > 0 {
            tries -= 1;
            let Some(old) = order.pop_front() else { break };
            if let Some(UpdateState::Running) = states.get(&old) {
                order.push_back(old);
            } else {
                states.remove(&old);
            }
        }
    });
}

/// Record that update `key` is about to write, anchored at `anchor` (a key
/// of the tablet). Refused (nothing written yet) if the record does not fit.
pub fn begin(state: &ShardState, key: UpdateKey, anchor: &[u8]) -> Result<(), Refusal> {
    let (table, start_hash, op) = key;
    let seq = state
        .engine
        .borrow()
        .tablet_stats(table, start_hash)
        .map(|s| s.next_version)
        .unwrap_or(0);
    let mut payload = Vec::with_capacity(STARTED_BYTES);
    payload.push(STARTED);
    payload.extend_from_slice(&seq.to_le_bytes());
    let id = RecordId {
        class: CLASS_UPDATE,
        id: op,
    };
    state
        .engine
        .borrow_mut()
        .put_record(table, anchor, id, &payload)
        .map_err(|e| {
            (
                crate::handler::engine_status(&e),
                format!(
                    "cannot record the update's start, so nothing was written on this tablet: {e}"
                ),
            )
        })
}

/// Record that update `key` (begun at `anchor`) is applied with `result`,
/// and drop the tablet's oldest update records beyond `KEPT_PER_TABLET`.
pub fn finish(state: &ShardState, key: UpdateKey, anchor: &[u8], result: &ScanResult) {
    let (table, start_hash, op) = key;
    let id = RecordId {
        class: CLASS_UPDATE,
        id: op,
    };
    let mut engine = state.engine.borrow_mut();
    let seq = engine
        .records(table, start_hash)
        .into_iter()
        .find(|r| r.id == id)
        .and_then(|r| decode(&r.payload))
        .map(|(seq, _)| seq)
        .unwrap_or(0);
    if let Err(e) = engine.put_record(table, anchor, id, &encode_done(seq, result)) {
        // The update is applied and the reply says so; only a resend after
        // a crash would be refused as interrupted instead of answered.
        tracing::warn!(
            shard = state.index,
            table,
            start_hash,
            op,
            "update applied, but its completion is not recorded: {e}"
        );
    }
    let mut ours: Vec<(u64, Record)> = engine
        .records(table, start_hash)
        .into_iter()
        .filter(|r| r.id.class == CLASS_UPDATE)
        .map(|r| (decode(&r.payload).map_or(0, |(seq, _)| seq), r))
        .collect();
    if ours.len() > KEPT_PER_TABLET {
        ours.sort_by_key(|(seq, r)| (*seq, r.id.id));
        for (_, r) in &ours[..ours.len() - KEPT_PER_TABLET] {
            // A removal that fails (memory full) leaves one record more,
            // removed by a later finish.
            let _ = engine.remove_record(table, &r.anchor, r.id);
        }
    }
}

fn encode_done(seq: u64, r: &ScanResult) -> Vec<u8> {
    let updated = match r.partial {
        Partial::Update { updated } => updated,
        _ => 0,
    };
    let mut out = Vec::with_capacity(DONE_BYTES);
    out.push(DONE);
    for v in [seq, r.visited, r.matched, updated, r.server_nanos] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// (seq, result if done), or `None` for bytes that are not a record of ours.
fn decode(payload: &[u8]) -> Option<(u64, Option<ScanResult>)> {
    let word = |i: usize| -> Option<u64> {
        let bytes = payload.get(1 + 8 * i..9 + 8 * i)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    };
    match (payload.first()?, payload.len()) {
        (&STARTED, STARTED_BYTES) => Some((word(0)?, None)),
        (&DONE, DONE_BYTES) => Some((
            word(0)?,
            Some(ScanResult {
                visited: word(1)?,
                matched: word(2)?,
                server_nanos: word(4)?,
                restarts: 0,
                partial: Partial::Update { updated: word(3)? },
            }),
        )),
        _ => None,
    }
}

/// The refusal of a resend of an interrupted update.
pub fn interrupted(op: u64) -> Refusal {
    (
        Status::Internal,
        format!(
            "update {op:#x} was cut off on this tablet after it began writing (a server crash, \
             or a write the engine refused): some objects may hold its change, so it is not \
             applied again; check the data"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(updated: u64) -> ScanResult {
        ScanResult {
            visited: 10,
            matched: 7,
            server_nanos: 1234,
            restarts: 0,
            partial: Partial::Update { updated },
        }
    }

    #[test]
    fn a_done_record_gives_back_its_result() {
        let bytes = encode_done(42, &result(7));
        assert_eq!(decode(&bytes), Some((42, Some(result(7)))));
    }

    #[test]
    fn a_started_record_has_no_result_and_anything_else_is_not_ours() {
        let mut started = vec![STARTED];
        started.extend_from_slice(&9u64.to_le_bytes());
        assert_eq!(decode(&started), Some((9, None)));
        assert_eq!(decode(&started[..5]), None, "short");
        assert_eq!(decode(&[]), None);
        let mut bad = encode_done(1, &result(1));
        bad[0] = 7;
        assert_eq!(decode(&bad), None, "unknown state");
        bad[0] = DONE;
        bad.pop();
        assert_eq!(decode(&bad), None, "truncated");
    }

    #[test]
    fn the_class_is_not_a_transaction_class() {
        for c in [
            insitu_txn::record::CLASS_PREPARED,
            insitu_txn::record::CLASS_COMMITTED,
            insitu_txn::record::CLASS_ABORTED,
        ] {
            assert_ne!(c, CLASS_UPDATE);
        }
    }
}
