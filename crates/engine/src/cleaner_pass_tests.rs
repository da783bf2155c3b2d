//! Sliced incremental cleaning against a model (a `BTreeMap` of what each
//! key must read), with writes, removes, explicit passes, scan holds and a
//! dropped tablet between slices.

use std::collections::BTreeMap;

use super::{
    Pass, SLICE_MAX_MOVED, SLICE_MAX_SCAN_BYTES, SLICE_MIN_SCAN_BYTES, SLICE_PACE,
    SLICE_SCAN_BYTES, Sliced,
};
use crate::test_engine::engine_with;
use crate::{Engine, EngineError, HashRange, RejectRules};

const SEG: usize = 16 * 1024;
const TABLE: u64 = 7;
const OTHER: u64 = 8;

fn engine(budget_segments: usize) -> Engine {
    engine_with(SEG, budget_segments, 1024, &[TABLE])
}

fn key(i: u64) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

/// Deterministic pseudo-random numbers (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }
}

fn check(e: &Engine, model: &BTreeMap<Vec<u8>, Vec<u8>>, keys: u64) {
    e.check_invariants();
    for i in 0..keys {
        let k = key(i);
        match (e.read(TABLE, &k), model.get(&k)) {
            (Ok(o), Some(v)) => assert_eq!(o.value, &v[..], "key {i}"),
            (Err(EngineError::ObjectDoesntExist), None) => {}
            (got, want) => panic!("key {i}: engine {:?}, model {want:?}", got.map(|o| o.value)),
        }
    }
}

/// Uniform overwrites keep the cleaner busy; no single write may carry more
/// than one slice of it. Run whole (before slicing), one write moved a pass
/// of up to 8 segments' live entries: ~700 here.
#[test]
fn no_write_carries_more_than_a_slice_and_utilisation_holds() {
    // ~20 segments live of 32: pressure high enough for the 0.88 target.
    let mut e = engine(32);
    let mut model = BTreeMap::new();
    let keys = 2_000u64;
    let any = RejectRules::default();
    let mut rng = Rng(1);
    // An entry is at least a 1-byte-version header + 10 + 100 bytes here: a
    // slice reads at most SLICE_SCAN_BYTES plus the entry it stops inside,
    // so it moves at most this many.
    let smallest = crate::entry::entry_bytes(10, 100, 1);
    let max_per_slice = (SLICE_SCAN_BYTES / smallest + 1) as u64;
    let (mut max_moved, mut writes_that_moved) = (0u64, 0u64);
    for n in 0..12 * keys {
        let i = if n < keys { n } else { rng.next() % keys };
        let v = vec![(n % 251) as u8; 100 + (rng.next() % 50) as usize];
        let before = e.cleaner_totals().entries_moved;
        e.write(TABLE, &key(i), &v, &any).expect("write");
        let moved = e.cleaner_totals().entries_moved - before;
        max_moved = max_moved.max(moved);
        writes_that_moved += u64::from(moved > 0);
        model.insert(key(i), v);
    }
    let c = e.cleaner_totals();
    assert!(c.segments_cleaned >= 20, "the cleaner ran: {c:?}");
    assert!(
        max_moved <= max_per_slice,
        "one write moved {max_moved} entries (a slice moves at most {max_per_slice})"
    );
    // A 16 KiB segment takes two 8 KiB slices: as many writes as segments
    // at the very least (run whole, a pass of up to 8 took one write).
    assert!(
        writes_that_moved >= c.segments_cleaned,
        "cleaning was spread over many writes: {writes_that_moved} writes for {c:?}"
    );
    let m = e.memory();
    assert!(m.utilization >= 0.8, "utilisation {m:?}");
    check(&e, &model, keys);
}

