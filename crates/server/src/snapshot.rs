//! A read-only scan of one tablet as of a snapshot timestamp
//! (`Request::Scan::snapshot_ts`): the tablet as it is, with every key a
//! commit later than the snapshot changed read from the kept versions
//! (`versions.rs`) instead. ARCHITECTURE.md, "Snapshot reads", has the
//! argument; in short:
//!
//! - a commit's timestamp is taken after every participant locked its keys,
//!   so a transaction that commits at or before the snapshot `S` was already
//!   prepared here when the snapshot's request arrived (its timestamp was
//!   handed out before `S`, its prepare before that). `begin` waits for the
//!   transactions holding locks in the tablet at arrival: then each of them
//!   is applied (or aborted), with its timestamp.
//! - a commit later than `S` applied here before or during the scan is in
//!   the kept versions (they were being kept since the floor, which is at or
//!   below `S`), so the scan reads the value it replaced.
//! - the scan itself is one instant of the tablet (`scan_run.rs`: its token
//!   restarts it on any change), and only versions kept before the attempt
//!   that completes began are counted (`Overlay::reset` takes their
//!   sequence number), so they are the changes up to that instant.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use insitu_protocol::Status;
use insitu_protocol::plan::Source;

use crate::scan_run::{ObjectSink, Refusal};
use crate::shard::ShardState;

/// A snapshot read waits at most this long for the transactions holding
/// locks in its tablet (they resolve within the prepared timeout plus a
/// resolution), and for an update holding it, then answers `Retry` (the
/// client retries within its operation timeout).
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// At most this long for another request's fetch of the floor.
const FLOOR_WAIT: Duration = Duration::from_secs(3);

/// A snapshot read admitted on one tablet.
pub(crate) struct Snap {
    pub ts: u64,
    /// (table, start hash) of the tablet read.
    pub tablet: (u64, u64),
    /// The kept versions' generation and the tablet's arrival when
    /// admitted: a reset or an arrival since makes the answer
    /// `SnapshotTooOld`.
    generation: u64,
    arrival: Option<u64>,
}

fn too_old(ts: u64, floor: Option<u64>) -> Refusal {
    (
        Status::SnapshotTooOld,
        match floor {
            Some(f) => format!(
                "snapshot {ts} is older than the oldest this shard can read ({f}); take a new one"
            ),
            None => {
                format!("snapshot {ts}: this shard has just begun keeping versions; take a new one")
            }
        },
    )
}

/// Admit a snapshot read at `ts` on the tablet `(table, start..=end)`:
/// start keeping versions, learn the floor if it is not known, refuse a
/// snapshot below it, and wait for the transactions locking the tablet.
pub(crate) async fn begin(
    state: &ShardState,
    table: u64,
    (start, end): (u64, u64),
    ts: u64,
) -> Result<Snap, Refusal> {
    admit_floor(state, table, start, ts).await?;
    let holders = state
        .txns
        .participant
        .borrow()
        .locks()
        .holders_in(table, start, end);
    let what = format!("on tablet {table}/{start:#x}");
    wait_for(state, holders, &[(table, start)], &what).await?;
    Ok(admitted(state, table, start, ts))
}

/// The snapshot read at `ts` of the tablet `(table, start)` as admitted now.
pub(crate) fn admitted(state: &ShardState, table: u64, start: u64, ts: u64) -> Snap {
    let tablet = (table, start);
    let v = state.versions.borrow();
    Snap {
        ts,
        tablet,
        generation: v.generation(),
        arrival: v.arrival(tablet),
    }
}

/// Start keeping versions, learn the floor of the tablet `(table, start)`
/// if it is not known, and refuse a snapshot `ts` below it.
pub(crate) async fn admit_floor(
    state: &ShardState,
    table: u64,
    start: u64,
    ts: u64,
) -> Result<(), Refusal> {
    let arrived = Instant::now();
    let tablet = (table, start);
    loop {
        // Again on every round: a reset (keeping stopped, or a tablet
        // arrived) may have come while a fetch was under way.
        state.versions.borrow_mut().note_read(Instant::now());
        let (floor, fetching, tag) = {
            let v = state.versions.borrow();
            (v.floor_for(tablet), v.fetching, v.fetch_tag(tablet))
        };
        match floor {
            Some(f) if ts < f => return Err(too_old(ts, Some(f))),
            Some(_) => return Ok(()),
            None if arrived.elapsed() >= FLOOR_WAIT => {
                return Err((
                    Status::Retry,
                    "the snapshot floor is still being learned".into(),
                ));
            }
            None if fetching => tokio::time::sleep(Duration::from_millis(1)).await,
            None => {
                // Keeping began (note_read), and the tablet arrived, before
                // this asks: every commit applied here earlier had its
                // timestamp handed out before the one fetched now.
                state.versions.borrow_mut().fetching = true;
                let fetched = crate::txn_peers::oracle_timestamp(state).await;
                let mut v = state.versions.borrow_mut();
                v.fetching = false;
                match fetched {
                    Ok(floor) => v.set_floors(tablet, tag, floor),
                    Err(why) => return Err((Status::Retry, format!("snapshot read: {why}"))),
                }
            }
        }
    }
}

