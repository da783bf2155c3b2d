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
//! Snapshots. While snapshot reads are served here (`stamped::needed`),
//! the removals run as stamped plain writes (`stamped::apply`,
//! `PlainOp::Expire`): locked, given a timestamp `T` from the oracle, and
//! the removed object kept under `T` with its deadline. A snapshot at `S`
//! judges expiry at its own instant (`versions::expired_at`, the engine's
//! clock pinned at `S` for its reads), so it sees the object if `S` is
//! before the deadline, however late it reads, and not after: the sweep
//! changes nothing a snapshot can see. Otherwise a removal takes no
//! timestamp and makes its table's commit bound unknown, as an unstamped
//! write does (`commit_bound.rs`): a tablet moving out then carries a
//! timestamp fetched after it, so a snapshot older than the removal is
//! refused there rather than read without the object.
//!
//! Crash case: a tombstone the sweep wrote but no backup held yet may be
//! lost with the server. Recovery then replays the expired object with its
//! deadline (the entry carries it), so it stays invisible and the new
//! owner's sweep removes it again. Nobody waits for the sweep's tombstones
//! to be durable: it kicks the replicator, which ships them with the next
//! round.

use std::rc::Rc;
use std::time::{Duration, Instant};

use insitu_engine::{ExpiredObject, RejectRules};

use crate::handler::admit;
use crate::shard::ShardState;
use crate::stamped::{PlainOp, PlainWrite};

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
            if step(&state).await.done || started.elapsed() >= TICK_BUDGET {
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

/// Find due objects and remove them: bounded; one synchronous step unless
/// snapshots are read here (then an oracle round trip per table).
async fn step(state: &ShardState) -> Step {
    let found = state
        .engine
        .borrow_mut()
        .sweep_expired(OBJECTS_PER_STEP, BYTES_PER_STEP);
    let removed = if crate::stamped::needed(state) {
        remove_stamped(state, &found.expired).await
    } else {
        remove_now(state, &found.expired)
    };
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

/// Remove `due` with no timestamp (no snapshot is read here). Returns how
/// many went.
fn remove_now(state: &ShardState, due: &[ExpiredObject]) -> u64 {
    let mut removed = 0u64;
    for o in due {
        if admit(state, o.table, &o.key, true).is_err() {
            continue; // locked, frozen or moving: next tick
        }
        match state.engine.borrow_mut().expire(o.table, &o.key, o.version) {
            Ok(true) => {
                removed += 1;
                crate::stamped::unstamped(state, o.table);
            }
            Ok(false) => {} // written, removed or re-dated since it was found
            Err(e) => {
                tracing::debug!(table = o.table, error = %e, "expired object not removed yet");
            }
        }
    }
    removed
}

/// Remove `due` as stamped writes, one batch per table (snapshots are read
/// here: see the module). What is refused (locked, moving, written since)
/// waits for a later tick, as in `remove_now`.
async fn remove_stamped(state: &ShardState, due: &[ExpiredObject]) -> u64 {
    let mut tables: Vec<u64> = due.iter().map(|o| o.table).collect();
    tables.sort_unstable();
    tables.dedup();
    let mut removed = 0u64;
    for table in tables {
        let writes: Vec<PlainWrite<'_>> = due
            .iter()
            .filter(|o| o.table == table)
            .map(|o| PlainWrite {
                key: &o.key,
                op: PlainOp::Expire(o.version),
                expires_at_ms: 0,
                rules: RejectRules::default(),
            })
            .collect();
        let results = crate::stamped::apply(state, table, &writes).await;
        removed += results.iter().filter(|r| r.is_ok()).count() as u64;
    }
    removed
}
