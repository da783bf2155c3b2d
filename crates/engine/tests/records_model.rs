//! Model test of side records: random `put_record` / `remove_record` mixed
//! with object writes and removes, cleaning, splits, and replays of a tablet
//! from its own segments, with 4 KiB segments so heads roll and the cleaner
//! runs all the time. After every step the engine must agree with a model
//! of records (by id and anchor, payload) and objects: per tablet exactly
//! the model's records, and exactly its objects in every object view.

mod shared;

use shared::segment_copies;

use std::collections::BTreeMap;

use insitu_engine::{
    Engine, EngineConfig, EngineError, HashRange, Record, RecordId, RejectRules, key_hash,
    object_entry_bytes,
};
use proptest::prelude::*;

#[path = "records/raw.rs"]
mod raw;

const T: u64 = 3;
const SEGMENT_BYTES: usize = 4096;
const MAX_VALUE: usize = 400;
const ANCHORS: u8 = 24;
const KEYS: u8 = 40;
const CLASSES: u8 = 2;
const IDS: u8 = 6;
const MAX_TABLETS: usize = 4;

fn anchor_bytes(a: u8) -> Vec<u8> {
    format!("anchor-{a}").into_bytes()
}

fn key_bytes(k: u8) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

fn rid(class: u8, id: u8) -> RecordId {
    RecordId {
        class,
        id: u64::from(id) * 1_000_003,
    }
}

#[derive(Clone, Debug)]
enum Op {
    PutRecord {
        class: u8,
        id: u8,
        anchor: u8,
        len: usize,
        fill: u8,
    },
    RemoveRecord {
        class: u8,
        id: u8,
        anchor: u8,
    },
    Write {
        k: u8,
        len: usize,
        fill: u8,
    },
    Remove {
        k: u8,
    },
    Clean,
    Split {
        at: u64,
    },
    Replay {
        which: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let record_len = prop_oneof![8 => 0usize..200, 1 => (MAX_VALUE - 12)..(MAX_VALUE + 4)];
    prop_oneof![
        20 => (0..CLASSES, 0..IDS, 0..ANCHORS, record_len, any::<u8>())
            .prop_map(|(class, id, anchor, len, fill)| Op::PutRecord { class, id, anchor, len, fill }),
        10 => (0..CLASSES, 0..IDS, 0..ANCHORS)
            .prop_map(|(class, id, anchor)| Op::RemoveRecord { class, id, anchor }),
        50 => (0..KEYS, 0usize..300, any::<u8>()).prop_map(|(k, len, fill)| Op::Write { k, len, fill }),
        10 => (0..KEYS).prop_map(|k| Op::Remove { k }),
        4 => Just(Op::Clean),
        1 => any::<u64>().prop_map(|at| Op::Split { at }),
        4 => any::<usize>().prop_map(|which| Op::Replay { which }),
    ]
}

#[derive(Default)]
struct Counts {
    /// Splits that happened (the workload must exercise them).
    splits: u64,
    /// Tablets dropped and replayed from their own segments.
    replays: u64,
    /// Removals of records that existed (removal entries for the cleaner).
    record_removals: u64,
}

struct Harness {
    /// What is tested.
    engine: Engine,
    /// Live records: (id, anchor) -> payload; at most one per id and tablet.
    records: BTreeMap<(RecordId, Vec<u8>), Vec<u8>>,
    /// Live objects: key -> (value, version).
    objects: BTreeMap<Vec<u8>, (Vec<u8>, u64)>,
    /// How much of each kind of event the run had.
    counts: Counts,
}

impl Harness {
    fn new() -> Harness {
        let config = EngineConfig {
            segment_bytes: SEGMENT_BYTES,
            memory_budget_bytes: 512 * SEGMENT_BYTES,
            max_value_bytes: MAX_VALUE,
        };
        let mut engine = Engine::with_max_key_bytes(config, 64).expect("config");
        engine.create_tablet(T, HashRange::FULL).expect("tablet");
        Harness {
            engine,
            records: BTreeMap::new(),
            objects: BTreeMap::new(),
            counts: Counts::default(),
        }
    }