/// Wait until none of the transactions `waiting` (prepared when the read
/// arrived) is still prepared here: each is then applied or aborted, with
/// its timestamp; and until no pushdown update holds any of `tablets`
/// (table, start): one under way writes under a timestamp it took while
/// holding, so the read sees all of it or, through the kept versions, none
/// (`stamped::bulk_timestamp`). At most `LOCK_WAIT`, then `Retry`.
pub(crate) async fn wait_for(
    state: &ShardState,
    waiting: HashSet<u64>,
    tablets: &[(u64, u64)],
    what: &str,
) -> Result<(), Refusal> {
    let deadline = tokio::time::Instant::now() + LOCK_WAIT;
    loop {
        let released = state.holds_released.notified();
        let left = {
            let p = state.txns.participant.borrow();
            waiting.iter().filter(|t| p.prepared(**t).is_some()).count()
        };
        let updating = {
            let meta = state.tablets.borrow();
            tablets
                .iter()
                .filter(|t| meta.get(t).is_some_and(|m| m.updating))
                .count()
        };
        if left == 0 && updating == 0 {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, released).await.is_err() {
            return Err((
                Status::Retry,
                format!(
                    "snapshot read {what}: after {} s, {left} prepared transactions are still \
                     undecided and {updating} tablets are still being updated",
                    LOCK_WAIT.as_secs()
                ),
            ));
        }
    }
}

/// After the scan: the versions it read are still the ones kept since
/// before `S` (no reset, the floor not past `S`).
pub(crate) fn check_end(state: &ShardState, snap: &Snap) -> Result<(), Refusal> {
    let v = state.versions.borrow();
    let same = v.generation() == snap.generation && v.arrival(snap.tablet) == snap.arrival;
    match v.floor_for(snap.tablet) {
        Some(f) if same && f <= snap.ts => Ok(()),
        floor => Err(too_old(snap.ts, floor)),
    }
}

/// Kept keys visited between two yields while `Overlay::finish` feeds
/// values as of the snapshot (at most about half a millisecond of work,
/// measured with 64 MiB of versions kept).
const FINISH_BATCH: usize = 1024;

/// A sink that reads the tablet as of the snapshot: skips the current value
/// of every key changed after it, then (`finish`) feeds their values as of
/// the snapshot.
pub(crate) struct Overlay<'a, V> {
    pub inner: V,
    state: &'a ShardState,
    table: u64,
    range: (u64, u64),
    ts: u64,
    /// Only keys this source would visit (an integer-key source reads a
    /// range of keys, not the whole tablet).
    int_keys: Option<(u64, u64)>,
    /// Versions kept from this number on came after the attempt began, so
    /// they are not this attempt's (`Versions::next_seq`).
    seq: u64,
    /// The table had a kept commit later than the snapshot when the attempt
    /// began; else a visited object needs no lookup.
    any: bool,
}

impl<'a, V: ObjectSink> Overlay<'a, V> {
    /// Made just before the scan's first attempt (no yield in between), so
    /// the kept versions counted are those up to the attempt's instant.
    pub fn new(
        inner: V,
        state: &'a ShardState,
        (table, range): (u64, (u64, u64)),
        snap: &Snap,
        source: &Source,
    ) -> Self {
        let v = state.versions.borrow();
        Overlay {
            inner,
            state,
            table,
            range,
            ts: snap.ts,
            int_keys: match *source {
                Source::IntKeys { from, to } => Some((from, to)),
                _ => None,
            },
            seq: v.next_seq(),
            any: v.changed_after(table, snap.ts),
        }
    }

    /// The scan completed: feed the changed keys' values as of the snapshot,
    /// a batch at a time with a yield between. A commit applied meanwhile
    /// keeps versions numbered from `seq` on, which are not counted, so the
    /// values fed are those of the attempt's instant; a version that goes
    /// meanwhile raises the floor past the snapshot or did not matter to it
    /// (`check_end` then refuses or not).
    pub async fn finish(self) -> V {
        let Overlay {
            mut inner,
            state,
            table,
            range,
            ts,
            int_keys,
            seq,
            any,
        } = self;
        if !any {
            return inner;
        }
        let mut from = None;
        loop {
            let next = state.versions.borrow().changed_in(
                table,
                range,
                from.take(),
                (ts, seq),
                FINISH_BATCH,
                |key, value| {
                    let Some(value) = value else { return };
                    if let Some((from, to)) = int_keys {
                        let Ok(k) = <[u8; 8]>::try_from(key) else {
                            return;
                        };
                        if !(from..to).contains(&u64::from_le_bytes(k)) {
                            return;
                        }
                    }
                    inner.object(key, value);
                },
            );
            match next {
                None => return inner,
                Some(pos) => {
                    from = Some(pos);
                    tokio::task::yield_now().await;
                }
            }
        }
    }
}

impl<V: ObjectSink> ObjectSink for Overlay<'_, V> {
    #[inline]
    fn object(&mut self, key: &[u8], value: &[u8]) {
        if self.any
            && self
                .state
                .versions
                .borrow()
                .as_of(self.table, key, self.ts, self.seq)
                .is_some()
        {
            return;
        }
        self.inner.object(key, value)
    }
    /// A new attempt (the tablet changed): the versions up to its instant.
    fn reset(&mut self) {
        self.inner.reset();
        let v = self.state.versions.borrow();
        self.seq = v.next_seq();
        self.any = v.changed_after(self.table, self.ts);
    }
    fn done(&self) -> bool {
        self.inner.done()
    }
}
