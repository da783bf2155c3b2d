//! The coordinator's tablet administration on a shard: `TakeTablet`,
//! `DropTablet` and `ActivateTablet` (`MarkLost` is in `lost.rs`, moves in
//! `migrate.rs`, recoveries in `recover.rs`).

use bytes::BytesMut;
use insitu_engine::HashRange;
use insitu_protocol::{Response, Status, TabletState, encode_error};

use crate::handler::{reply, reply_engine_error};
use crate::shard::{ShardState, TabletMeta};

/// `TakeTablet`: hold the tablet `start_hash..=end_hash` of `table` (created
/// empty unless held already) in `tablet_state` under `map_version`;
/// `migration` names the move a `Receiving` copy accepts batches of.
pub(crate) fn take(
    state: &ShardState,
    id: u64,
    (table, start_hash, end_hash): (u64, u64, u64),
    (map_version, tablet_state, migration): (u64, TabletState, u64),
    out: &mut BytesMut,
) {
    let Some(range) = HashRange::new(start_hash, end_hash) else {
        return encode_error(out, id, Status::BadRequest, "tablet range start > end");
    };
    if tablet_state == TabletState::Receiving
        && let Err(message) =
            crate::migrate::fresh_receiving_copy(state, table, start_hash, migration)
    {
        return encode_error(out, id, Status::BadRequest, message);
    }
    let exists = state.tablets.borrow().contains_key(&(table, start_hash));
    if !exists && let Err(e) = state.engine.borrow_mut().create_tablet(table, range) {
        return reply_engine_error(out, id, &e);
    }
    // Taking a tablet we hold re-activates it (and un-freezes an aborted
    // move); holds of scans still running on it stay theirs.
    let mut tablets = state.tablets.borrow_mut();
    let meta = tablets
        .entry((table, start_hash))
        .or_insert_with(|| TabletMeta::new(map_version, tablet_state));
    meta.map_version = map_version;
    meta.state = tablet_state;
    meta.frozen = false;
    meta.moved_out = false;
    meta.migration = 0;
    meta.receiving = if tablet_state == TabletState::Receiving {
        migration
    } else {
        0
    };
    drop(tablets);
    state.recount_unusual();
    tracing::info!(
        shard = state.index,
        table,
        start_hash,
        end_hash,
        ?tablet_state,
        "took tablet"
    );
    reply(out, id, &Response::Done)
}

/// `DropTablet`: free the tablet (only if it serves nothing here, with
/// `only_if_not_serving`).
pub(crate) fn drop_tablet(
    state: &ShardState,
    id: u64,
    (table, start_hash): (u64, u64),
    only_if_not_serving: bool,
    out: &mut BytesMut,
) {
    let serving = state
        .tablets
        .borrow()
        .get(&(table, start_hash))
        .is_some_and(|m| m.serves_reads());
    if only_if_not_serving && serving {
        tracing::info!(
            shard = state.index,
            table,
            start_hash,
            "kept tablet: it serves here"
        );
        return reply(out, id, &Response::Done);
    }
    state.tablets.borrow_mut().remove(&(table, start_hash));
    state.engine.borrow_mut().drop_tablet(table, start_hash);
    state.recount_unusual();
    tracing::info!(shard = state.index, table, start_hash, "dropped tablet");
    reply(out, id, &Response::Done)
}

/// `ActivateTablet`: the tablet serves, under `map_version`: reads and
/// writes, or (`writes` false) reads only, writes answered `Retry` as while
/// frozen for a move (a recovered tablet until the coordinator has recorded
/// that this shard's backups hold its replay; see `Request::ActivateTablet`).
pub(crate) fn activate(
    state: &ShardState,
    id: u64,
    (table, start_hash): (u64, u64),
    map_version: u64,
    writes: bool,
    out: &mut BytesMut,
) {
    let found = match state.tablets.borrow_mut().get_mut(&(table, start_hash)) {
        Some(m) => {
            // A moved or recovered tablet starts to serve: its
            // objects' replaced versions were not kept here
            // (`versions.rs`), so it has a floor of its own, the bound
            // its move carried. Not for a tablet that served
            // already (an aborted move re-activates its source).
            if m.state == TabletState::Receiving {
                let end = state.engine.borrow().tablet_for(table, start_hash);
                if let Some(r) = end {
                    let carried = m.carried_commit_ts;
                    state
                        .versions
                        .borrow_mut()
                        .arrive(table, (r.start, r.end), carried);
                }
            }
            m.state = TabletState::Active;
            m.frozen = !writes;
            m.map_version = map_version;
            true
        }
        None => false,
    };
    state.recount_unusual();
    if found {
        reply(out, id, &Response::Done)
    } else {
        encode_error(
            out,
            id,
            Status::UnknownTablet,
            "no such tablet on this shard",
        )
    }
}
