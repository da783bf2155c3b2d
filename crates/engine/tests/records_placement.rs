//! Where side records land: a split sends each to the half holding its
//! anchor (and each half's own log replays to its records), and a group of
//! appends sized with `max_entry_bytes` after `reserve_head` lands in one
//! segment.

mod shared;

use std::collections::BTreeMap;

use insitu_engine::{Engine, EngineError, key_hash, max_entry_bytes};

#[path = "records/common.rs"]
mod common;
#[path = "records/raw.rs"]
mod raw;

use common::*;

/// Keys of table T whose hash is below (`low`) or at/above `at`.
fn keys_in_half(at: u64, low: bool, n: usize, tag: &str) -> Vec<Vec<u8>> {
    (0u64..)
        .map(|i| format!("{tag}-{i}").into_bytes())
        .filter(|k| (key_hash(T, k) < at) == low)
        .take(n)
        .collect()
}

#[test]
fn a_split_sends_each_record_to_the_half_holding_its_anchor() {
    let at = 1u64 << 63;
    // Split copies the half with fewer objects: try both halves moving.
    for upper_moves in [true, false] {
        let mut e = engine();
        for (i, k) in keys_in_half(at, upper_moves, 60, "obj").iter().enumerate() {
            e.write(T, k, &[i as u8; 40], &ANY).expect("write");
        }
        for k in keys_in_half(at, !upper_moves, 5, "few") {
            e.write(T, &k, b"few", &ANY).expect("write");
        }
        let mut model = BTreeMap::new();
        for i in 0..40u64 {
            let id = rid((i % 3) as u8, i);
            let payload = vec![i as u8; i as usize];
            e.put_record(T, &anchor(i), id, &payload).expect("put");
            model.insert(id, (anchor(i), payload));
        }
        // A record re-put under an anchor of the other half: the older entry,
        // in its first half's log, must not come back there on replay.
        let lows = keys_in_half(at, true, 1, "re");
        let highs = keys_in_half(at, false, 1, "re");
        let (first, second) = if upper_moves {
            (&lows[0], &highs[0])
        } else {
            (&highs[0], &lows[0])
        };
        let moved = rid(9, 9);
        e.put_record(T, first, moved, b"first").expect("put");
        e.put_record(T, second, moved, b"second").expect("re-put");
        model.insert(moved, (second.clone(), b"second".to_vec()));
        let next = e.tablet_stats(T, 0).expect("stats").next_version;

        e.split_tablet(T, at).expect("split");
        e.check_invariants();
        // The staying half logged a removal, with a version, for each record
        // that left it; the moved half keeps the counter.
        let leaving = model
            .values()
            .filter(|(a, _)| (key_hash(T, a) >= at) == upper_moves)
            .count() as u64;
        assert!(leaving > 0);
        for (start, low) in [(0, true), (at, false)] {
            let next = if low == upper_moves {
                next + leaving
            } else {
                next
            };
            let want: BTreeMap<_, _> = model
                .iter()
                .filter(|(_, (a, _))| (key_hash(T, a) < at) == low)
                .map(|(&id, v)| (id, v.clone()))
                .collect();
            assert!(!want.is_empty() && want.len() < model.len());
            check_records(&e, start, &want);
            assert_eq!(e.tablet_stats(T, start).expect("stats").next_version, next);
            // Each half's own log replays to the same records and counter.
            let (r, report) = replayed(&e, start);
            assert_eq!(report.records_loaded, want.len() as u64);
            check_records(&r, start, &want);
            assert_eq!(r.tablet_stats(T, start).expect("stats").next_version, next);
        }
        // The id is free in the half the record left: it may be put there anew.
        let back = if upper_moves { 0 } else { at };
        assert_eq!(e.record(T, first, moved), None);
        e.put_record(T, first, moved, b"third").expect("put");
        assert_eq!(
            e.record_count(T, back) + e.record_count(T, at - back),
            model.len() + 1
        );
        e.check_invariants();
    }
}

