//! Side records through the public API: basics and invisibility to every
//! object view, errors, a full budget, the cleaner, replay from raw
//! segments. (Splits and `reserve_head` are in `records_placement.rs`, the
//! model test in `records_model.rs`, the entry format in `src/entry_tests.rs`.)

mod shared;

use shared::segment_copies;

use std::collections::BTreeMap;
use std::time::Duration;

use insitu_engine::{Engine, EngineError, HashRange, MAX_VERSION, key_hash};

#[path = "records/common.rs"]
mod common;
#[path = "records/raw.rs"]
mod raw;

use common::*;

type Objects = BTreeMap<Vec<u8>, (Vec<u8>, u64)>;

/// A visit: calls its argument for every object it sees.
type Visit<'a> = &'a mut dyn FnMut(&mut dyn FnMut(insitu_engine::ObjectRef<'_>));

/// Every object view of the tablet returns exactly `want`: records never show.
fn check_objects(e: &Engine, start: u64, want: &Objects) {
    let collect = |f: Visit<'_>| {
        let mut got = Objects::new();
        f(&mut |o| {
            let old = got.insert(o.key.to_vec(), (o.value.to_vec(), o.version));
            assert!(old.is_none(), "an object twice");
        });
        got
    };
    let by_log = collect(&mut |f| e.for_each_log(T, start, f).expect("log walk"));
    assert_eq!(&by_log, want, "for_each_log");
    let by_index = collect(&mut |f| e.for_each_index(T, start, f).expect("index walk"));
    assert_eq!(&by_index, want, "for_each_index");
    let by_segment = collect(&mut |f| {
        for i in 0..e.scan_segments(T, start).expect("segments") {
            e.scan_log_segment(T, start, i, &mut *f).expect("segment");
        }
    });
    assert_eq!(&by_segment, want, "scan_log_segment");
    let by_chunk = collect(&mut |f| {
        e.scan_index_chunk(T, start, 0, usize::MAX, f)
            .expect("chunk");
    });
    assert_eq!(&by_chunk, want, "scan_index_chunk");
    let snap = e.index_snapshot(T, start).expect("snapshot");
    let by_snapshot = collect(&mut |f| {
        e.scan_index_snapshot(T, start, &snap, 0, Duration::MAX, f)
            .expect("snapshot scan");
    });
    assert_eq!(&by_snapshot, want, "index snapshot");
    let by_hash = collect(&mut |f| {
        let mut list = e.sorted_hashes(T, start, 0).expect("hashes");
        let mut pos = 0;
        while let Some((slot, h)) = list.next_from(pos) {
            e.objects_in_hash_group(T, start, h, &mut *f)
                .expect("group");
            pos = slot + 1;
        }
    });
    assert_eq!(&by_hash, want, "hash walk");
    let extracted: Objects = e
        .extract(T, start)
        .expect("extract")
        .into_iter()
        .map(|(k, v, ver, _)| (k, (v, ver)))
        .collect();
    assert_eq!(&extracted, want, "extract");
    let mut cursor = e.extract_begin(T, start).expect("begin");
    let mut chunked = Objects::new();
    while !cursor.is_done() {
        let chunk = e.extract_chunk(&mut cursor, 1024).expect("chunk");
        chunked.extend(
            chunk
                .objects
                .iter()
                .map(|(k, v, ver, _)| (k.clone(), (v.clone(), *ver))),
        );
    }
    assert_eq!(&chunked, want, "extract_chunk");
    let stats = e.tablet_stats(T, start).expect("stats");
    assert_eq!(stats.object_count, want.len() as u64);
    let live: usize = want
        .iter()
        .map(|(k, (v, ver))| insitu_engine::object_entry_bytes(k.len(), v.len(), *ver))
        .sum();
    assert_eq!(stats.live_bytes, live as u64, "live bytes are objects only");
}

#[test]
fn put_replace_remove_and_no_object_view_sees_a_record() {
    let mut e = engine();
    let mut objects = Objects::new();
    for i in 0..50u32 {
        let (k, v) = (format!("obj-{i}").into_bytes(), vec![i as u8; 30]);
        let ver = e.write(T, &k, &v, &ANY).expect("write");
        objects.insert(k, (v, ver));
    }
    // An object under a key that is also a record's anchor.
    let ver = e.write(T, b"a", b"object a", &ANY).expect("write");
    objects.insert(b"a".to_vec(), (b"object a".to_vec(), ver));
    let memory_live = e.memory().live_bytes;
    e.watch(T, 0).expect("watch");

    let (r1, r2, r3) = (rid(1, 1), rid(1, 2), rid(2, 1));
    e.put_record(T, b"a", r1, b"one").expect("put");
    e.put_record(T, b"b", r2, b"").expect("put");
    e.put_record(T, b"a", r3, &[9; 300]).expect("put");
    assert_eq!(e.record(T, b"a", r1), Some(&b"one"[..]));
    assert_eq!(e.record(T, b"b", r2), Some(&b""[..]));
    // The anchor routes; the id names the record within its tablet.
    assert_eq!(e.record(T, b"another key", r3), Some(&[9u8; 300][..]));
    assert_eq!(e.record(T, b"a", rid(1, 3)), None);
    assert_eq!(e.record_count(T, 0), 3);
    // Replacing keeps one record (a new anchor and payload).
    e.put_record(T, b"c", r1, b"one again").expect("replace");
    assert_eq!(
        e.records(T, 0),
        vec![
            rec(r1, b"c", b"one again"),
            rec(r2, b"b", b""),
            rec(r3, b"a", &[9; 300])
        ]
    );
    assert_eq!(e.remove_record(T, b"b", r2), Ok(true));
    let changes = e.log_changes();
    assert_eq!(e.remove_record(T, b"b", r2), Ok(false), "already removed");
    assert_eq!(
        e.remove_record(T, b"zz", rid(7, 7)),
        Ok(false),
        "never there"
    );
    assert_eq!(
        e.log_changes(),
        changes,
        "a refused removal appends nothing"
    );
    assert_eq!(e.record(T, b"b", r2), None);
    assert_eq!(e.record_count(T, 0), 2);

    assert_eq!(e.read(T, b"a").expect("object").value, b"object a");
    assert_eq!(e.read(T, b"c").err(), Some(EngineError::ObjectDoesntExist));
    let mut looked = Vec::new();
    let keys: [&[u8]; 3] = [b"a", b"b", b"c"];
    e.lookup_many(T, 0, keys, |k, o| {
        looked.push((k, o.map(|o| o.value.to_vec())))
    })
    .expect("lookup");
    assert_eq!(
        looked,
        vec![
            (&b"a"[..], Some(b"object a".to_vec())),
            (&b"b"[..], None),
            (&b"c"[..], None)
        ]
    );
    let mut with_hash = 0;
    e.objects_with_hash(T, 0, key_hash(T, b"c"), |_| with_hash += 1)
        .expect("hash probe");
    assert_eq!(with_hash, 0);
    check_objects(&e, 0, &objects);
    assert_eq!(
        e.memory().live_bytes,
        memory_live,
        "memory figures are objects only"
    );
    let watched = e.take_changes(T, 0).expect("changes").expect("watched");
    assert!(watched.hashes.is_empty(), "records are not object changes");
    // The log holds them: three puts, a replace, a removal.
    let log = raw::log(&e, T, 0);
    let kinds: Vec<(u8, bool)> = log
        .iter()
        .filter(|(_, r)| r.kind & 0x20 != 0)
        .map(|(_, r)| (r.kind, r.dead))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (raw::KIND_RECORD, true),
            (raw::KIND_RECORD, true),
            (raw::KIND_RECORD, false),
            (raw::KIND_RECORD, false),
            (raw::KIND_RECORD_REMOVED, false)
        ]
    );
    e.check_invariants();
}