/// Kilobyte values under the budget `insitu bench engine` gives them: the
/// live bytes / 0.9, four segments and the index. That leaves a few
/// segments of room beyond what the 0.88-0.90 utilisation band spans over
/// ~180 segments, so slices must keep the budget itself from filling: a
/// write that finds it full cleans a whole segment inline (the room path,
/// ~220 entries here). With slices capped at 8 KiB and passes stopped on
/// utilisation alone, writes here moved whole segments.
#[test]
fn kilobyte_writes_under_a_tight_budget_never_clean_a_segment_inline() {
    const BIG_SEG: usize = 256 * 1024;
    let keys = 40_000u64;
    let writes = keys * 6;
    let value_bytes = 1_000;
    let entry = crate::entry::entry_bytes(10, value_bytes, writes);
    let live = keys as usize * entry;
    let budget =
        (live as f64 / 0.9) as usize + 4 * BIG_SEG + crate::index_bytes_for(keys as usize) * 3 / 2;
    let config = crate::EngineConfig {
        segment_bytes: BIG_SEG,
        memory_budget_bytes: budget,
        max_value_bytes: value_bytes,
    };
    let mut e = Engine::with_max_key_bytes(config, 64).expect("config");
    e.create_tablet(TABLE, crate::HashRange::FULL)
        .expect("tablet");
    let mut model = BTreeMap::new();
    let any = RejectRules::default();
    let mut rng = Rng(5);
    let most_per_slice = (SLICE_MAX_SCAN_BYTES / entry + 1).min(SLICE_MAX_MOVED as usize) as u64;
    let mut max_moved = 0u64;
    for n in 0..writes {
        let i = if n < keys { n } else { rng.next() % keys };
        let v = vec![(n % 251) as u8; value_bytes];
        let before = e.cleaner_totals().entries_moved;
        e.write(TABLE, &key(i), &v, &any).expect("write");
        max_moved = max_moved.max(e.cleaner_totals().entries_moved - before);
        model.insert(key(i), v);
    }
    check(&e, &model, keys);
    let c = e.cleaner_totals();
    assert!(c.segments_cleaned >= 100, "the cleaner ran: {c:?}");
    assert!(
        max_moved <= most_per_slice,
        "one write moved {max_moved} entries: a slice moves at most {most_per_slice}, \
         so the write cleaned a segment inline"
    );
    let m = e.memory();
    assert!(m.utilization >= 0.85, "utilisation holds: {m:?}");
}

/// However many bytes a slice may read, it moves at most `SLICE_MAX_MOVED`
/// entries: 64 KiB of ~30-byte entries kept at about a half would be
/// ~1,000 moves in one call.
#[test]
fn a_slice_moves_at_most_its_entry_cap() {
    // A tight budget, so that the pass's target is the 0.88 one.
    let mut e = engine(16);
    let any = RejectRules::default();
    let keys = 4_000u64;
    // Held from cleaning while written: the loaded segments keep half.
    e.hold_cleaner(TABLE, 0, true).expect("hold");
    for i in 0..keys {
        e.write(TABLE, &key(i), &[0; 8], &any).expect("load");
    }
    for i in (1..keys).step_by(2) {
        e.write(TABLE, &key(i), &[1; 8], &any).expect("overwrite");
    }
    e.hold_cleaner(TABLE, 0, false).expect("release");
    e.clean_pass = None;
    let mut pass = Pass::start(&e.tablets, &e.budget).expect("segments worth cleaning");
    let before = pass.stats.entries_moved;
    let sliced = pass.slice(&mut e.tablets, &mut e.budget, SLICE_MAX_SCAN_BYTES);
    let moved = pass.stats.entries_moved - before;
    assert_eq!(
        sliced,
        Sliced::More,
        "the cap, not the sources, ended the slice"
    );
    assert_eq!(moved, SLICE_MAX_MOVED, "one slice moved {moved} entries");
    e.check_invariants();
}

