use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use insitu_engine::{Engine, EngineConfig};
use proptest::prelude::*;

use super::*;

fn engine() -> Engine {
    Engine::new(EngineConfig::default()).expect("engine")
}

/// Keep with the engine's budget.
fn keep(v: &mut Versions, e: &Engine, key: &[u8], ts: u64, before: Option<&[u8]>, now: Instant) {
    v.keep((1, key, 7), ts, before, now, |n| {
        e.try_charge_transient(n).ok()
    });
}

#[test]
fn nothing_is_kept_until_a_snapshot_is_read() {
    let e = engine();
    let mut v = Versions::default();
    let now = Instant::now();
    keep(&mut v, &e, b"a", 5, Some(b"old"), now);
    assert_eq!(v.kept_bytes(), 0);
    assert!(v.changed_after(1, (0, u64::MAX), 1).keys.is_empty());
    v.note_read(now);
    let g = v.generation();
    v.set_floor(g, 10);
    keep(&mut v, &e, b"a", 11, Some(b"old"), now);
    let c = v.changed_after(1, (0, u64::MAX), 10);
    assert_eq!(c.values, vec![(b"a".to_vec(), Some(b"old".to_vec()))]);
    assert!(v.changed_after(1, (0, u64::MAX), 11).keys.is_empty());
    // Another table, or a tablet without the key's hash, has nothing.
    assert!(v.changed_after(2, (0, u64::MAX), 10).keys.is_empty());
    assert!(v.changed_after(1, (8, u64::MAX), 10).keys.is_empty());
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
    assert_eq!(v.kept_bytes(), 0);
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
    let c = v.changed_after(1, (0, u64::MAX), 5);
    assert_eq!(c.values, vec![(b"a".to_vec(), Some(b"y".to_vec()))]);
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
    v.keep((1, b"a", 7), 40, Some(b"x"), now, |_| None);
    assert_eq!(v.floor(), Some(40));
    assert_eq!(v.kept_bytes(), 0);
}

#[test]
fn the_byte_limit_drops_the_oldest() {
    let e = Engine::new(EngineConfig {
        memory_budget_bytes: 1 << 30,
        ..EngineConfig::default()
    })
    .expect("engine");
    let mut v = Versions::default();
    let now = Instant::now();
    v.note_read(now);
    v.set_floor(v.generation(), 1);
    let value = vec![0u8; 1 << 20];
    for ts in 2..80u64 {
        keep(&mut v, &e, &ts.to_le_bytes(), ts, Some(&value), now);
        assert!(v.kept_bytes() <= MAX_BYTES);
    }
    let floor = v.floor().expect("floor");
    assert!(floor > 2, "the oldest went: floor {floor}");
    // Every version above the floor is still answered.
    let c = v.changed_after(1, (0, u64::MAX), floor);
    assert_eq!(c.keys.len() as u64, 79 - floor);
}

proptest! {
    /// Against a model of every key's whole history: for any snapshot at or
    /// above the floor, the kept versions and the current values give
    /// exactly the values as of the snapshot.
    #[test]
    fn snapshots_match_the_whole_history(
        ops in proptest::collection::vec((0u8..6, proptest::option::of(0u8..50), 0u64..3), 1..120),
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
        for (i, (key, value, gap)) in ops.iter().enumerate() {
            ts += 1 + gap;
            let before = current.get(key).map(|b| vec![*b]);
            let now = t0 + Duration::from_millis(i as u64 * 500);
            v.expire(now);
            v.note_read(now);
            keep(&mut v, &e, &[*key], ts, before.as_deref(), now);
            match value {
                Some(b) => { current.insert(*key, *b); }
                None => { current.remove(key); }
            }
            history.entry(*key).or_default().push((ts, *value));
        }
        let floor = v.floor().expect("floor");
        for s in probes {
            let s = s.max(floor);
            let changed = v.changed_after(1, (0, u64::MAX), s);
            for key in 0u8..6 {
                let expect = history.get(&key).and_then(|h| {
                    h.iter().rev().find(|(t, _)| *t <= s).and_then(|(_, v)| *v)
                });
                let got = if changed.keys.contains(&vec![key]) {
                    changed.values.iter().find(|(k, _)| *k == vec![key]).and_then(|(_, v)| v.as_ref().map(|v| v[0]))
                } else {
                    current.get(&key).copied()
                };
                prop_assert_eq!(got, expect, "key {} at snapshot {} (floor {})", key, s, floor);
            }
        }
    }
}

#[test]
fn an_arrived_tablet_needs_its_own_floor_and_forgets_its_keys() {
    let e = engine();
    let mut v = Versions::default();
    let now = Instant::now();
    v.note_read(now);
    v.set_floor(v.generation(), 10);
    // Key hash 7 (see `keep`) is in the tablet 0..=100, not in 200..=300.
    keep(&mut v, &e, b"a", 11, Some(b"x"), now);
    v.arrive(1, (200, 300));
    assert_eq!(
        v.floor_for((1, 0)),
        Some(10),
        "another tablet is unaffected"
    );
    assert_eq!(v.changed_after(1, (0, 100), 10).keys.len(), 1);
    v.arrive(1, (0, 100));
    assert_eq!(v.floor_for((1, 0)), None, "to be learned after the arrival");
    assert!(v.changed_after(1, (0, 100), 10).keys.is_empty());
    assert_eq!(v.kept_bytes(), 0);
    let tag = v.fetch_tag((1, 0));
    // A second arrival while the fetch was out: that fetch does not count.
    v.arrive(1, (0, 100));
    v.set_floors((1, 0), tag, 20);
    assert_eq!(v.floor_for((1, 0)), None);
    let tag = v.fetch_tag((1, 0));
    v.set_floors((1, 0), tag, 30);
    assert_eq!(v.floor_for((1, 0)), Some(30));
    assert_eq!(v.floor_for((1, 200)), None, "the other arrival still waits");
    // A reset forgets arrivals with everything else.
    v.reset();
    v.note_read(now);
    v.set_floor(v.generation(), 40);
    assert_eq!(v.floor_for((1, 0)), Some(40));
}