/// The segment id of each entry whose key starts with `tag` and whose
/// version is at least `from`, by the reference decoder.
fn segments_of(e: &Engine, tag: &[u8], from: u64) -> Vec<u64> {
    raw::log(e, T, 0)
        .into_iter()
        .filter(|(_, r)| r.key.starts_with(tag) && r.version >= from && r.kind != raw::KIND_MARK)
        .map(|(segment, _)| segment)
        .collect()
}

/// A group of six appends (write, increment, remove, record, record
/// replaced, record removal) tagged `tag`; returns its `reserve_head` size.
fn group(e: &mut Engine, tag: &str, reserve: bool) -> usize {
    let key = |s: &str| format!("{tag}{s}").into_bytes();
    let (w, n, x, r1, r2) = (key("w"), key("n"), key("x"), key("r1"), key("r2"));
    let payload = [5u8; 70];
    let bytes = max_entry_bytes(w.len(), 100)
        + max_entry_bytes(n.len(), 8)
        + max_entry_bytes(x.len(), 8)
        + max_entry_bytes(r1.len(), 9 + 40)
        + max_entry_bytes(r2.len(), 9 + payload.len())
        + max_entry_bytes(r2.len(), 17);
    if reserve {
        e.reserve_head(T, key_hash(T, &w), bytes).expect("reserve");
    }
    let id = rid(3, 3);
    e.write(T, &w, &[1; 100], &ANY).expect("write");
    e.increment_i64(T, &n, 1, &ANY).expect("increment");
    e.remove(T, &x, &ANY).expect("remove");
    e.put_record(T, &r1, id, &[4; 40]).expect("record");
    e.put_record(T, &r2, id, &payload).expect("record again");
    assert_eq!(e.remove_record(T, &r2, id), Ok(true));
    bytes
}

/// The unsealed segment's length (no cleaning ran: it is the head).
fn head_len(e: &Engine) -> usize {
    let mut len = None;
    e.for_each_segment(|v| {
        if !v.sealed {
            assert!(len.replace(v.bytes.len()).is_none(), "one open segment");
        }
    });
    len.expect("a head")
}

#[test]
fn a_reserved_group_lands_in_one_segment_and_an_unreserved_one_may_not() {
    for reserve in [false, true] {
        let mut e = engine();
        e.write(T, b"g-x", b"to remove", &ANY).expect("write");
        // Leave the head with room for the group's first entries but not all.
        let mut i = 0u32;
        while SEG - head_len(&e) >= 300 {
            e.write(T, format!("f{i}").as_bytes(), &[0; 20], &ANY)
                .expect("fill");
            i += 1;
        }
        let before = e.tablet_stats(T, 0).expect("stats").segments;
        let from = e.tablet_stats(T, 0).expect("stats").next_version;
        let bytes = group(&mut e, "g-", reserve);
        assert!(bytes > 300, "the group does not fit the old head");
        let places = segments_of(&e, b"g-", from);
        assert_eq!(places.len(), 6, "six entries");
        assert_eq!(e.tablet_stats(T, 0).expect("stats").segments, before + 1);
        let one_segment = places.iter().all(|&s| s == places[0]);
        assert_eq!(
            one_segment, reserve,
            "reserved {reserve}: segments {places:?}"
        );
        e.check_invariants();
    }
}

