//! A replay in steps builds exactly what `Engine::replay` builds (the same
//! log bytes, the same memory figures, the reads of a model), whatever the
//! step sizes; an abandoned build gives its memory back; a range taken
//! between steps is refused at `finish`.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::{Engine, EngineConfig, EngineError, HashRange, RejectRules};

const SEG: usize = 4096;
const TABLE: u64 = 3;

fn engine() -> Engine {
    let config = EngineConfig {
        segment_bytes: SEG,
        memory_budget_bytes: 256 * SEG,
        max_value_bytes: 600,
    };
    Engine::with_max_key_bytes(config, 64).expect("config")
}

fn key(k: u8) -> Vec<u8> {
    format!("key-{k:03}").into_bytes()
}

/// One operation of the source engine's history.
#[derive(Clone, Debug)]
enum Op {
    Write { k: u8, len: usize },
    Remove { k: u8 },
    Record { anchor: u8, id: u8, len: usize },
    RemoveRecord { anchor: u8, id: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..80, 0usize..600).prop_map(|(k, len)| Op::Write { k, len }),
        2 => (0u8..80).prop_map(|k| Op::Remove { k }),
        1 => (0u8..80, 0u8..8, 0usize..100).prop_map(|(anchor, id, len)| Op::Record { anchor, id, len }),
        1 => (0u8..80, 0u8..8).prop_map(|(anchor, id)| Op::RemoveRecord { anchor, id }),
    ]
}

/// What each key reads.
type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Run `ops` on a fresh tablet; the log's segments and the model.
fn history(ops: &[Op]) -> (Vec<Vec<u8>>, Model) {
    let mut e = engine();
    e.create_tablet(TABLE, HashRange::FULL).expect("tablet");
    let mut model = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Write { k, len } => {
                let value = vec![i as u8; len];
                e.write(TABLE, &key(k), &value, &RejectRules::default())
                    .expect("write");
                model.insert(key(k), value);
            }
            Op::Remove { k } => {
                e.remove(TABLE, &key(k), &RejectRules::default())
                    .expect("remove");
                model.remove(&key(k));
            }
            Op::Record { anchor, id, len } => {
                e.put_record(
                    TABLE,
                    &key(anchor),
                    crate::RecordId {
                        class: 1,
                        id: u64::from(id),
                    },
                    &vec![i as u8; len],
                )
                .expect("record");
            }
            Op::RemoveRecord { anchor, id } => {
                e.remove_record(
                    TABLE,
                    &key(anchor),
                    crate::RecordId {
                        class: 1,
                        id: u64::from(id),
                    },
                )
                .expect("record removal");
            }
        }
    }
    let segments = e
        .segments(TABLE, 0)
        .expect("segments")
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    (segments, model)
}

fn log_of(e: &Engine) -> Vec<Vec<u8>> {
    e.segments(TABLE, 0)
        .expect("segments")
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect()
}

fn check_reads(e: &Engine, model: &Model) {
    for k in 0..80 {
        match (e.read(TABLE, &key(k)), model.get(&key(k))) {
            (Ok(o), Some(v)) => assert_eq!(o.value, &v[..], "key {k}"),
            (Err(EngineError::ObjectDoesntExist), None) => {}
            (got, want) => panic!("key {k}: {:?} against {want:?}", got.map(|o| o.value)),
        }
    }
}

