//! Steps 4 and 5 of a recovery: the fetched segments replayed into a fresh
//! tablet in steps with the shard's other requests between them, and the
//! tablet registered `Receiving`. The engine's half, apart from the fetching.

use bytes::Bytes;
use insitu_engine::{CorruptEntry, EngineError, HashRange, ReplayBuild, ReplayReport};
use insitu_protocol::{Status, TabletState};

use super::{RecoverTablet, Refusal, check_not_serving};
use crate::handler::engine_status;
use crate::shard::{ShardState, TabletMeta};

/// Winners a replay appends between two yields to the shard's other work:
/// about 0.2 ms (an object of 1 KB takes ~150 ns to append), so a recovery
/// delays a request on the shard by about that much, not by the whole
/// tablet's replay (hundreds of milliseconds for 128 MB). Segments are
/// resolved one per turn (~0.1-0.3 ms for 2 MiB).
const REPLAY_STEP_ENTRIES: usize = 1024;

/// A replay being built on this shard; dropped unfinished (an error, or the
/// recovery's future dropped at a yield), it gives the engine back its
/// memory. No engine borrow is held at a yield, so the drop can take one.
struct Building<'a, 's> {
    state: &'a ShardState,
    build: Option<ReplayBuild<'s>>,
}

impl Drop for Building<'_, '_> {
    fn drop(&mut self) {
        if let Some(build) = self.build.take() {
            build.abandon(&mut self.state.engine.borrow_mut());
        }
    }
}

/// Replay `bufs` into a new tablet and register it `Receiving`, replacing a
/// copy that serves nothing; `Ok(Err(corrupt))`, with nothing built, if a
/// segment holds a corrupt entry. The replay runs in steps with the shard's
/// other work between them (`REPLAY_STEP_ENTRIES`); whether the tablet
/// serves here is checked again before it is added.
pub(super) async fn install(
    state: &ShardState,
    req: &RecoverTablet,
    range: HashRange,
    bufs: &[Bytes],
) -> Result<Result<ReplayReport, Vec<CorruptEntry>>, Refusal> {
    check_not_serving(state, req.table, req.start_hash)?;
    let key = (req.table, req.start_hash);
    if state.tablets.borrow_mut().remove(&key).is_some() {
        state
            .engine
            .borrow_mut()
            .drop_tablet(req.table, req.start_hash);
        state.recount_unusual();
        tracing::info!(
            shard = state.index,
            table = req.table,
            start_hash = req.start_hash,
            "replacing a copy of the tablet that serves nothing (an earlier attempt's leftover)"
        );
    }
    let refusal = |e: EngineError| {
        (
            engine_status(&e),
            format!("replaying tablet {}/{:#x}: {e}", req.table, req.start_hash),
        )
    };
    let mut resolver = state
        .engine
        .borrow()
        .replay_in_steps(req.table, range)
        .map_err(refusal)?;
    for buf in bufs {
        resolver.feed(&buf[..]).map_err(refusal)?;
        tokio::task::yield_now().await;
    }
    if !resolver.report().corrupt.is_empty() {
        return Ok(Err(resolver.report().corrupt.clone()));
    }
    let build = resolver
        .build(&mut state.engine.borrow_mut())
        .map_err(refusal)?;
    let mut building = Building {
        state,
        build: Some(build),
    };
    loop {
        let build = building.build.as_mut().expect("building");
        let done = build
            .step(&mut state.engine.borrow_mut(), REPLAY_STEP_ENTRIES)
            .map_err(refusal)?;
        if done {
            break;
        }
        tokio::task::yield_now().await;
    }
    // Other requests ran between the steps: the tablet must still not serve
    // here (the engine's own check refuses any tablet in the range).
    check_not_serving(state, req.table, req.start_hash)?;
    let build = building.build.take().expect("building");
    let report = build.finish(&mut state.engine.borrow_mut()).map_err(|e| {
        (
            Status::Retry,
            format!(
                "tablet {}/{:#x}: its range was taken while it was replayed: {e}",
                req.table, req.start_hash
            ),
        )
    })?;
    // Its entries are on the dead master's replicas, which the coordinator
    // keeps until this shard's backups hold the replay: a read of one need
    // not wait for them (the tablet serves reads before they do, see
    // `Request::ActivateTablet`).
    if let Err(e) = state
        .engine
        .borrow()
        .note_held_elsewhere(req.table, req.start_hash)
    {
        // Not reached: the tablet was added just above, on this thread.
        tracing::error!(shard = state.index, "marking a replay held: {e}");
    }
    state.recount_unusual();
    debug_assert!(report.corrupt.is_empty());
    state.tablets.borrow_mut().insert(
        key,
        TabletMeta::new(req.map_version, TabletState::Receiving),
    );
    state.recount_unusual();
    // Transactions caught mid-commit: their parts lock again and their
    // decisions are known again before the tablet serves anything.
    // Its objects' replaced versions were not kept here (`versions.rs`),
    // and the dead server's commits are not known: no bound is carried.
    state
        .versions
        .borrow_mut()
        .arrive(req.table, (range.start, range.end), None);
    let records = crate::txn_durable::restore_tablet(state, req.table, req.start_hash);
    if records > 0 {
        tracing::info!(
            shard = state.index,
            table = req.table,
            start_hash = req.start_hash,
            records,
            "took back the transaction records of a recovered tablet"
        );
    }
    Ok(Ok(report))
}