    fn range_of(&self, key: &[u8]) -> HashRange {
        self.engine
            .tablet_for(T, key_hash(T, key))
            .expect("covered")
    }

    /// The model's record `id` in the tablet `range`, if any.
    fn record_in(&self, id: RecordId, range: HashRange) -> Option<(Vec<u8>, Vec<u8>)> {
        self.records
            .iter()
            .find(|((i, a), _)| *i == id && range.contains(key_hash(T, a)))
            .map(|((_, a), p)| (a.clone(), p.clone()))
    }

    fn apply(&mut self, op: &Op) {
        let e = &mut self.engine;
        match *op {
            Op::PutRecord {
                class,
                id,
                anchor,
                len,
                fill,
            } => {
                let (id, anchor) = (rid(class, id), anchor_bytes(anchor));
                let payload = vec![fill; len];
                let got = e.put_record(T, &anchor, id, &payload);
                if len + 9 > MAX_VALUE {
                    let max = MAX_VALUE;
                    assert_eq!(got, Err(EngineError::ValueTooLarge { len: len + 9, max }));
                    return;
                }
                got.expect("put_record");
                let range = self.range_of(&anchor);
                if let Some((old, _)) = self.record_in(id, range) {
                    self.records.remove(&(id, old));
                }
                self.records.insert((id, anchor), payload);
            }
            Op::RemoveRecord { class, id, anchor } => {
                let (id, anchor) = (rid(class, id), anchor_bytes(anchor));
                let got = e.remove_record(T, &anchor, id).expect("remove_record");
                let held = self.record_in(id, self.range_of(&anchor));
                assert_eq!(got, held.is_some(), "remove_record {id:?}");
                if let Some((old, _)) = held {
                    self.records.remove(&(id, old));
                    self.counts.record_removals += 1;
                }
            }
            Op::Write { k, len, fill } => {
                let (key, value) = (key_bytes(k), vec![fill; len]);
                let version = e
                    .write(T, &key, &value, &RejectRules::default())
                    .expect("write");
                self.objects.insert(key, (value, version));
            }
            Op::Remove { k } => {
                let key = key_bytes(k);
                let got = e.remove(T, &key, &RejectRules::default()).expect("remove");
                let held = self.objects.remove(&key).map_or(0, |(_, v)| v);
                assert_eq!(got, held);
            }
            Op::Clean => {
                e.clean();
            }
            Op::Split { at } => {
                if e.tablets().len() >= MAX_TABLETS {
                    return;
                }
                let range = e.tablet_for(T, at).expect("covered");
                match e.split_tablet(T, at) {
                    Ok(()) => self.counts.splits += 1,
                    Err(EngineError::BadTablet(_)) => assert_eq!(at, range.start),
                    Err(other) => panic!("split: {other:?}"),
                }
            }
            Op::Replay { which } => {
                let tablets = e.tablets();
                let before = &tablets[which % tablets.len()];
                let start = before.range.start;
                let segments = segment_copies(e, T, start);
                let records = e.record_count(T, start) as u64;
                assert!(e.drop_tablet(T, start));
                assert_eq!(e.record_count(T, start), 0, "dropped with its tablet");
                let report = e
                    .replay(T, before.range, segments.iter().map(|s| &s[..]))
                    .expect("replay");
                assert!(report.corrupt.is_empty(), "{:?}", report.corrupt);
                assert_eq!(report.records_loaded, records);
                assert_eq!(report.objects_loaded, before.object_count);
                let after = e.tablet_stats(T, start).expect("replayed");
                assert_eq!(after.next_version, before.next_version);
                self.counts.replays += 1;
            }
        }
    }

