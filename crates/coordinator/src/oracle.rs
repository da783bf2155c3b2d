//! The timestamp oracle (ARCHITECTURE.md, "Timestamp oracle"): hands out
//! timestamps (`Request::Timestamps`), each strictly greater than every one
//! handed out before the request was received, across restarts too, never
//! 0, roughly following the wall clock in microseconds since the epoch.
//!
//! It counts in memory below a *reservation* kept in redb (counter
//! `timestamp_reservation`, `Store::reserve_timestamps`): every timestamp
//! handed out is below the reservation on record, because a request that
//! would reach past it first writes a higher one, durably, and only then
//! answers. A restart starts at max(reservation on record, wall clock), so
//! it is above everything handed out before, whenever the previous process
//! stopped, even if its clock was ahead of this one's.

use std::future::Future;
use std::time::{SystemTime, UNIX_EPOCH};

use insitu_protocol::{MAX_TIMESTAMPS, Response};
use tracing::error;

use crate::service::{Coordinator, Reject, Reply};

/// How far past the end of a request a new reservation reaches: 10 s of
/// wall clock at one timestamp per microsecond. Why that much: timestamps
/// follow the clock, so a reservation lasts about this long under any load,
/// i.e. one redb write (an fsync) per ~10 s at most; and a restart, which
/// starts at the reservation, runs at most about this far ahead of the clock.
pub(crate) const RESERVE_AHEAD: u64 = 10_000_000;

/// The oracle's state. Lives in the `Coordinator`, apart from the model.
pub(crate) struct Oracle {
    /// The counter and the reservation. A tokio mutex, held across the redb
    /// write of a new reservation: the requests queued behind it need that
    /// reservation too, and memory then never runs ahead of the disk. Not the
    /// model lock nor `meta_lock`: a slow table change never delays it.
    state: tokio::sync::Mutex<State>,
    /// Microseconds since the epoch (`now_micros`); a test freezes it to
    /// show that the reservation alone keeps timestamps increasing.
    clock: fn() -> u64,
}

/// What `Oracle::state` guards.
struct State {
    /// The lowest timestamp that may be handed out next (never 0).
    next: u64,
    /// Every timestamp handed out is below it, and it is on record in redb
    /// (or below the value on record): what a restart starts from.
    reserved: u64,
}

/// The wall clock in microseconds since the epoch (0 for a clock before it:
/// the reservation still keeps timestamps increasing).
pub(crate) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Oracle {
    /// The oracle of a coordinator whose redb holds `reservation` (0: none).
    pub(crate) fn new(reservation: u64) -> Oracle {
        Oracle::with_clock(reservation, now_micros)
    }

    /// `new` with another clock (tests).
    pub(crate) fn with_clock(reservation: u64, clock: fn() -> u64) -> Oracle {
        Oracle {
            state: tokio::sync::Mutex::new(State {
                // Above everything handed out before (all below the
                // reservation), never 0.
                next: reservation.max(clock()).max(1),
                // Memory may hand out only below what is on record; the first
                // request writes a reservation past `next`.
                reserved: reservation,
            }),
            clock,
        }
    }

    /// Hand out `count` (>= 1) timestamps; returns the first. If they would
    /// reach past the reservation, `persist(r)` must first put a new one `r`
    /// on record durably; if it fails, nothing is handed out.
    pub(crate) async fn take<F, Fut>(&self, count: u32, persist: F) -> Result<u64, Reject>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<(), Reject>>,
    {
        let mut state = self.state.lock().await;
        // Follow the clock forward, never back.
        let first = state.next.max((self.clock)());
        let end = first
            .checked_add(u64::from(count))
            .ok_or_else(|| Reject::internal("the timestamp oracle is exhausted"))?;
        if end > state.reserved {
            let reservation = end.saturating_add(RESERVE_AHEAD);
            persist(reservation).await?;
            state.reserved = reservation;
        }
        state.next = end;
        Ok(first)
    }

    /// Wait for any reservation write in progress and hold off new ones
    /// while the guard lives (closing the database).
    pub(crate) async fn pause(&self) -> impl Sized + '_ {
        self.state.lock().await
    }
}

impl Coordinator {
    /// `Request::Timestamps`: `count` fresh timestamps.
    pub(crate) async fn timestamps(&self, count: u32) -> Reply {
        if !(1..=MAX_TIMESTAMPS).contains(&count) {
            return Err(Reject::bad(format!(
                "a Timestamps request asks for 1 to {MAX_TIMESTAMPS} timestamps, not {count}"
            )));
        }
        let first = self
            .oracle
            .take(count, |reservation| self.reserve_timestamps(reservation))
            .await?;
        Ok(Response::Timestamps { first, count })
    }

    /// Put `reservation` on record in redb (a transaction of its own, on a
    /// blocking thread).
    async fn reserve_timestamps(&self, reservation: u64) -> Result<(), Reject> {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(store) = store else {
            return Err(Reject::internal("the coordinator is shutting down"));
        };
        tokio::task::spawn_blocking(move || store.reserve_timestamps(reservation))
            .await
            .map_err(|e| Reject::internal(format!("timestamp reservation task failed: {e}")))?
            .map_err(|e| {
                error!("writing the timestamp reservation failed: {e:#}");
                Reject::internal(format!("cannot persist the timestamp reservation: {e:#}"))
            })
    }
}

#[cfg(test)]
#[path = "oracle_tests.rs"]
mod tests;