/// A slice reads in proportion to what was written since the last one (so
/// a pass's copying is spread over its writes, not done in a burst), within
/// its bounds, and reads the most when utilisation says the cleaner is
/// behind.
#[test]
fn slices_are_paced_by_the_bytes_written() {
    let mut e = engine(32);
    let any = RejectRules::default();
    let mut rng = Rng(3);
    for n in 0..4_000u64 {
        let i = if n < 1_000 { n } else { rng.next() % 1_000 };
        e.write(TABLE, &key(i), &[1; 100], &any).expect("write");
    }
    e.clean_pass = None;
    let mut pass = Pass::start(&e.tablets, &e.budget).expect("segments worth cleaning");
    let per_byte_freed = 1.0 / (1.0 - pass.kept_fraction);
    assert!(
        per_byte_freed > 1.0,
        "the sources keep something: {}",
        pass.kept_fraction
    );
    // Nothing written since the pass started: the least.
    assert_eq!(pass.paced_scan_bytes(&e.budget), SLICE_MIN_SCAN_BYTES);
    // One 300-byte write: twice what frees 300 bytes.
    e.budget.clock += 300;
    let want = (SLICE_PACE * 300.0 * per_byte_freed).ceil() as usize;
    let got = pass.paced_scan_bytes(&e.budget);
    assert_eq!(got, want.clamp(SLICE_MIN_SCAN_BYTES, SLICE_MAX_SCAN_BYTES));
    // A large write: at most the largest slice.
    e.budget.clock += 1 << 20;
    assert_eq!(pass.paced_scan_bytes(&e.budget), SLICE_MAX_SCAN_BYTES);

    // Behind: every key overwritten once more while a scan held the tablet
    // from cleaning, so utilisation is far under the start threshold. The
    // first slice (a source boundary) notices; after it even a 1-byte write
    // gets a full slice.
    e.hold_cleaner(TABLE, 0, true).expect("hold");
    for i in 0..1_000u64 {
        e.write(TABLE, &key(i), &[2; 100], &any).expect("write");
    }
    e.hold_cleaner(TABLE, 0, false).expect("release");
    e.clean_pass = None;
    let mut pass = Pass::start(&e.tablets, &e.budget).expect("segments worth cleaning");
    assert!(!pass.behind, "not known before a boundary");
    let low = crate::cleaner::incremental_low(e.budget.pressure());
    let m = e.memory();
    assert!(m.utilization < low - 0.1, "{m:?}, start threshold {low}");
    assert_eq!(pass.slice(&mut e.tablets, &mut e.budget, 1), Sliced::More);
    assert!(pass.behind);
    e.budget.clock += 1;
    assert_eq!(pass.paced_scan_bytes(&e.budget), SLICE_SCAN_BYTES);
}

/// Uniform overwrites of `keys` keys (after loading them) on an engine of
/// `budget_segments`: its memory figures and the entries the cleaner moved.
fn overwrite_uniformly(
    budget_segments: usize,
    keys: u64,
    writes: u64,
) -> (crate::MemoryStats, u64) {
    let mut e = engine(budget_segments);
    let mut model = BTreeMap::new();
    let any = RejectRules::default();
    let mut rng = Rng(2);
    for n in 0..keys + writes {
        let i = if n < keys { n } else { rng.next() % keys };
        let v = vec![(n % 251) as u8; 100];
        e.write(TABLE, &key(i), &v, &any).expect("write");
        model.insert(key(i), v);
    }
    check(&e, &model, keys);
    (e.memory(), e.cleaner_totals().entries_moved)
}

/// How compact the log is kept follows how full the budget is: with the
/// budget mostly free the cleaner lets the log run to about twice its live
/// bytes and copies a fraction of what it copies under pressure; with the
/// budget tight it keeps utilisation high.
#[test]
fn the_log_runs_sparse_only_while_the_budget_is_mostly_free() {
    let (keys, writes) = (2_000u64, 20_000u64);
    // ~280 KB live: about 17 segments of 1,024 (pressure ~4 %) or of 30.
    let (sparse, sparse_moved) = overwrite_uniformly(1024, keys, writes);
    let (tight, tight_moved) = overwrite_uniformly(30, keys, writes);
    assert!(
        (0.45..0.75).contains(&sparse.utilization),
        "a free budget: utilisation near {} ({sparse:?})",
        crate::cleaner::RELAXED_LOW
    );
    assert!(
        sparse.segment_bytes <= 2 * sparse.live_bytes + 4 * SEG as u64,
        "at most about twice the live bytes: {sparse:?}"
    );
    assert!(tight.utilization >= 0.8, "a tight budget: {tight:?}");
    assert!(
        sparse_moved * 3 < tight_moved,
        "sparse cleaning copies far less: {sparse_moved} entries moved against {tight_moved}"
    );
}

