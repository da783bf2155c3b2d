//! The timestamp oracle: strictly increasing, never 0, the reservation
//! honoured (on record before anything past it is handed out, and a restart
//! over the same redb file continues above everything handed out), the
//! clock followed forward only, reservation writes rare, counts refused
//! outside 1..=MAX_TIMESTAMPS.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use insitu_protocol::{MAX_TIMESTAMPS, Request, Response, Status};

use super::*;
use crate::store::Store;

/// A clock stuck at the epoch: only the reservation keeps timestamps
/// increasing (across a restart too).
fn frozen() -> u64 {
    0
}

/// A fake redb for `Oracle::take`'s `persist`.
#[derive(Default)]
struct Disk {
    /// The reservation on record: what a restart would start from.
    reserved: AtomicU64,
    /// Reservation writes so far: each is an fsync in the real store.
    writes: AtomicUsize,
    /// Writes fail while set (a full or broken disk).
    fail: AtomicBool,
}

impl Disk {
    async fn persist(&self, reservation: u64) -> Result<(), Reject> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(Reject::internal("injected: the disk is gone"));
        }
        self.reserved.fetch_max(reservation, Ordering::SeqCst);
        self.writes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Take `count` from `oracle` over `disk` and check the one rule every
/// answer must keep: all of it below the reservation on record. Returns the
/// first and the last timestamp handed out.
async fn take(oracle: &Oracle, disk: &Disk, count: u32) -> Result<(u64, u64), Reject> {
    let first = oracle.take(count, |r| disk.persist(r)).await?;
    let last = first + u64::from(count) - 1;
    assert!(
        last < disk.reserved.load(Ordering::SeqCst),
        "{first}..={last} handed out beyond the reservation on record"
    );
    Ok((first, last))
}

#[tokio::test]
async fn timestamps_strictly_increase_are_never_zero_and_stay_below_the_reservation() {
    let oracle = Oracle::with_clock(0, frozen);
    let disk = Disk::default();
    let (mut previous, mut total) = (0u64, 0u64);
    for i in 0..2000u32 {
        let count = [1, 7, MAX_TIMESTAMPS, 3, 1000][i as usize % 5];
        let (first, last) = take(&oracle, &disk, count).await.unwrap();
        assert!(first > previous, "{first} after {previous}");
        assert_ne!(first, 0);
        (previous, total) = (last, total + u64::from(count));
    }
    // Counting from 1 with a frozen clock: no gaps, and one write per
    // RESERVE_AHEAD handed out.
    assert_eq!(previous, total);
    let writes = disk.writes.load(Ordering::SeqCst) as u64;
    assert!(writes <= total / RESERVE_AHEAD + 1, "{writes} writes");
}

#[tokio::test]
async fn reservations_are_written_rarely_and_timestamps_follow_the_clock() {
    let oracle = Oracle::new(0);
    let disk = Disk::default();
    let started = std::time::Instant::now();
    let before = now_micros();
    let (first, _) = take(&oracle, &disk, 1).await.unwrap();
    assert!(first >= before, "{first} is behind the clock ({before})");
    for _ in 0..100_000 {
        take(&oracle, &disk, 1).await.unwrap();
    }
    let (last, _) = take(&oracle, &disk, 1).await.unwrap();
    assert!(
        last <= now_micros() + 100_002,
        "{last} ran ahead of the clock"
    );
    // One reservation lasts RESERVE_AHEAD microseconds of clock.
    let expected = 1 + started.elapsed().as_micros() as u64 / RESERVE_AHEAD + 1;
    let writes = disk.writes.load(Ordering::SeqCst) as u64;
    assert!(writes <= expected, "{writes} writes for 100,002 timestamps");
}

/// The clock of `the_clock_is_followed_forward_never_back`.
static CLOCK: AtomicU64 = AtomicU64::new(5_000_000);

#[tokio::test]
async fn the_clock_is_followed_forward_never_back() {
    let oracle = Oracle::with_clock(0, || CLOCK.load(Ordering::SeqCst));
    let disk = Disk::default();
    assert_eq!(
        take(&oracle, &disk, 10).await.unwrap(),
        (5_000_000, 5_000_009)
    );
    CLOCK.store(1_000, Ordering::SeqCst);
    assert_eq!(take(&oracle, &disk, 1).await.unwrap().0, 5_000_010);
    CLOCK.store(1 << 50, Ordering::SeqCst);
    assert_eq!(take(&oracle, &disk, 1).await.unwrap().0, 1 << 50);
    // A restart whose clock is behind starts at the reservation.
    CLOCK.store(1_000, Ordering::SeqCst);
    let restarted = Oracle::with_clock(disk.reserved.load(Ordering::SeqCst), || {
        CLOCK.load(Ordering::SeqCst)
    });
    assert!(take(&restarted, &disk, 1).await.unwrap().0 > 1 << 50);
}