#[test]
fn errors_are_a_writes_and_change_nothing() {
    let mut e = engine();
    let r = rid(0, 1);
    assert_eq!(
        e.put_record(99, b"a", r, b"x"),
        Err(EngineError::UnknownTablet)
    );
    assert_eq!(e.put_record(T, b"", r, b"x"), Err(EngineError::EmptyKey));
    assert_eq!(
        e.put_record(T, &[1; 65], r, b"x"),
        Err(EngineError::KeyTooLarge { len: 65, max: 64 })
    );
    // Class and id take 9 bytes of the value: a payload of max - 8 is one too many.
    let too_large = e.put_record(T, b"a", r, &[0; MAX_VALUE - 8]);
    assert_eq!(
        too_large,
        Err(EngineError::ValueTooLarge {
            len: MAX_VALUE + 1,
            max: MAX_VALUE
        })
    );
    assert_eq!(
        too_large.err(),
        e.write(T, b"a", &[0; MAX_VALUE + 1], &ANY).err(),
        "the error a too-large value gets"
    );
    assert_eq!(e.record_count(T, 0), 0);
    assert_eq!(e.tablet_stats(T, 0).expect("stats").next_version, 1);
    e.put_record(T, b"a", r, &[0; MAX_VALUE - 9])
        .expect("the largest payload");
    assert_eq!(
        e.remove_record(99, b"a", r),
        Err(EngineError::UnknownTablet)
    );
    assert_eq!(e.remove_record(T, b"", r), Err(EngineError::EmptyKey));
    assert_eq!(e.record(99, b"a", r), None);
    assert_eq!(e.record(T, b"", r), None);
    assert!(e.records(99, 0).is_empty());
    assert!(e.records(T, 5).is_empty(), "no tablet starts at 5");
    assert_eq!((e.record_count(99, 0), e.record_count(T, 5)), (0, 0));
    // Versions come from the tablet's counter, which refuses past the last.
    e.raise_version(T, 0, MAX_VERSION).expect("raise");
    e.put_record(T, b"b", rid(0, 2), b"last")
        .expect("takes MAX_VERSION");
    let exhausted = Err(EngineError::VersionExhausted {
        version: MAX_VERSION + 1,
    });
    assert_eq!(e.put_record(T, b"b", rid(0, 3), b"x"), exhausted);
    assert_eq!(
        e.remove_record(T, b"b", rid(0, 2)),
        exhausted.map(|()| true)
    );
    assert_eq!(e.record_count(T, 0), 2);
    e.check_invariants();
}

