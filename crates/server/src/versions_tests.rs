use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use insitu_engine::{Engine, EngineConfig};
use proptest::prelude::*;

use super::*;

fn engine() -> Engine {
    Engine::new(EngineConfig::default()).expect("engine")
}

/// An engine whose budget holds `MAX_BYTES` of versions and more.
fn big_engine() -> Engine {
    Engine::new(EngineConfig {
        memory_budget_bytes: 1 << 30,
        ..EngineConfig::default()
    })
    .expect("engine")
}

/// Versions kept since a read at `now`, with the floor learned at `floor`.
fn keeping(now: Instant, floor: u64) -> Versions {
    let mut v = Versions::default();
    v.note_read(now);
    v.set_floor(v.generation(), floor);
    v
}

/// An object with no deadline, as `keep` takes it.
fn plain(version: u64, value: &[u8]) -> Before<'_> {
    Before {
        version,
        value,
        expires_at_ms: 0,
    }
}

/// Keep with the engine's budget.
/// The version kept with a value is its first byte (0 for none).
fn keep(v: &mut Versions, e: &Engine, key: &[u8], ts: u64, before: Option<&[u8]>, now: Instant) {
    let before = before.map(|b| plain(u64::from(b.first().copied().unwrap_or(0)), b));
    v.keep((1, key, 7), ts, before, now, |n| {
        e.try_charge_transient(n).ok()
    });
}

/// Every key of `table`'s tablet `range` changed after `ts` (counting every
/// version kept so far), with its value then, walked 2 keys a batch.
fn changed(
    v: &Versions,
    table: u64,
    range: (u64, u64),
    ts: u64,
) -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut from = None;
    loop {
        from = v.changed_in(table, range, from, (ts, v.next_seq()), 2, |k, b| {
            assert!(
                out.insert(k.to_vec(), b.map(<[u8]>::to_vec)).is_none(),
                "a key twice"
            );
        });
        if from.is_none() {
            return out;
        }
    }
}

#[test]
fn a_kept_object_is_absent_to_snapshots_from_its_deadline_on() {
    let e = engine();
    let now = Instant::now();
    // Timestamps in microseconds: the deadline, 5 ms, is 5,000; the commit
    // that replaced the object (after it had expired) is at 9,000.
    let mut v = keeping(now, 1_000);
    let expiring = Before {
        version: 3,
        value: b"x",
        expires_at_ms: 5,
    };
    v.keep((1, b"a", 7), 9_000, Some(expiring), now, |n| {
        e.try_charge_transient(n).ok()
    });
    let seq = v.next_seq();
    assert_eq!(v.as_of(1, b"a", 4_999, seq), Some(Some((3, &b"x"[..]))));
    assert_eq!(v.as_of(1, b"a", 5_000, seq), Some(None), "at its deadline");
    assert_eq!(v.as_of(1, b"a", 8_999, seq), Some(None));
    assert_eq!(v.as_of(1, b"a", 9_000, seq), None, "the commit's own");
    let before = changed(&v, 1, (0, u64::MAX), 4_999);
    assert_eq!(
        before,
        BTreeMap::from([(b"a".to_vec(), Some(b"x".to_vec()))])
    );
    let after = changed(&v, 1, (0, u64::MAX), 5_000);
    assert_eq!(after, BTreeMap::from([(b"a".to_vec(), None)]));
    assert!(!expired_at(0, u64::MAX), "no deadline never expires");
    assert!(expired_at(5, 5_000) && !expired_at(5, 4_999));
}

#[test]
fn nothing_is_kept_until_a_snapshot_is_read() {
    let e = engine();
    let mut v = Versions::default();
    let now = Instant::now();
    keep(&mut v, &e, b"a", 5, Some(b"old"), now);
    assert_eq!(v.kept_bytes(), 0);
    assert!(changed(&v, 1, (0, u64::MAX), 1).is_empty());
    assert!(!v.changed_after(1, 0));
    v.note_read(now);
    let g = v.generation();
    v.set_floor(g, 10);
    keep(&mut v, &e, b"a", 11, Some(b"old"), now);
    let c = changed(&v, 1, (0, u64::MAX), 10);
    assert_eq!(c, BTreeMap::from([(b"a".to_vec(), Some(b"old".to_vec()))]));
    assert_eq!(
        v.as_of(1, b"a", 10, v.next_seq()),
        Some(Some((u64::from(b'o'), &b"old"[..])))
    );
    assert_eq!(
        v.as_of(1, b"a", 11, v.next_seq()),
        None,
        "as of 11 it is now"
    );
    assert_eq!(v.as_of(1, b"b", 10, v.next_seq()), None, "never changed");
    assert!(changed(&v, 1, (0, u64::MAX), 11).is_empty());
    // Another table, or a tablet without the key's hash, has nothing.
    assert!(changed(&v, 2, (0, u64::MAX), 10).is_empty());
    assert!(changed(&v, 1, (8, u64::MAX), 10).is_empty());
    assert!(v.changed_after(1, 10) && !v.changed_after(1, 11) && !v.changed_after(2, 0));
}

