//! Write holds: how a long scan or update keeps one tablet still while it
//! yields to the event loop.
//!
//! A chunked scan's cursor is exact only while its tablet is unchanged. The
//! first attempt of a read-only scan runs optimistically (most scans meet no
//! write); if the tablet changed during a yield the scan restarts *holding*
//! the tablet: writes to it are answered `Retry` (the client backs off and
//! retries, as during a tablet move) and the cleaner leaves it alone, so the
//! second attempt cannot be disturbed and still yields every chunk. An update
//! holds its tablet from start to end, so its two phases see one state and a
//! tablet move (which waits for it, see `wait_no_update`) never sees half of it.
//!
//! Why `Retry` rather than parking writes: the client already backs off on
//! `Retry` (tablet moves), a parked write would also stall every request
//! pipelined behind it on its connection, and `Retry` keeps the write path free
//! of waits. Reads and other tablets are never held.
//!
//! Bounds: a hold lasts one scan (work proportional to the tablet, in yielding
//! chunks); a waiter gives up with `Retry` after `HOLD_WAIT`.

use std::time::Duration;

use insitu_protocol::Status;

use crate::shard::ShardState;

/// Longest a scan or update waits for a conflicting update (or an update for
/// other holds) before answering `Retry`: long enough for a typical tablet
/// scan, short enough that the client's own retry loop stays in charge.
pub const HOLD_WAIT: Duration = Duration::from_secs(2);

type Refusal = (Status, String);

/// One hold on a tablet; released on drop (also when the scan is abandoned
/// because its connection closed).
pub struct Hold<'a> {
    state: &'a ShardState,
    table: u64,
    start_hash: u64,
    /// Whether this is the tablet's one update (exclusive), not a scan's hold.
    update: bool,
    /// Whether this hold also keeps the cleaner away (released separately by
    /// an update before its writes, which may need the cleaner's room).
    cleaner: bool,
}

/// Which hold `Hold::take` takes, so one call serves scans and updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldKind {
    /// A read-only scan's hold: waits while an update holds the tablet.
    Scan,
    /// An update's hold: waits until no other scan or update holds the tablet.
    Update,
}

impl<'a> Hold<'a> {
    /// Hold the tablet as `kind` says, waiting at most `HOLD_WAIT`.
    pub async fn take(
        state: &'a ShardState,
        table: u64,
        start_hash: u64,
        kind: HoldKind,
    ) -> Result<Hold<'a>, Refusal> {
        let update = kind == HoldKind::Update;
        let deadline = tokio::time::Instant::now() + HOLD_WAIT;
        loop {
            // Registered before the check, so a release in between is not missed.
            let released = state.holds_released.notified();
            {
                let mut tablets = state.tablets.borrow_mut();
                let Some(meta) = tablets.get_mut(&(table, start_hash)) else {
                    return Err((
                        Status::UnknownTablet,
                        format!("tablet {table}/{start_hash:#x} is not on this shard"),
                    ));
                };
                let free = if update {
                    // An update writes every matching object: none may be
                    // locked by a prepared transaction (a prepare meanwhile
                    // is refused, the tablet being held).
                    meta.write_holds == 0
                        && !meta.updating
                        && crate::txn::locks_on_tablet(state, table, start_hash) == 0
                } else {
                    !meta.updating
                };
                if free {
                    meta.write_holds += 1;
                    meta.updating |= update;
                    drop(tablets);
                    state.recount_unusual();
                    return Ok(Hold {
                        state,
                        table,
                        start_hash,
                        update,
                        cleaner: false,
                    });
                }
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Err((
                    Status::Retry,
                    format!(
                        "tablet {table}/{start_hash:#x} is busy with {} for over {} ms; retry",
                        if update { "another scan" } else { "an update" },
                        HOLD_WAIT.as_millis()
                    ),
                ));
            }
        }
    }

    /// Keep the cleaner away too (from now until `release_cleaner` or drop).
    pub fn hold_cleaner(&mut self) -> Result<(), Refusal> {
        if !self.cleaner {
            self.state
                .engine
                .borrow_mut()
                .hold_cleaner(self.table, self.start_hash, true)
                .map_err(|e| (crate::handler::engine_status(&e), e.to_string()))?;
            self.cleaner = true;
        }
        Ok(())
    }

    pub fn release_cleaner(&mut self) {
        if self.cleaner {
            // The tablet may be gone (dropped): nothing to release then.
            let _ = self
                .state
                .engine
                .borrow_mut()
                .hold_cleaner(self.table, self.start_hash, false);
            self.cleaner = false;
        }
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.release_cleaner();
        if let Some(meta) = self
            .state
            .tablets
            .borrow_mut()
            .get_mut(&(self.table, self.start_hash))
        {
            // Saturating: a tablet dropped and re-created meanwhile starts at 0.
            // A scan whose hold was lost that way still restarts on a change
            // (the scan token), so it stays exact.
            meta.write_holds = meta.write_holds.saturating_sub(1);
            if self.update {
                meta.updating = false;
            }
        }
        self.state.recount_unusual();
        self.state.holds_released.notify_waiters();
    }
}

/// Wait until no update holds the tablet (a tablet move calls this before it
/// freezes the tablet, so it never copies half an update). Scans' holds do
/// not conflict: a frozen tablet takes no writes either.
pub async fn wait_no_update(
    state: &ShardState,
    table: u64,
    start_hash: u64,
) -> Result<(), Refusal> {
    let deadline = tokio::time::Instant::now() + HOLD_WAIT;
    loop {
        let released = state.holds_released.notified();
        let updating = state
            .tablets
            .borrow()
            .get(&(table, start_hash))
            .is_some_and(|m| m.updating);
        if !updating {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, released).await.is_err() {
            return Err((
                Status::Retry,
                format!("tablet {table}/{start_hash:#x} is being updated; retry the move"),
            ));
        }
    }
}