#[test]
fn a_full_budget_refuses_records_but_removes_them() {
    let mut e = engine_with(16);
    let mut n = 0u64;
    let refused = loop {
        match e.put_record(T, &anchor(n), rid(0, n), &[n as u8; 400]) {
            Ok(()) => n += 1,
            Err(err) => break err,
        }
        assert!(n < 10_000, "never refused");
    };
    assert_eq!(refused, EngineError::OutOfMemory);
    assert_eq!(
        e.record_count(T, 0),
        n as usize,
        "the refused put left nothing"
    );
    e.check_invariants();
    for i in (0..n).step_by(2) {
        assert_eq!(
            e.remove_record(T, &anchor(i), rid(0, i)),
            Ok(true),
            "remove {i}"
        );
    }
    e.clean();
    e.put_record(T, b"again", rid(1, 0), &[1; 400])
        .expect("room again");
    for i in (1..n).step_by(2) {
        assert_eq!(
            e.record(T, &anchor(i), rid(0, i)),
            Some(&[i as u8; 400][..])
        );
    }
    e.check_invariants();
}

#[test]
fn records_survive_the_cleaner_and_removed_ones_stay_gone() {
    let mut e = engine();
    let mut model = BTreeMap::new();
    for i in 0..20u64 {
        let payload = vec![i as u8; 40 + i as usize];
        e.put_record(T, &anchor(i), rid(0, i), &payload)
            .expect("put");
        model.insert(rid(0, i), (anchor(i), payload));
    }
    let mut removals = 0;
    for round in 0..40u8 {
        churn(&mut e, 40, round);
        let i = u64::from(round % 20);
        match round % 4 {
            0 => {
                let (a, p) = (anchor(100 + u64::from(round)), vec![round; 60]);
                e.put_record(T, &a, rid(0, i), &p).expect("replace");
                model.insert(rid(0, i), (a, p));
            }
            1 => {
                let there = model.remove(&rid(0, i)).is_some();
                assert_eq!(e.remove_record(T, &anchor(i), rid(0, i)), Ok(there));
                removals += u64::from(there);
            }
            2 => {
                let id = rid(1, u64::from(round));
                e.put_record(T, b"new", id, &[round; 30]).expect("put");
                model.insert(id, (b"new".to_vec(), vec![round; 30]));
            }
            _ => {}
        }
        e.clean();
        e.check_invariants();
        check_records(&e, 0, &model);
        let (r, report) = replayed(&e, 0);
        assert_eq!(report.records_loaded, model.len() as u64);
        check_records(&r, 0, &model);
        assert_eq!(report.objects_loaded, 40);
    }
    assert!(removals >= 5);
    let totals = e.cleaner_totals();
    // No object was ever removed: every dropped tombstone was a record removal.
    assert!(totals.tombstones_dropped > 0, "{totals:?}");
    let log = raw::log(&e, T, 0);
    let live_removals = log
        .iter()
        .filter(|(_, r)| r.kind == raw::KIND_RECORD_REMOVED && !r.dead)
        .count();
    assert!(
        live_removals < removals as usize,
        "{live_removals} of {removals} left"
    );
    // The untouched records were written to segment 1, which is gone: they
    // survived by being copied.
    assert!(log.iter().all(|&(segment, _)| segment > 1));
    let live_records = log
        .iter()
        .filter(|(_, r)| r.kind == raw::KIND_RECORD && !r.dead)
        .count();
    assert_eq!(live_records, model.len());
    assert!(model.contains_key(&rid(0, 2)) && model[&rid(0, 2)].0 == anchor(2));
}