#[test]
fn reserved_groups_stay_whole_while_the_cleaner_runs() {
    let mut e = engine_with(64);
    let mut rolled = 0;
    for g in 0..300u32 {
        // Overwrites of a few keys leave dead data: incremental passes run
        // in slices after the group's own writes.
        for j in 0..(g % 7 + 1) {
            let k = format!("churn-{}", (j * 13 + g) % 30);
            e.write(
                T,
                k.as_bytes(),
                &vec![g as u8; 100 + (g * j) as usize % 250],
                &ANY,
            )
            .expect("churn");
        }
        let tag = format!("g{g}-");
        e.write(T, format!("{tag}x").as_bytes(), b"to remove", &ANY)
            .expect("write");
        let segments = e.tablet_stats(T, 0).expect("stats").segments;
        let from = e.tablet_stats(T, 0).expect("stats").next_version;
        let bytes = group(&mut e, &tag, true);
        let places = segments_of(&e, tag.as_bytes(), from);
        assert_eq!(places.len(), 6, "group {g}");
        assert!(
            places.iter().all(|&s| s == places[0]),
            "group {g}: {places:?}"
        );
        rolled += usize::from(e.tablet_stats(T, 0).expect("stats").segments != segments);
        assert!(bytes < SEG);
    }
    assert!(rolled > 10, "heads were rolled for groups ({rolled})");
    assert!(
        e.cleaner_totals().segments_cleaned > 10,
        "{:?}",
        e.cleaner_totals()
    );
    e.check_invariants();
}

#[test]
fn reserve_head_refuses_more_than_a_fresh_segment_and_keeps_a_head_with_room() {
    let mut e = engine();
    e.write(T, b"k", &[0; 100], &ANY).expect("write");
    let max = SEG - insitu_engine::ENTRY_HEADER_BYTES_MAX;
    assert_eq!(
        e.reserve_head(T, 0, max + 1),
        Err(EngineError::ValueTooLarge { len: max + 1, max })
    );
    assert_eq!(e.reserve_head(99, 0, 10), Err(EngineError::UnknownTablet));
    // Room enough: nothing rolls.
    let changes = e.log_changes();
    e.reserve_head(T, key_hash(T, b"k"), 1000).expect("fits");
    e.reserve_head(T, 0, 0).expect("nothing");
    assert_eq!(e.log_changes(), changes, "a head with room is kept");
    assert_eq!(e.tablet_stats(T, 0).expect("stats").segments, 1);
    // The most a fresh head holds: a new head, then a group of that size fits.
    e.reserve_head(T, 0, max).expect("a fresh head");
    assert_eq!(e.tablet_stats(T, 0).expect("stats").segments, 2);
    assert!(SEG - head_len(&e) >= max);
    e.check_invariants();
}

/// A record re-put under an anchor of the other half, then split away: the
/// staying half's log keeps its older entry, anchored in range and dead.
/// Once the cleaner frees the segment holding the newer (moved, dead) entry
/// while the older one's segment stays, nothing newer of that id is left in
/// the staying half's log unless the split wrote a removal there.
#[test]
fn a_record_split_away_stays_gone_from_the_half_it_left_after_cleaning() {
    let at = 1u64 << 63;
    let mut e = engine();
    let (low, high) = (
        keys_in_half(at, true, 1, "re").remove(0),
        keys_in_half(at, false, 1, "re").remove(0),
    );
    let moved = rid(9, 9);
    // Segment 1: the first entry, among objects that stay live (never cleaned).
    e.put_record(T, &low, moved, b"first").expect("put");
    let keep = keys_in_half(at, true, 200, "keep");
    let mut k = 0;
    while e.tablet_stats(T, 0).expect("stats").segments < 2 {
        e.write(T, &keep[k], &[1; 200], &ANY).expect("keep");
        k += 1;
    }
    // Segment 2: the re-put, among fillers overwritten later.
    e.put_record(T, &high, moved, b"second").expect("re-put");
    let fillers = keys_in_half(at, true, 40, "filler");
    let round = |e: &mut Engine, fill: u8| {
        for f in &fillers {
            e.write(T, f, &[fill; 200], &ANY).expect("filler");
        }
    };
    round(&mut e, 0);
    // Only lower-half objects: the upper half (with the record) moves.
    e.split_tablet(T, at).expect("split");
    assert_eq!(e.record(T, &high, moved), Some(&b"second"[..]));
    assert_eq!(e.record_count(T, 0), 0);
    for fill in 1..6 {
        round(&mut e, fill);
        e.clean();
        e.check_invariants();
        let (r, report) = replayed(&e, 0);
        assert_eq!(report.records_loaded, 0, "back after round {fill}");
        assert_eq!(r.record(T, &low, moved), None);
    }
    let log = raw::log(&e, T, 0);
    assert!(log.iter().any(|(s, _)| *s == 1), "segment 1 was kept");
}

