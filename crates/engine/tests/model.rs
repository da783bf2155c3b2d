//! Model-based property tests: random sequences of every operation, run on
//! the engine and on a `BTreeMap` reference; they must agree after every step.
//!
//! Segments are 4 KiB and values at most 600 bytes, so segment rollover and
//! the cleaner run constantly; a second configuration has a budget so tight
//! that writes fail with `OutOfMemory`, which must leave no trace.

use insitu_engine::TableId;
use proptest::prelude::*;

#[path = "model/harness.rs"]
mod harness;
#[path = "model/ops.rs"]
mod ops;

use harness::Harness;
use ops::{Op, op};

const SEGMENT_BYTES: usize = 4096;
const MAX_VALUE: usize = 600;
const MAX_KEY: usize = 64;
const TABLES: [TableId; 2] = [1, 2];
const KEYS: u8 = 64;
/// Splits stop here, so tablets keep several segments of data each.
const MAX_TABLETS: usize = 5;

fn key_bytes(k: u8) -> Vec<u8> {
    let len = 1 + (usize::from(k) * 13) % 40;
    (0..len)
        .map(|i| {
            if i == 0 {
                k
            } else {
                k.wrapping_mul(31).wrapping_add(i as u8)
            }
        })
        .collect()
}

fn value_bytes(len: usize, fill: u8) -> Vec<u8> {
    (0..len).map(|i| fill.wrapping_add(i as u8)).collect()
}

fn run(ops: &[Op], budget_segments: usize) -> Harness {
    let mut h = Harness::new(budget_segments);
    for op in ops {
        h.apply(op);
        h.check_stats();
        if let Op::Write { t, k, .. }
        | Op::Remove { t, k, .. }
        | Op::IncI64 { t, k, .. }
        | Op::IncF64 { t, k, .. } = op
        {
            h.check_read(TABLES[*t], &key_bytes(*k));
        }
    }
    for s in h.engine.tablets() {
        h.check_tablet_contents(s.table, s.range);
    }
    h
}

proptest! {
    // Modest by default (the suite must stay fast in debug); PROPTEST_CASES overrides for a soak.
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(48), ..ProptestConfig::default() })]

    /// Roomy budget: every operation must succeed as the model predicts.
    #[test]
    fn engine_matches_model(ops in proptest::collection::vec(op(), 1..600)) {
        run(&ops, 256);
    }

    /// Tight budget: OutOfMemory may happen and must change nothing.
    #[test]
    fn engine_matches_model_under_a_tight_budget(ops in proptest::collection::vec(op(), 1..600)) {
        run(&ops, 10);
    }
}

/// The generated workloads really exercise what the properties are about:
/// rollover, cleaning, tombstone dropping, splits, replays, and (under the
/// tight budget) OutOfMemory. Deterministic, so it cannot pass by luck.
#[test]
fn workloads_exercise_cleaner_splits_replay_and_out_of_memory() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    for budget in [256, 10] {
        let (mut cleaned, mut dropped, mut ooms, mut splits, mut replays, mut segments) =
            (0, 0, 0, 0, 0, 0);
        let mut remove_ooms = 0;
        for _ in 0..10 {
            let ops = proptest::collection::vec(op(), 600)
                .new_tree(&mut runner)
                .expect("tree")
                .current();
            let h = run(&ops, budget);
            let c = h.engine.cleaner_totals();
            cleaned += c.segments_cleaned;
            dropped += c.tombstones_dropped;
            ooms += h.counts.ooms;
            remove_ooms += h.counts.remove_ooms;
            splits += h.counts.splits;
            replays += h.counts.replays;
            segments = segments.max(
                h.engine
                    .tablets()
                    .iter()
                    .map(|t| t.segments)
                    .max()
                    .unwrap_or(0),
            );
        }
        eprintln!(
            "budget {budget}: cleaned {cleaned} tombstones dropped {dropped} ooms {ooms} splits {splits} replays {replays} max segments/tablet {segments} remove ooms {remove_ooms}"
        );
        assert!(
            cleaned >= 20 && dropped >= 10 && splits >= 5 && replays >= 5 && segments >= 3,
            "weak workload"
        );
        assert_eq!(
            ooms > 0,
            budget < 64,
            "OutOfMemory only and always under the tight budget"
        );
        // Removes compact their own tablet when the budget is full: none of
        // these workloads' removes is refused (one was before that).
        assert_eq!(remove_ooms, 0, "a remove failed on a full budget");
    }
}