/// The tombstone rule's hard case, for a record removal: the record is
/// copied into a survivor created after the head that then takes its
/// removal. When that head is cleaned while the survivor (holding the dead
/// copy) exists, the removal must be kept, or a replay brings the record back.
#[test]
fn a_removal_outlives_a_survivor_created_after_its_head() {
    let mut e = engine();
    let victim = rid(5, 5);
    e.put_record(T, b"victim", victim, b"version one")
        .expect("put");
    let mut n = 0;
    while e.tablet_stats(T, 0).expect("stats").segments < 2 {
        e.write(T, format!("filler-{n}").as_bytes(), &[0; 200], &ANY)
            .expect("fill");
        n += 1;
    }
    // Kill the fillers of segment 1: its only live entry is the record.
    churn(&mut e, n - 1, 1);
    let moved = e.cleaner_totals().entries_moved;
    e.clean();
    assert!(
        e.cleaner_totals().entries_moved > moved,
        "the record was copied"
    );
    assert!(raw::log(&e, T, 0).iter().all(|&(segment, _)| segment > 1));
    assert_eq!(e.remove_record(T, b"victim", victim), Ok(true));
    for round in 2..30u8 {
        churn(&mut e, n, round);
        e.clean();
        e.check_invariants();
        let (r, report) = replayed(&e, 0);
        assert_eq!(
            r.record(T, b"victim", victim),
            None,
            "back after round {round}"
        );
        assert_eq!(report.records_loaded, 0);
    }
    assert!(
        e.cleaner_totals().tombstones_dropped > 0,
        "the removal was dropped in the end"
    );
}

#[test]
fn replay_restores_records_and_the_counter_above_their_versions() {
    let mut e = engine();
    // Records alone carry the highest versions (the head's mark has 1).
    e.put_record(T, b"a", rid(0, 1), b"x").expect("v1");
    e.put_record(T, b"b", rid(0, 2), b"y").expect("v2");
    e.put_record(T, b"a", rid(0, 1), b"x2").expect("v3");
    assert_eq!(e.remove_record(T, b"b", rid(0, 2)), Ok(true));
    let next = e.tablet_stats(T, 0).expect("stats").next_version;
    assert_eq!(next, 5);
    let newest = raw::log(&e, T, 0)
        .iter()
        .filter(|(_, r)| r.kind & 0x20 != 0)
        .map(|(_, r)| r.version)
        .max();
    assert_eq!(newest, Some(4));
    let (mut r, report) = replayed(&e, 0);
    assert_eq!((report.records_loaded, report.objects_loaded), (1, 0));
    assert_eq!(r.records(T, 0), vec![rec(rid(0, 1), b"a", b"x2")]);
    assert_eq!(r.tablet_stats(T, 0).expect("stats").next_version, next);
    // The rebuilt log replays the same, and writes continue above.
    let (again, _) = replayed(&r, 0);
    assert_eq!(again.records(T, 0), r.records(T, 0));
    assert_eq!(again.tablet_stats(T, 0).expect("stats").next_version, next);
    assert!(r.write(T, b"k", b"v", &ANY).expect("write") >= next);

    // A corrupt record entry is reported and not loaded.
    e.put_record(T, b"c", rid(0, 3), b"will be damaged")
        .expect("put");
    let mut segments = segment_copies(&e, T, 0);
    let last = segments.last_mut().expect("a segment");
    let damaged = raw::decode(last).last().expect("the record").clone();
    assert_eq!(
        (damaged.kind, &damaged.key[..]),
        (raw::KIND_RECORD, &b"c"[..])
    );
    let at = last.len() - 1;
    last[at] ^= 1; // the payload's last byte
    let offset = damaged.offset;
    let mut fresh = Engine::with_max_key_bytes(config(64), 64).expect("config");
    let report = fresh
        .replay(T, HashRange::FULL, segments.iter().map(|s| &s[..]))
        .expect("replay");
    assert_eq!(report.corrupt.len(), 1, "{:?}", report.corrupt);
    assert_eq!(report.corrupt[0].offset, offset);
    assert!(report.corrupt[0].reason.contains("checksum"));
    assert_eq!(fresh.records(T, 0), vec![rec(rid(0, 1), b"a", b"x2")]);
    r.check_invariants();
}