#[test]
fn versions_kept_after_a_read_began_are_not_its() {
    let e = engine();
    let mut v = Versions::default();
    let now = Instant::now();
    v.note_read(now);
    v.set_floor(v.generation(), 10);
    keep(&mut v, &e, b"a", 11, Some(b"a0"), now);
    let began = v.next_seq();
    keep(&mut v, &e, b"a", 12, Some(b"a1"), now);
    keep(&mut v, &e, b"b", 13, Some(b"b0"), now);
    // The read at 11 began before the commits at 12 and 13 were applied:
    // it saw a and b as they were then (a1, b0), so neither is changed
    // for it; a is as of 11 already, b too.
    assert_eq!(v.as_of(1, b"a", 11, began), None);
    assert_eq!(v.as_of(1, b"b", 11, began), None);
    assert_eq!(
        v.as_of(1, b"a", 10, began),
        Some(Some((u64::from(b'a'), &b"a0"[..])))
    );
    let mut seen = Vec::new();
    v.changed_in(1, (0, u64::MAX), None, (10, began), 100, |k, b| {
        seen.push((k.to_vec(), b.map(<[u8]>::to_vec)))
    });
    assert_eq!(seen, vec![(b"a".to_vec(), Some(b"a0".to_vec()))]);
}

#[test]
fn a_version_gone_before_the_floor_is_learned_still_raises_it() {
    let mut v = Versions::default();
    let now = Instant::now();
    v.note_read(now);
    // Refused while the floor is being fetched: snapshots before 40 can no
    // longer be read, whatever floor the fetch brings.
    v.keep((1, b"a", 7), 40, Some(plain(1, b"x")), now, |_| None);
    v.set_floor(v.generation(), 10);
    assert_eq!(v.floor(), Some(40));
    assert_eq!(v.floor_for((1, 0)), Some(40));
}

#[test]
fn the_sweep_drains_a_bounded_number_per_step() {
    let e = big_engine();
    let now = Instant::now();
    let mut v = keeping(now, 1);
    let n = DRAIN_PER_STEP as u64 + 10;
    for i in 0..n {
        keep(&mut v, &e, &i.to_le_bytes(), 2 + i, None, now);
    }
    v.reset();
    assert!(v.kept_bytes() > 0, "a reset forgets nothing at once");
    assert!(v.expire(now), "more to drain");
    assert_eq!(
        v.kept_bytes(),
        10 * (8 + ENTRY_OVERHEAD),
        "one step's worth went"
    );
    assert!(!v.expire(now), "all drained");
    assert_eq!(v.kept_bytes(), 0);
    assert!(!v.changed_after(1, 0));
    assert_eq!(e.memory().transient_bytes, 0);
}

#[test]
fn a_reset_forgets_and_a_stale_floor_fetch_does_not_count() {
    let e = engine();
    let mut v = Versions::default();
    let now = Instant::now();
    v.note_read(now);
    let g = v.generation();
    keep(&mut v, &e, b"a", 3, None, now);
    v.reset();
    assert!(!v.is_active());
    v.expire(now);
    assert_eq!(v.kept_bytes(), 0, "the sweep drains a reset's versions");
    assert_eq!(e.memory().transient_bytes, 0, "the charges are released");
    v.note_read(now);
    v.set_floor(g, 10);
    assert_eq!(v.floor(), None, "a floor fetched before the reset");
    v.set_floor(v.generation(), 12);
    assert_eq!(v.floor(), Some(12));
}

