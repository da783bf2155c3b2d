//! Tablets whose objects were lost (the coordinator's `lost.rs` says when
//! and why): a tablet re-created empty after its server died holding its
//! objects in memory only. Until an operator acknowledges the loss, a
//! request that finds no object under a key of such a tablet answers
//! `Status::DataLost` ("it may have existed") instead of "no such object".
//! Keys written since the loss read as usual.

use bytes::BytesMut;
use insitu_engine::{EngineError, key_hash};
use insitu_protocol::{Response, Status, encode_error, lost_with};

use crate::handler::engine_status;
use crate::shard::ShardState;

/// The server `key`'s tablet lost its objects with (0: none; not marked).
/// Costs one load while no tablet of this shard is marked.
#[inline]
pub(crate) fn lost_from(state: &ShardState, table: u64, key: &[u8]) -> u64 {
    if state.lost_tablets.get() == 0 {
        return 0;
    }
    let hash = key_hash(table, key);
    let Some(range) = state.engine.borrow().tablet_for(table, hash) else {
        return 0;
    };
    state
        .tablets
        .borrow()
        .get(&(table, range.start))
        .map_or(0, |m| m.lost_from)
}

/// The message of a `DataLost` answer.
pub(crate) fn message(lost_from: u64) -> String {
    format!(
        "no object under this key now, but one may have existed: this tablet's objects were lost with {} (it held them in memory only); an operator acknowledges the loss with `insitu table ack-loss TABLE`",
        lost_with(lost_from)
    )
}

/// The status and message answering engine error `e` on `key`: `DataLost`
/// for a missing object in a marked tablet, else the error's own.
pub(crate) fn refusal(
    state: &ShardState,
    table: u64,
    key: &[u8],
    e: &EngineError,
) -> (Status, String) {
    if matches!(e, EngineError::ObjectDoesntExist) {
        let from = lost_from(state, table, key);
        if from != 0 {
            return (Status::DataLost, message(from));
        }
    }
    (engine_status(e), e.to_string())
}

/// `Status::DataLost` (with its message) if `key` holds no object in a
/// marked tablet: for requests that would act on a missing key as if it
/// had never existed (an increment would start from 0).
pub(crate) fn check_missing(
    state: &ShardState,
    table: u64,
    key: &[u8],
) -> Result<(), (Status, String)> {
    let from = lost_from(state, table, key);
    if from == 0 {
        return Ok(());
    }
    match state.engine.borrow().read(table, key) {
        Err(EngineError::ObjectDoesntExist) => Err((Status::DataLost, message(from))),
        _ => Ok(()),
    }
}

/// `reply_result` for a request on `key` of `table`: a missing object in a
/// tablet marked lost answers `DataLost` (`lost.rs`).
pub(crate) fn reply_keyed(
    state: &ShardState,
    (table, key): (u64, &[u8]),
    out: &mut BytesMut,
    id: u64,
    result: Result<Response<'_>, EngineError>,
) {
    match result {
        Ok(response) => crate::handler::reply(out, id, &response),
        Err(e) => {
            let (status, message) = refusal(state, table, key, &e);
            encode_error(out, id, status, message)
        }
    }
}

/// `MarkLost`: mark (or, with `lost_from` 0, unmark) the tablet starting at
/// `start_hash`, and raise its version counter to `version_floor`.
pub(crate) fn mark(
    state: &ShardState,
    table: u64,
    start_hash: u64,
    lost_from: u64,
    version_floor: u64,
) -> Result<(), (Status, String)> {
    if !state.tablets.borrow().contains_key(&(table, start_hash)) {
        return Err((Status::UnknownTablet, "no such tablet on this shard".into()));
    }
    if version_floor != 0 {
        state
            .engine
            .borrow_mut()
            .raise_version(table, start_hash, version_floor)
            .map_err(|e| (engine_status(&e), e.to_string()))?;
    }
    if let Some(m) = state.tablets.borrow_mut().get_mut(&(table, start_hash)) {
        m.lost_from = lost_from;
    }
    state.recount_unusual();
    tracing::info!(
        shard = state.index,
        table,
        start_hash,
        lost_from,
        version_floor,
        "{}",
        if lost_from == 0 {
            "tablet's loss acknowledged"
        } else {
            "tablet marked lost"
        }
    );
    Ok(())
}
