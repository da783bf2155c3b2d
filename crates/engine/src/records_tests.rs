//! Unit tests of side records that need the engine's insides: the records
//! map's budget charge, and `check_consistency` catching a drifted map. The
//! behaviour through the public API is tested in `tests/records.rs`.

use super::*;
use crate::test_engine::engine_with;

const T: u64 = 4;

fn engine() -> Engine {
    engine_with(4096, 64, 512, &[T])
}

fn rid(id: u64) -> RecordId {
    RecordId { class: 1, id }
}

/// An engine holding the first `n` of records 1 (anchor `a`) and 2 (anchor
/// `b`), checked consistent: where each corruption below starts from.
fn engine_with_records(n: usize) -> Engine {
    let mut e = engine();
    for (anchor, id, payload) in [(b"a", 1, b"x"), (b"b", 2, b"y")].into_iter().take(n) {
        e.put_record(T, anchor, rid(id), payload).expect("put");
    }
    e.check_invariants();
    e
}

fn only_tablet(e: &mut Engine) -> &mut Tablet {
    e.tablets.iter_mut().flatten().next().expect("one tablet")
}

#[test]
fn map_growth_is_predicted_exactly_and_charged_as_index_bytes() {
    let mut map: hashbrown::HashMap<RecordId, u64> = hashbrown::HashMap::new();
    for i in 0..20_000u64 {
        let before = map.allocation_size();
        let predicted = index::growth_bytes_of(
            (map.len(), map.capacity(), map.allocation_size()),
            MAP_ITEM_BYTES,
            1,
        );
        map.try_reserve(1).expect("reserve");
        index::assert_growth_predicted(i, before, predicted, map.allocation_size());
        map.insert(rid(i), i);
    }
    // Through the engine: the charge follows the map, and goes with the tablet.
    let mut e = engine();
    let index_only = e.memory().index_bytes;
    for i in 0..100 {
        e.put_record(T, b"anchor", rid(i), b"p").expect("put");
    }
    let t = only_tablet(&mut e);
    let charged = t.records_charged_bytes;
    assert_eq!(charged, t.records.allocation_size() as u64);
    assert!(charged > 0);
    assert_eq!(e.memory().index_bytes, index_only + charged);
    e.check_invariants();
    assert!(e.drop_tablet(T, 0));
    assert_eq!(e.memory().index_bytes, 0);
}

#[test]
#[should_panic(expected = "is not the mapped one")]
fn check_consistency_catches_a_live_record_missing_from_the_map() {
    let mut e = engine_with_records(2);
    only_tablet(&mut e).records.remove(&rid(2));
    e.check_invariants();
}

#[test]
#[should_panic(expected = "records map and log disagree")]
fn check_consistency_catches_a_map_entry_pointing_at_a_dead_entry() {
    let mut e = engine_with_records(1);
    let t = only_tablet(&mut e);
    let l = t.records[&rid(1)];
    // Dead and not counted, as if superseded, but still mapped.
    t.record_bytes -= t.kill_record(l);
    e.check_invariants();
}

#[test]
#[should_panic(expected = "is not the mapped one")]
fn check_consistency_catches_a_map_entry_pointing_elsewhere() {
    let mut e = engine_with_records(2);
    let t = only_tablet(&mut e);
    let two = t.records[&rid(2)];
    t.records.insert(rid(1), two);
    e.check_invariants();
}

/// A record removal counts like a tombstone in its segment: bytes, the
/// recorded segment id (which orders replica frees), and the cleaner's rule.
#[test]
fn a_removal_is_accounted_as_a_tombstone() {
    let mut e = engine();
    e.put_record(T, b"a", rid(1), &[7; 100]).expect("put");
    // Roll to a new head so the removal records segment id 2.
    let rules = crate::RejectRules::default();
    let mut i = 0u32;
    while e.tablet_stats(T, 0).expect("stats").segments < 2 {
        e.write(T, &i.to_le_bytes(), &[1; 200], &rules)
            .expect("write");
        i += 1;
    }
    assert!(e.remove_record(T, b"a", rid(1)).expect("remove"));
    let t = only_tablet(&mut e);
    let head = t.head.expect("head") as usize;
    let seg = &t.segs[head];
    assert_eq!(seg.max_tombstone_segment, 2);
    let len = entry::entry_bytes(1, entry::RECORD_REMOVED_VALUE_BYTES, t.next_version - 1);
    assert_eq!(seg.tombstone_bytes, len as u64);
    assert_eq!(t.record_bytes, 0);
    let mut seen = 0;
    e.for_each_segment(|v| {
        if v.segment == 2 {
            seen += 1;
            assert_eq!(v.max_tombstone_segment, 2, "replicators see it");
        }
    });
    assert_eq!(seen, 1);
    e.check_invariants();
}