#[test]
fn expiry_and_idleness_raise_the_floor_or_stop_keeping() {
    let e = engine();
    let mut v = Versions::default();
    let t0 = Instant::now();
    v.note_read(t0);
    v.set_floor(v.generation(), 1);
    keep(&mut v, &e, b"a", 5, Some(b"x"), t0);
    keep(&mut v, &e, b"a", 9, Some(b"y"), t0 + KEEP / 2);
    v.note_read(t0 + KEEP / 2);
    v.expire(t0 + KEEP);
    assert_eq!(v.floor(), Some(5), "the commit at 5 is forgotten");
    let c = changed(&v, 1, (0, u64::MAX), 5);
    assert_eq!(c, BTreeMap::from([(b"a".to_vec(), Some(b"y".to_vec()))]));
    v.expire(t0 + KEEP / 2 + IDLE);
    assert!(!v.is_active());
    assert_eq!(v.floor(), None);
    assert_eq!(e.memory().transient_bytes, 0);
}

#[test]
fn a_refused_charge_raises_the_floor_past_the_commit() {
    let mut v = Versions::default();
    let now = Instant::now();
    v.note_read(now);
    v.set_floor(v.generation(), 1);
    v.keep((1, b"a", 7), 40, Some(plain(1, b"x")), now, |_| None);
    assert_eq!(v.floor(), Some(40));
    assert_eq!(v.kept_bytes(), 0);
}

#[test]
fn the_byte_limit_drops_the_oldest() {
    let e = big_engine();
    let now = Instant::now();
    let mut v = keeping(now, 1);
    let value = vec![0u8; 1 << 20];
    for ts in 2..80u64 {
        keep(&mut v, &e, &ts.to_le_bytes(), ts, Some(&value), now);
        assert!(v.kept_bytes() <= MAX_BYTES);
    }
    let floor = v.floor().expect("floor");
    assert!(floor > 2, "the oldest went: floor {floor}");
    // Every version above the floor is still answered.
    let c = changed(&v, 1, (0, u64::MAX), floor);
    assert_eq!(c.len() as u64, 79 - floor);
}

proptest! {
    /// Against a model of every key's whole history: for any snapshot at or
    /// above the floor, the kept versions and the current values give
    /// exactly the values as of the snapshot.
    /// Against a model of every key's whole history: for any snapshot at or
    /// above the floor, the kept versions and the current values give
    /// exactly the values as of the snapshot, by a lookup (`as_of`) and by a
    /// walk of the tablet (`changed_in`) alike. Keeping stops and starts
    /// again (kind 7: commits meanwhile are not kept) and the tablet
    /// arrives again (kind 6), leaving stale versions behind.
    #[test]
    fn snapshots_match_the_whole_history(
        ops in proptest::collection::vec(
            (0u8..8, 0u8..6, proptest::option::of(0u8..50), 0u64..3), 1..120),
        probes in proptest::collection::vec(0u64..400, 1..20),
    ) {
        let e = engine();
        let mut v = Versions::default();
        let t0 = Instant::now();
        v.note_read(t0);
        v.set_floor(v.generation(), 0);
        // key -> [(commit ts, value after)], in commit order.
        let mut history: BTreeMap<u8, Vec<(u64, Option<u8>)>> = BTreeMap::new();
        let mut current: BTreeMap<u8, u8> = BTreeMap::new();
        let mut ts = 0u64;
        for (i, (kind, key, value, gap)) in ops.iter().enumerate() {
            ts += 1 + gap;
            let now = t0 + Duration::from_millis(i as u64 * 500);
            v.expire(now);
            if *kind == 7 {
                v.reset();
            }
            if *kind == 6 {
                v.arrive(1, (0, u64::MAX), None);
            }
            if *kind != 7 {
                v.note_read(now);
            }
            let before = current.get(key).map(|b| [*b]);
            // Hashes spread the keys over the tablet's range.
            let before = before.as_ref().map(|b| plain(u64::from(b[0]), &b[..]));
            v.keep((1, &[*key], u64::from(*key) << 56), ts, before, now, |n| {
                e.try_charge_transient(n).ok()
            });
            match value {
                Some(b) => { current.insert(*key, *b); }
                None => { current.remove(key); }
            }
            history.entry(*key).or_default().push((ts, *value));
            if *kind >= 6 {
                // Read again: the floor fetched now is above every commit.
                ts += 1;
                v.note_read(now);
                let tag = v.fetch_tag((1, 0));
                v.set_floors((1, 0), tag, ts);
            }
        }
        let floor = v.floor_for((1, 0)).expect("floor");
        for s in probes {
            let s = s.max(floor);
            let walked = changed(&v, 1, (0, u64::MAX), s);
            for key in 0u8..6 {
                let expect = history.get(&key).and_then(|h| {
                    h.iter().rev().find(|(t, _)| *t <= s).and_then(|(_, v)| *v)
                });
                let looked = v.as_of(1, &[key], s, v.next_seq());
                prop_assert_eq!(
                    looked.map(|b| b.map(|(_, b)| b.to_vec())),
                    walked.get(&vec![key]).cloned(),
                    "lookup and walk differ on key {}", key
                );
                let got = match looked {
                    Some(then) => then.map(|(version, b)| {
                        assert_eq!(version, u64::from(b[0]), "the version kept with the value");
                        b[0]
                    }),
                    None => current.get(&key).copied(),
                };
                prop_assert_eq!(got, expect, "key {} at snapshot {} (floor {})", key, s, floor);
            }
        }
    }
}