#[test]
fn the_utilisation_target_rises_with_pressure() {
    use crate::cleaner::{
        INCREMENTAL_HIGH, INCREMENTAL_LOW, RELAXED_LOW, incremental_high, incremental_low,
    };
    assert_eq!(incremental_low(0.0), RELAXED_LOW);
    assert_eq!(incremental_low(0.25), RELAXED_LOW);
    assert_eq!(incremental_low(0.75), INCREMENTAL_LOW);
    assert_eq!(incremental_low(1.5), INCREMENTAL_LOW);
    assert!((incremental_high(1.0) - INCREMENTAL_HIGH).abs() < 1e-12);
    let mut last = 0.0;
    for i in 0..=100 {
        let low = incremental_low(f64::from(i) / 100.0);
        assert!(low >= last, "monotone at {i}%");
        assert!(incremental_high(f64::from(i) / 100.0) > low);
        last = low;
    }
}

/// A pass cut into one-entry slices while everything that can happen
/// between two requests happens between them.
#[test]
fn anything_between_slices_loses_nothing() {
    for seed in 0..6u64 {
        let mut e = engine(48);
        e.create_tablet(OTHER, HashRange::FULL).expect("other");
        let mut model = BTreeMap::new();
        let keys = 600u64;
        let any = RejectRules::default();
        let mut rng = Rng(seed);
        let mut passes = 0;
        for n in 0..20 * keys {
            if e.clean_pass.is_none() && n % 200 == 0 {
                // Force a pass over whatever is worth cleaning now.
                e.clean_pass = Pass::start(&e.tablets, &e.budget);
                passes += u32::from(e.clean_pass.is_some());
            }
            if let Some(mut pass) = e.clean_pass.take()
                && pass.slice(&mut e.tablets, &mut e.budget, 1) == Sliced::More
            {
                e.clean_pass = Some(pass);
            }
            let i = rng.next() % keys;
            match rng.next() % 100 {
                0..70 => {
                    let v = vec![(n % 251) as u8; 20 + (rng.next() % 200) as usize];
                    e.write(TABLE, &key(i), &v, &any).expect("write");
                    model.insert(key(i), v);
                }
                70..90 => {
                    e.remove(TABLE, &key(i), &any).expect("remove");
                    model.remove(&key(i));
                }
                90..94 => {
                    e.clean();
                }
                94..97 => {
                    // A scan holds the tablet for a while.
                    e.hold_cleaner(TABLE, 0, true).expect("hold");
                    e.write(OTHER, &key(i), b"x", &any).expect("other write");
                    e.hold_cleaner(TABLE, 0, false).expect("release");
                }
                _ => {
                    // The other table's tablet goes and comes back (its
                    // slot is reused, its segment ids start again at 1).
                    assert!(e.drop_tablet(OTHER, 0));
                    e.create_tablet(OTHER, HashRange::FULL).expect("again");
                    for j in 0..20 {
                        e.write(OTHER, &key(j), &[1; 300], &any).expect("other");
                    }
                }
            }
            if n % 500 == 0 {
                check(&e, &model, keys);
            }
        }
        assert!(passes > 3, "seed {seed}: {passes} passes");
        check(&e, &model, keys);
        // Replaying the surviving segments gives the same contents.
        let segs: Vec<Vec<u8>> = e
            .segments(TABLE, 0)
            .expect("segments")
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect();
        let mut r = engine(48);
        r.drop_tablet(TABLE, 0);
        r.replay(TABLE, HashRange::FULL, segs.iter().map(Vec::as_slice))
            .expect("replay");
        check(&r, &model, keys);
    }
}