/// Many records leaving at once: their removals take more than the staying
/// head's room, in fresh heads allocated before the split commits, and the
/// staying half's replay loads none of them.
#[test]
fn removals_for_many_leaving_records_span_several_heads() {
    let at = 1u64 << 63;
    let mut e = engine();
    // One object in the lower half, none in the upper: the upper half moves.
    let stay = keys_in_half(at, true, 1, "stay").remove(0);
    e.write(T, &stay, b"x", &ANY).expect("write");
    let anchors = keys_in_half(at, false, 300, "a-long-anchor-of-a-leaving-record");
    for (i, a) in anchors.iter().enumerate() {
        e.put_record(T, a, rid(1, i as u64), b"p").expect("put");
    }
    let before = e.tablet_stats(T, 0).expect("stats");
    e.split_tablet(T, at).expect("split");
    e.check_invariants();
    assert_eq!((e.record_count(T, 0), e.record_count(T, at)), (0, 300));
    let removals: Vec<u64> = raw::log(&e, T, 0)
        .into_iter()
        .filter(|(_, r)| r.kind == raw::KIND_RECORD_REMOVED)
        .map(|(segment, _)| segment)
        .collect();
    assert_eq!(removals.len(), 300);
    let heads = removals.last().expect("removals") - removals[0];
    assert!(heads >= 2, "removals over {} segments", heads + 1);
    let after = e.tablet_stats(T, 0).expect("stats");
    assert_eq!(after.next_version, before.next_version + 300);
    let (_, report) = replayed(&e, 0);
    assert_eq!((report.records_loaded, report.objects_loaded), (0, 1));
    let (_, report) = replayed(&e, at);
    assert_eq!((report.records_loaded, report.objects_loaded), (300, 0));
}

/// On a budget too small for the moved half or for the staying half's
/// removals, a split fails with `OutOfMemory` and changes nothing; on a
/// larger one it succeeds. Records with empty payloads and long anchors make
/// the removals larger than the moved copies, so some budgets fail there.
#[test]
fn a_split_short_of_memory_for_its_removals_changes_nothing() {
    let at = 1u64 << 63;
    let anchors = keys_in_half(at, false, 300, &"r".repeat(56));
    let (mut failed, mut split) = (0, 0);
    for budget in 4..48 {
        let mut e = engine_with(budget);
        let stay = keys_in_half(at, true, 1, "stay").remove(0);
        if e.write(T, &stay, b"x", &ANY).is_err() {
            continue;
        }
        let put = anchors
            .iter()
            .enumerate()
            .try_for_each(|(i, a)| e.put_record(T, a, rid(2, i as u64), b""));
        if put.is_err() {
            continue;
        }
        let before = (e.records(T, 0), e.tablet_stats(T, 0).expect("stats"));
        match e.split_tablet(T, at) {
            Ok(()) => {
                split += 1;
                assert_eq!((e.record_count(T, 0), e.record_count(T, at)), (0, 300));
                let (_, report) = replayed(&e, 0);
                assert_eq!(report.records_loaded, 0);
            }
            Err(err) => {
                assert_eq!(err, EngineError::OutOfMemory, "budget {budget}");
                failed += 1;
                assert_eq!(e.tablets().len(), 1);
                let stats = e.tablet_stats(T, 0).expect("stats");
                assert_eq!(e.records(T, 0), before.0);
                assert_eq!(
                    (stats.next_version, stats.object_count),
                    (before.1.next_version, before.1.object_count)
                );
                let (_, report) = replayed(&e, 0);
                assert_eq!(report.records_loaded, 300);
            }
        }
        e.check_invariants();
    }
    assert!(failed > 0 && split > 0, "failed {failed} split {split}");
}
