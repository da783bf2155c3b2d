//! Tombstones across cleaning and replay: a removed key must never come back.

mod shared;

use shared::{engine_of, segment_copies};

use insitu_engine::{Engine, HashRange, RejectRules};

const T: u64 = 9;
const SEGMENT_BYTES: usize = 4096;

fn engine() -> Engine {
    engine_of(SEGMENT_BYTES, 1 << 22, 512, &[T])
}

fn put(e: &mut Engine, key: &[u8], value: &[u8]) -> u64 {
    e.write(T, key, value, &RejectRules::default())
        .expect("write")
}

fn filler_key(i: usize) -> Vec<u8> {
    format!("filler-{i:04}").into_bytes()
}

/// Overwrite fillers 0..n so every segment holding their older versions becomes sparse.
fn churn(e: &mut Engine, n: usize, round: u8) {
    for i in 0..n {
        put(e, &filler_key(i), &[round; 300]);
    }
}

/// Replay the tablet's current segments into a fresh engine.
fn replayed(e: &Engine) -> Engine {
    let segments = segment_copies(e, T, 0);
    let mut fresh = engine();
    assert!(fresh.drop_tablet(T, 0));
    let report = fresh
        .replay(T, HashRange::FULL, segments.iter().map(|s| &s[..]))
        .expect("replay");
    assert!(report.corrupt.is_empty(), "{:?}", report.corrupt);
    fresh
}

/// The scenario: write v1, clean so it moves, write v2, remove,
/// clean repeatedly, replay: the key stays absent, also once the cleaner
/// has dropped the tombstone.
#[test]
fn removed_key_stays_absent_through_cleaning_and_replay() {
    let mut e = engine();
    let v1 = put(&mut e, b"victim", b"version one");
    churn(&mut e, 30, 0);
    churn(&mut e, 30, 1); // the segment with v1 is now mostly dead
    let moved_before = e.cleaner_totals().entries_moved;
    e.clean();
    assert!(
        e.cleaner_totals().entries_moved > moved_before,
        "v1 was moved by the cleaner"
    );
    assert_eq!(e.read(T, b"victim").expect("still there").version, v1);

    let v2 = put(&mut e, b"victim", b"version two");
    assert!(v2 > v1);
    assert_eq!(e.remove(T, b"victim", &RejectRules::default()), Ok(v2));

    for round in 2..40u8 {
        churn(&mut e, 30, round);
        e.clean();
        e.check_invariants();
        let r = replayed(&e);
        assert!(
            r.read(T, b"victim").is_err(),
            "removed key resurrected by replay after round {round}"
        );
        assert_eq!(r.tablet_stats(T, 0).expect("stats").object_count, 30);
    }
    assert!(
        e.cleaner_totals().tombstones_dropped > 0,
        "the tombstone was eventually dropped"
    );
    // Recreating it continues above every version it ever had, also after a replay.
    let mut r = replayed(&e);
    assert!(
        r.write(T, b"victim", b"again", &RejectRules::default())
            .expect("recreate")
            > v2
    );
}

/// The case that rules out recording the segment a tombstone landed in: the
/// head H is opened, then the cleaner creates survivor S (id > H) holding a
/// copy of v1, then the tombstone lands in H. When H is cleaned while S still
/// exists, the tombstone must be kept, or replaying S resurrects v1.
#[test]
fn tombstone_outlives_a_survivor_created_after_its_head() {
    let mut e = engine();
    put(&mut e, b"victim", b"version one");
    // Fill segment 1 and move on to a new head.
    let mut n = 0;
    while e.tablet_stats(T, 0).expect("stats").segments < 2 {
        put(&mut e, &filler_key(n), &[0; 300]);
        n += 1;
    }
    // Kill the fillers of segment 1; its only live object is the victim.
    churn(&mut e, n - 1, 1);
    let segments_before = e.tablet_stats(T, 0).expect("stats").segments;
    e.clean(); // the victim moves into a survivor created after the current head
    assert!(e.cleaner_totals().segments_cleaned > 0);
    assert!(e.tablet_stats(T, 0).expect("stats").segments <= segments_before);
    e.remove(T, b"victim", &RejectRules::default())
        .expect("remove");

    for round in 2..30u8 {
        churn(&mut e, n, round);
        e.clean();
        assert!(
            replayed(&e).read(T, b"victim").is_err(),
            "resurrected after round {round}"
        );
    }
}

/// Versions only grow for a key across remove and re-create, in place and
/// after the log is replayed (version marks survive dropped tombstones).
#[test]
fn versions_grow_across_remove_recreate_and_replay() {
    let mut e = engine();
    let mut last = 0;
    for round in 0..20u8 {
        let v = put(&mut e, b"k", &[round; 10]);
        assert!(v > last);
        assert_eq!(e.remove(T, b"k", &RejectRules::default()), Ok(v));
        last = v;
        churn(&mut e, 20, round);
        e.clean();
        if round % 5 == 4 {
            let next = e.tablet_stats(T, 0).expect("stats").next_version;
            e = replayed(&e);
            assert_eq!(e.tablet_stats(T, 0).expect("stats").next_version, next);
        }
    }
}
