//! Model-based property tests: random sequences of every operation, run on
//! the engine and on a `BTreeMap` reference; they must agree after every step.
//!
//! Segments are 4 KiB and values at most 600 bytes, so segment rollover and
//! the cleaner run constantly; a second configuration has a budget so tight
//! that writes fail with `OutOfMemory`, which must leave no trace, while a
//! remove never does (also from a budget full of live objects only).

mod shared;

use insitu_engine::{TableId, key_hash};
use proptest::prelude::*;

#[path = "model/harness.rs"]
mod harness;
#[path = "model/ops.rs"]
mod ops;

use harness::Harness;
use ops::{Op, Rules, op};

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
        | Op::IncF64 { t, k, .. }
        | Op::WriteExpiring { t, k, .. } = op
        {
            h.check_read(TABLES[*t], &key_bytes(*k));
        }
    }
    for s in h.engine.tablets() {
        h.check_tablet_contents(s.table, s.range);
    }
    // Everything due is found by the sweep and removed.
    h.sweep_all();
    h.check_stats();
    h
}

/// Every key of both tables written once, in `order`, with the value
/// lengths given (so the tight budget fills with live, packed objects and
/// later writes are refused), then every key removed in `removal` order.
/// The first removal in each tablet may not fail (its head kept room for
/// it); later ones may, as steps 2-3 of the argument do not cover every
/// budget (counted in `remove_ooms`).
fn fill_then_remove(order: &[usize], lens: &[usize], removal: &[usize]) -> Harness {
    let key = |i: usize| {
        let (t, k) = (i % TABLES.len(), (i / TABLES.len()) as u8);
        (t, k, (TABLES[t], key_bytes(k)))
    };
    let mut h = Harness::new(10);
    for &i in order {
        let (t, k, (table, key)) = key(i);
        let len = lens[i % lens.len()];
        h.apply(&Op::Write {
            t,
            k,
            len,
            fill: k,
            rules: Rules::none(),
        });
        h.check_read(table, &key);
    }
    h.check_stats();
    let mut removed_from = Vec::new();
    for &i in removal {
        let (t, k, (table, key)) = key(i);
        let tablet = h
            .engine
            .tablet_for(table, key_hash(table, &key))
            .expect("covered");
        h.removes_may_fail = removed_from.contains(&(table, tablet.start));
        h.apply(&Op::Remove {
            t,
            k,
            rules: Rules::none(),
        });
        removed_from.push((table, tablet.start));
        h.check_stats();
        h.check_read(table, &key);
    }
    for s in h.engine.tablets() {
        h.check_tablet_contents(s.table, s.range);
    }
    h
}

/// Inputs of `fill_then_remove`: both orders shuffled, value lengths mixed
/// (under 8 bytes, a removed object's entry is smaller than its tombstone).
fn fill_then_remove_inputs() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<usize>)> {
    let all = || Just((0..TABLES.len() * usize::from(KEYS)).collect::<Vec<usize>>()).prop_shuffle();
    // Mostly long values, so 128 objects overfill the tight budget.
    let lens = proptest::collection::vec(
        prop_oneof![1 => 0usize..8, 1 => 8usize..300, 3 => 300usize..=MAX_VALUE],
        2..8,
    );
    (all(), lens, all())
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

    /// A full budget of live objects only (no overwrite, no remove yet, so
    /// nothing to reclaim): the first remove in each tablet still succeeds
    /// (the harness refuses its OutOfMemory), small values (shorter than a
    /// tombstone's) included.
    #[test]
    fn removes_succeed_on_a_budget_full_of_live_objects(
        (order, lens, removal) in fill_then_remove_inputs()
    ) {
        fill_then_remove(&order, &lens, &removal);
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
            "budget {budget}: cleaned {cleaned} tombstones dropped {dropped} ooms {ooms} splits {splits} replays {replays} max segments/tablet {segments}"
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
    }
    // The fill-then-remove workloads mostly fill the budget (writes are
    // refused) before their removes.
    let (mut filled, mut later_remove_ooms) = (0, 0);
    for _ in 0..10 {
        let (order, lens, removal) = fill_then_remove_inputs()
            .new_tree(&mut runner)
            .expect("tree")
            .current();
        let h = fill_then_remove(&order, &lens, &removal);
        filled += usize::from(h.counts.ooms > h.counts.remove_ooms);
        later_remove_ooms += h.counts.remove_ooms;
    }
    eprintln!("fill then remove: {filled} of 10 filled, later removes refused {later_remove_ooms}");
    assert!(
        filled >= 7,
        "only {filled} of 10 fill-then-remove runs filled the budget"
    );
}