#[test]
fn an_arrived_tablet_needs_its_own_floor() {
    let e = engine();
    let mut v = Versions::default();
    let now = Instant::now();
    v.note_read(now);
    v.set_floor(v.generation(), 10);
    // Key hash 7 (see `keep`) is in the tablet 0..=100, not in 200..=300.
    keep(&mut v, &e, b"a", 11, Some(b"x"), now);
    v.arrive(1, (200, 300), None);
    assert_eq!(
        v.floor_for((1, 0)),
        Some(10),
        "another tablet is unaffected"
    );
    assert_eq!(changed(&v, 1, (0, 100), 10).len(), 1);
    v.arrive(1, (0, 100), None);
    assert_eq!(v.floor_for((1, 0)), None, "to be learned after the arrival");
    let tag = v.fetch_tag((1, 0));
    // A second arrival while the fetch was out: that fetch does not count.
    v.arrive(1, (0, 100), None);
    v.set_floors((1, 0), tag, 20);
    assert_eq!(v.floor_for((1, 0)), None);
    let tag = v.fetch_tag((1, 0));
    v.set_floors((1, 0), tag, 30);
    assert_eq!(v.floor_for((1, 0)), Some(30));
    // The version of the earlier stay is still kept but below the floor:
    // no snapshot this tablet admits reads it.
    assert!(v.kept_bytes() > 0);
    assert!(changed(&v, 1, (0, 100), 30).is_empty());
    assert_eq!(v.floor_for((1, 200)), None, "the other arrival still waits");
    // A reset forgets arrivals with everything else.
    v.reset();
    v.note_read(now);
    v.set_floor(v.generation(), 40);
    assert_eq!(v.floor_for((1, 0)), Some(40));
}

#[test]
fn a_moved_tablet_arrives_with_the_bound_it_carries() {
    let mut v = Versions::default();
    let now = Instant::now();
    v.note_read(now);
    v.set_floor(v.generation(), 10);
    // Its commits were all at or below 25: snapshots from 25 on are read
    // at once, no fetch from the oracle.
    v.arrive(1, (0, 100), Some(25));
    assert_eq!(v.floor_for((1, 0)), Some(25));
    // The shard's floor bounds commits applied here before keeping began,
    // none of them to the arrived objects: the bound alone counts.
    v.arrive(1, (200, 300), Some(3));
    assert_eq!(v.floor_for((1, 200)), Some(3));
    assert_eq!(v.floor_for((1, 600)), Some(10), "a tablet that stayed");
    // Each arrival is counted: a scan admitted before one is refused.
    let before = v.arrival((1, 0));
    v.arrive(1, (0, 100), Some(25));
    assert_ne!(v.arrival((1, 0)), before);
    // What it carried is what this shard's own moves of the table carry on.
    v.arrive(1, (400, 500), Some(60));
    assert_eq!(v.commits.carried(1), Ok(60));
    // Carried even while nothing is kept (no arrival recorded then).
    v.reset();
    v.arrive(2, (0, 100), Some(70));
    assert_eq!(v.commits.carried(2), Ok(70));
    assert_eq!(v.arrival((2, 0)), None);
    // A recovered tablet carries nothing: its floor is learned, and the
    // table's bound is unknown.
    v.note_read(now);
    v.set_floor(v.generation(), 80);
    v.arrive(2, (0, 100), None);
    assert_eq!(v.floor_for((2, 0)), None);
    assert!(v.commits.carried(2).is_err());
}