/// Replay in steps of the sizes given (cycled), segment by segment.
fn replay_stepped(e: &mut Engine, segments: &[Vec<u8>], steps: &[usize]) -> crate::ReplayReport {
    let mut resolver = e.replay_in_steps(TABLE, HashRange::FULL).expect("free");
    for s in segments {
        resolver.feed(s).expect("feed");
    }
    let mut build = resolver.build(e).expect("build");
    let mut i = 0;
    let mut last = (0, 0);
    while !build.step(e, steps[i % steps.len()]).expect("step") {
        let now = build.progress();
        assert!(
            now.0 > last.0 || steps[i % steps.len()] == 0,
            "a step made progress"
        );
        assert!(now.0 <= now.1);
        last = now;
        i += 1;
    }
    build.finish(e).expect("finish")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn steps_build_what_one_call_builds(
        ops in proptest::collection::vec(op(), 1..300),
        steps in proptest::collection::vec(0usize..40, 1..5)
            .prop_filter("some step appends", |s| s.iter().any(|&n| n > 0)),
    ) {
        let (segments, model) = history(&ops);
        let mut whole = engine();
        let report_whole = whole
            .replay(TABLE, HashRange::FULL, segments.iter().map(|s| &s[..]))
            .expect("replay");
        let mut stepped = engine();
        let report_stepped = replay_stepped(&mut stepped, &segments, &steps);
        prop_assert_eq!(&report_stepped, &report_whole);
        prop_assert_eq!(log_of(&stepped), log_of(&whole));
        prop_assert_eq!(stepped.memory(), whole.memory());
        prop_assert_eq!(stepped.tablets(), whole.tablets());
        check_reads(&stepped, &model);
        stepped.check_invariants();
    }

    /// The winners come out in log order (feeding order of segments, then
    /// offset), however far each call asks: they are grouped by segment at
    /// `finish` and each group is sorted only when asked for
    /// (`Resolved::sort_through`). Every live key is there once.
    #[test]
    fn winners_come_out_in_log_order(
        ops in proptest::collection::vec(op(), 1..300),
        asks in proptest::collection::vec(0usize..40, 1..8),
    ) {
        let (segments, model) = history(&ops);
        let mut report = crate::ReplayReport::default();
        let mut resolved = crate::replay::resolve(
            TABLE,
            HashRange::FULL,
            segments.iter().map(|s| &s[..]),
            64,
            600,
            &mut report,
        )
        .expect("resolves");
        let n = resolved.objects();
        prop_assert_eq!(n, model.len(), "one winner per live key");
        let mut i = 0;
        for ask in asks.iter().cycle() {
            if i >= n {
                break;
            }
            i = (i + ask).min(n - 1);
            resolved.sort_through(i);
            let prefix = resolved.positions(i + 1);
            prop_assert!(
                prefix.windows(2).all(|p| p[0] < p[1]),
                "objects up to {} in log order: {:?}",
                i,
                prefix
            );
            i += 1;
        }
        let mut keys = resolved.keys();
        keys.sort();
        let want: Vec<&[u8]> = model.keys().map(|k| &k[..]).collect();
        prop_assert_eq!(keys, want);
    }

    #[test]
    fn an_abandoned_build_gives_its_memory_back(
        ops in proptest::collection::vec(op(), 1..200),
        after in 0usize..200,
    ) {
        let (segments, _) = history(&ops);
        let mut e = engine();
        let before = e.memory();
        let mut resolver = e.replay_in_steps(TABLE, HashRange::FULL).expect("free");
        for s in &segments {
            resolver.feed(s).expect("feed");
        }
        let mut build = resolver.build(&mut e).expect("build");
        build.step(&mut e, after).expect("step");
        build.abandon(&mut e);
        prop_assert_eq!(e.memory(), before);
        prop_assert!(e.tablets().is_empty());
    }
}

#[test]
fn a_range_taken_between_steps_is_refused_and_released() {
    let ops: Vec<Op> = (0..60).map(|k| Op::Write { k, len: 300 }).collect();
    let (segments, _) = history(&ops);
    let mut e = engine();
    let mut resolver = e.replay_in_steps(TABLE, HashRange::FULL).expect("free");
    for s in &segments {
        resolver.feed(s).expect("feed");
    }
    let mut build = resolver.build(&mut e).expect("build");
    while !build.step(&mut e, 7).expect("step") {}
    // Something else took the range meanwhile (a tablet created, say).
    e.create_tablet(TABLE, HashRange::FULL).expect("tablet");
    assert!(matches!(
        build.finish(&mut e),
        Err(EngineError::BadTablet(_))
    ));
    let mut only_other = engine();
    only_other
        .create_tablet(TABLE, HashRange::FULL)
        .expect("tablet");
    assert_eq!(
        e.memory(),
        only_other.memory(),
        "the build's memory is given back"
    );
    assert_eq!(e.tablets().len(), 1);
    // And a range already taken is refused before anything is resolved.
    assert!(e.replay_in_steps(TABLE, HashRange::FULL).is_err());
}

