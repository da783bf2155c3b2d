//! The shard's expiry sweep: objects whose deadline passed are removed with
//! a tombstone, so the cleaner can reclaim their space.
//!
//! Reads never need this: the engine leaves an expired object out of every
//! read, visit and reject rule from its deadline on (`insitu_engine`'s
//! `expiry.rs`). The sweep is about memory: without it an expired object
//! would keep its bytes until overwritten. It runs every `SWEEP_EVERY`; each
//! step asks the engine for up to `OBJECTS_PER_STEP` due objects (reading
//! at most `BYTES_PER_STEP` of log, and only segments that hold something
//! due) and removes each through `Engine::expire`, which removes only the
//! version found and only if it is still expired. Steps yield to the
//! shard's event loop, and a tick stops after `TICK_BUDGET` of work, so a
//! mass expiry (a million keys given one deadline) is spread over ticks
//! instead of stalling requests: the sweep takes at most about a quarter of
//! the shard (as Redis's active expiry does).
//!
//! What is skipped and retried next tick: a key a prepared transaction
//! holds a lock on, one whose tablet is frozen or moving (`admit`, as for
//! any write), and a removal refused for want of memory.
//!
//! Crash case: a tombstone the sweep wrote but no backup held yet may be
//! lost with the server. Recovery then replays the expired object with its
//! deadline (the entry carries it), so it stays invisible and the new
//! owner's sweep removes it again. Nobody waits for the sweep's tombstones
//! to be durable: it kicks the replicator, which ships them with the next
//! round.

use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::handler::admit;
use crate::shard::ShardState;

/// How often the sweep looks for due objects: an expired object's space
/// is reclaimable within about this (plus the cleaner's own pace).
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// Most due objects one step names (each is one tombstone).
const OBJECTS_PER_STEP: usize = 256;
/// Most log bytes one step reads: about a quarter of a millisecond of
/// header walking on this class of machine.
const BYTES_PER_STEP: u64 = 256 * 1024;
/// Most work per tick (a quarter of `SWEEP_EVERY`): the rest waits.
const TICK_BUDGET: Duration = Duration::from_millis(25);

pub async fn sweep(state: Rc<ShardState>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let started = Instant::now();
        loop {
            if step(&state).done || started.elapsed() >= TICK_BUDGET {
                break;
            }
            tokio::task::yield_now().await;
        }
    }
}

/// What one step did.
struct Step {
    /// The sweep went around every tablet, or found less than a step's worth.
    done: bool,
}

/// Find due objects and remove them: one synchronous step, bounded.
fn step(state: &ShardState) -> Step {
    let found = state
        .engine
        .borrow_mut()
        .sweep_expired(OBJECTS_PER_STEP, BYTES_PER_STEP);
    let mut removed = 0u64;
    for o in &found.expired {
        if admit(state, o.table, &o.key, true).is_err() {
            continue; // locked, frozen or moving: next tick
        }
        match state.engine.borrow_mut().expire(o.table, &o.key, o.version) {
            Ok(true) => removed += 1,
            Ok(false) => {} // written, removed or re-dated since it was found
            Err(e) => {
                tracing::debug!(table = o.table, error = %e, "expired object not removed yet");
            }
        }
    }
    if removed > 0 {
        let m = &state.metrics;
        m.expired.set(m.expired.get() + removed);
        state.repl.kick();
    }
    Step {
        done: found.wrapped
            || (found.expired.len() < OBJECTS_PER_STEP && found.bytes_read < BYTES_PER_STEP),
    }
}