#[tokio::test]
async fn a_failed_reservation_write_hands_out_nothing_past_the_old_one() {
    let oracle = Oracle::with_clock(0, frozen);
    let disk = Disk::default();
    disk.fail.store(true, Ordering::SeqCst);
    assert!(
        take(&oracle, &disk, 1).await.is_err(),
        "nothing is on record"
    );
    disk.fail.store(false, Ordering::SeqCst);
    let (mut last, mut refused) = (take(&oracle, &disk, 1).await.unwrap().1, 0);
    disk.fail.store(true, Ordering::SeqCst);
    // Below the reservation the oracle goes on; past it, every request fails.
    for _ in 0..2 * RESERVE_AHEAD / u64::from(MAX_TIMESTAMPS) {
        match take(&oracle, &disk, MAX_TIMESTAMPS).await {
            Ok((first, l)) => {
                assert!(first > last);
                last = l;
            }
            Err(e) => {
                assert_eq!(e.status, Status::Internal);
                refused += 1;
            }
        }
    }
    assert!(refused > 0);
    let restarted = Oracle::with_clock(disk.reserved.load(Ordering::SeqCst), frozen);
    disk.fail.store(false, Ordering::SeqCst);
    assert!(take(&restarted, &disk, 1).await.unwrap().0 > last);
}

use crate::test_dir::TestDir as TempDir;

/// A coordinator over the redb file in `dir`, its oracle on `clock`, and
/// the reservation the open found.
fn open(dir: &TempDir, clock: fn() -> u64) -> (Coordinator, u64) {
    let (store, model, opened) = Store::open(&dir.0, 2).unwrap();
    let reservation = opened.timestamp_reservation;
    let mut coord = Coordinator::new(
        store,
        model,
        0,
        insitu_auth::Credentials::none(),
        reservation,
    );
    coord.oracle = Oracle::with_clock(reservation, clock);
    (coord, reservation)
}

/// The first timestamp of a `Timestamps` request of `count`.
async fn request(coord: &Coordinator, count: u32) -> Result<u64, Reject> {
    match coord.handle(Request::Timestamps { count }).await? {
        Response::Timestamps { first, count: n } => {
            assert_eq!(n, count);
            Ok(first)
        }
        other => panic!("{other:?} to Timestamps"),
    }
}

#[tokio::test]
async fn a_restart_over_the_same_redb_file_continues_above_everything_handed_out() {
    let dir = TempDir::new("restart");
    let mut last = 0;
    for run in 0..3 {
        // The clock is stuck, so only the reservation on record can put the
        // restart above what the previous run handed out.
        let (coord, reservation) = open(&dir, frozen);
        assert!(run == 0 || reservation > last, "run {run}");
        // Past two reservations, then many more after the last write.
        let requests = 2 * RESERVE_AHEAD / u64::from(MAX_TIMESTAMPS) + 77;
        for _ in 0..requests {
            let first = request(&coord, MAX_TIMESTAMPS).await.unwrap();
            assert!(first > last, "run {run}: {first} after {last}");
            last = first + u64::from(MAX_TIMESTAMPS) - 1;
        }
        // Stopped like a killed process: the database is not closed.
        drop(coord);
    }
    let (coord, _) = open(&dir, now_micros);
    assert!(request(&coord, 1).await.unwrap() > last);
    coord.close().await;
}

#[tokio::test]
async fn counts_outside_the_limits_are_refused() {
    let dir = TempDir::new("limits");
    let (coord, _) = open(&dir, now_micros);
    for count in [0, MAX_TIMESTAMPS + 1, u32::MAX] {
        let e = request(&coord, count).await.unwrap_err();
        assert_eq!(e.status, Status::BadRequest);
        assert!(
            e.message.contains(&format!("1 to {MAX_TIMESTAMPS}")),
            "{}",
            e.message
        );
    }
    let first = request(&coord, MAX_TIMESTAMPS).await.unwrap();
    assert!(request(&coord, 1).await.unwrap() >= first + u64::from(MAX_TIMESTAMPS));
    coord.close().await;
    // A closed coordinator hands out nothing it could not put on record:
    // what is left of the reservation, then refusals.
    let mut refused = false;
    for _ in 0..2 * RESERVE_AHEAD / u64::from(MAX_TIMESTAMPS) {
        if let Err(e) = request(&coord, MAX_TIMESTAMPS).await {
            assert_eq!(e.status, Status::Internal, "{}", e.message);
            refused = true;
            break;
        }
    }
    assert!(refused, "timestamps handed out past the reservation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_get_disjoint_ranges() {
    let dir = TempDir::new("concurrent");
    let coord = Arc::new(open(&dir, now_micros).0);
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let coord = coord.clone();
            tokio::spawn(async move {
                let mut ranges = Vec::new();
                for i in 0..200u32 {
                    let count = (t * 7 + i) % 5 + 1;
                    let first = request(&coord, count).await.unwrap();
                    ranges.push((first, first + u64::from(count) - 1));
                }
                ranges
            })
        })
        .collect();
    let mut ranges = Vec::new();
    for task in tasks {
        let mine = task.await.unwrap();
        // One caller's requests follow each other, so they increase.
        assert!(mine.windows(2).all(|w| w[1].0 > w[0].1));
        ranges.extend(mine);
    }
    ranges.sort_unstable();
    assert!(ranges[0].0 > 0);
    assert!(
        ranges.windows(2).all(|w| w[1].0 > w[0].1),
        "overlapping ranges"
    );
}