    /// The engine agrees with the model, tablet by tablet.
    fn check(&self) {
        let e = &self.engine;
        e.check_invariants();
        for s in e.tablets() {
            let start = s.range.start;
            let in_range = |k: &[u8]| s.range.contains(key_hash(T, k));
            let mut want: Vec<Record> = self
                .records
                .iter()
                .filter(|((_, a), _)| in_range(a))
                .map(|((id, a), p)| Record {
                    id: *id,
                    anchor: a.clone(),
                    payload: p.clone(),
                })
                .collect();
            want.sort_by_key(|r| r.id);
            assert_eq!(e.records(T, start), want, "records of {start:#x}");
            assert_eq!(e.record_count(T, start), want.len());
            let objects: BTreeMap<Vec<u8>, (Vec<u8>, u64)> = self
                .objects
                .iter()
                .filter(|(k, _)| in_range(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let mut walked = BTreeMap::new();
            e.for_each_log(T, start, |o| {
                walked.insert(o.key.to_vec(), (o.value.to_vec(), o.version));
            })
            .expect("walk");
            assert_eq!(walked, objects, "objects of {start:#x}");
            let live: usize = objects
                .iter()
                .map(|(k, (v, ver))| object_entry_bytes(k.len(), v.len(), *ver))
                .sum();
            assert_eq!(
                (s.object_count, s.live_bytes),
                (objects.len() as u64, live as u64)
            );
        }
        // Every (id, anchor) pair: found exactly when the anchor's tablet holds the id.
        for a in 0..ANCHORS {
            let anchor = anchor_bytes(a);
            let range = self.range_of(&anchor);
            for class in 0..CLASSES {
                for id in 0..IDS {
                    let id = rid(class, id);
                    let want = self.record_in(id, range).map(|(_, p)| p);
                    assert_eq!(e.record(T, &anchor, id), want.as_deref(), "{id:?} via {a}");
                }
            }
        }
    }
}

fn run(ops: &[Op]) -> Harness {
    let mut h = Harness::new();
    for op in ops {
        h.apply(op);
        h.check();
    }
    h
}

proptest! {
    // Modest by default (the suite must stay fast in debug); PROPTEST_CASES overrides for a soak.
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(32), ..ProptestConfig::default() })]

    #[test]
    fn records_match_the_model(ops in proptest::collection::vec(op(), 1..400)) {
        run(&ops);
    }
}

/// The generated workloads exercise what the property is about: the
/// cleaner moving records and dropping removals, splits, replays.
/// Deterministic, so it cannot pass by luck.
#[test]
fn workloads_exercise_cleaning_splits_and_replays() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut cleaned, mut moved, mut dropped, mut splits, mut replays, mut removals) =
        (0, 0, 0, 0, 0, 0);
    let mut record_entries_beyond_segment_one = 0;
    for _ in 0..8 {
        let ops = proptest::collection::vec(op(), 400)
            .new_tree(&mut runner)
            .expect("tree")
            .current();
        let h = run(&ops);
        let c = h.engine.cleaner_totals();
        cleaned += c.segments_cleaned;
        moved += c.entries_moved;
        dropped += c.tombstones_dropped;
        splits += h.counts.splits;
        replays += h.counts.replays;
        removals += h.counts.record_removals;
        for s in h.engine.tablets() {
            record_entries_beyond_segment_one += raw::log(&h.engine, T, s.range.start)
                .iter()
                .filter(|(seg, r)| *seg > 1 && r.kind & 0x20 != 0)
                .count();
        }
    }
    eprintln!(
        "cleaned {cleaned} moved {moved} dropped {dropped} splits {splits} replays {replays} record removals {removals}"
    );
    assert!(
        cleaned >= 20 && moved >= 100 && dropped >= 10 && splits >= 4 && replays >= 8,
        "weak workload"
    );
    assert!(removals >= 20 && record_entries_beyond_segment_one > 0);
}