#[test]
fn a_corrupt_entry_is_reported_before_anything_is_built() {
    let ops: Vec<Op> = (0..30).map(|k| Op::Write { k, len: 200 }).collect();
    let (mut segments, _) = history(&ops);
    let last = segments.len() - 1;
    let mid = segments[last].len() / 2;
    segments[last][mid] ^= 0x55;
    let e = engine();
    let mut resolver = e.replay_in_steps(TABLE, HashRange::FULL).expect("free");
    for s in &segments[..last] {
        resolver.feed(s).expect("feed");
    }
    assert!(resolver.report().corrupt.is_empty());
    resolver.feed(&segments[last]).expect("feed");
    let corrupt = &resolver.report().corrupt;
    assert!(!corrupt.is_empty(), "the flipped byte is found");
    assert!(corrupt.iter().all(|c| c.segment == last));
    assert_eq!(e.memory().segment_bytes, 0, "nothing built");
    drop(resolver); // a resolver holds no memory of the engine
    assert!(e.tablets().is_empty());
}

/// Every object entry of a log: (bytes, dead bit); each checked to parse
/// with a valid checksum as an entry of `TABLE`.
fn objects_in(log: &[Vec<u8>]) -> Vec<(Vec<u8>, bool)> {
    let mut out = Vec::new();
    for seg in log {
        let mut at = 0;
        while at < seg.len() {
            let p = crate::entry::parse(seg, at, TABLE, 64, 600).expect("a valid entry");
            if p.kind == crate::entry::KIND_OBJECT {
                out.push((p.entry.to_vec(), crate::entry::is_dead(seg, at)));
            }
            at = p.next;
        }
    }
    out
}

/// Replay appends each winner's verified bytes verbatim. A winner may carry
/// the dead bit where it came from (a replica of a segment the cleaner had
/// copied it out of); where it lands it must be live, or the next write of
/// its key would supersede it twice and the cleaner would drop it.
#[test]
fn winners_are_appended_verbatim_and_live() {
    let ops: Vec<Op> = (0..40)
        .map(|i| Op::Write {
            k: i % 20,
            len: 50 + usize::from(i),
        })
        .collect();
    let (mut segments, model) = history(&ops);
    // The source's live entries, as bytes.
    let mut want: Vec<Vec<u8>> = objects_in(&segments)
        .into_iter()
        .filter(|(_, dead)| !dead)
        .map(|(b, _)| b)
        .collect();
    want.sort();
    assert_eq!(want.len(), 20);
    // Mark every entry of the replicas dead, as a cleaner's source would be.
    for seg in &mut segments {
        let mut at = 0;
        while at < seg.len() && crate::entry::kind(seg, at) != 0 {
            let next = at + crate::entry::len_at(seg, at);
            if !crate::entry::is_dead(seg, at) {
                crate::entry::set_dead(seg, at);
            }
            at = next;
        }
    }
    let mut e = engine();
    replay_stepped(&mut e, &segments, &[3]);
    let rebuilt = objects_in(&log_of(&e));
    assert!(
        rebuilt.iter().all(|(_, dead)| !dead),
        "every rebuilt object is live"
    );
    let mut got: Vec<Vec<u8>> = rebuilt.into_iter().map(|(b, _)| b).collect();
    got.sort();
    assert_eq!(got, want, "the same entries, byte for byte");
    check_reads(&e, &model);
    // Each key written again: its rebuilt entry is superseded once, cleanly.
    let mut model = model;
    for k in 0..20u8 {
        let value = vec![k; 70];
        e.write(TABLE, &key(k), &value, &RejectRules::default())
            .expect("write after replay");
        model.insert(key(k), value);
    }
    check_reads(&e, &model);
}
