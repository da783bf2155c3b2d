//! The memory budget covers the hash index and transient copies, not only
//! log segments.

mod shared;

use shared::engine_of;

use insitu_engine::{Engine, EngineError, RejectRules};

const T: u64 = 8;

fn engine(segments: usize) -> Engine {
    engine_of(64 * 1024, 64 * 1024 * segments, 1024, &[T])
}

fn used(e: &Engine) -> u64 {
    let m = e.memory();
    m.segment_bytes + m.index_bytes + m.transient_bytes
}

#[test]
fn index_growth_is_counted_and_refused_when_the_budget_is_full() {
    let mut e = engine(8);
    let mut written = 0u64;
    let mut first_refusal = None;
    for i in 0..40_000u64 {
        match e.write(T, &i.to_le_bytes(), b"", &RejectRules::default()) {
            Ok(_) => written += 1,
            Err(EngineError::OutOfMemory) => {
                first_refusal.get_or_insert(e.memory());
            }
            Err(other) => panic!("unexpected {other}"),
        }
        assert!(used(&e) <= e.memory().budget_bytes, "over budget at {i}");
    }
    let m = first_refusal.expect("tiny objects must exhaust the budget");
    // 40-byte entries: without the index ~12,000 objects would fit in the
    // 6 segments writes may use; the index's 16-byte entries (plus control
    // bytes and headroom) take a large share of the budget.
    assert!(m.index_bytes > 64 * 1024, "index counted: {m:?}");
    assert!(written < 12_000, "{written} objects fitted");
    e.check_invariants();
    // Every object written is still there.
    for i in 0..written {
        assert!(e.read(T, &i.to_le_bytes()).is_ok());
    }
}

#[test]
fn transient_charges_take_budget_until_dropped() {
    let e = engine(8);
    let budget = e.memory().budget_bytes;
    assert_eq!(
        e.try_charge_transient(budget).err(),
        Some(EngineError::OutOfMemory),
        "the reserves are not for transient copies"
    );
    let charge = e.try_charge_transient(3 * 64 * 1024).expect("fits");
    assert_eq!(charge.bytes(), 3 * 64 * 1024);
    assert_eq!(e.memory().transient_bytes, 3 * 64 * 1024);
    assert!(
        e.try_charge_transient(3 * 64 * 1024 + 1).is_err(),
        "6 of 8 segments are usable"
    );
    drop(charge);
    assert_eq!(e.memory().transient_bytes, 0);
    assert!(e.try_charge_transient(3 * 64 * 1024).is_ok());
}

#[test]
fn writes_see_transient_charges_and_index_snapshots() {
    let mut e = engine(8);
    for i in 0..1_000u64 {
        e.write(T, &i.to_le_bytes(), &[1; 100], &RejectRules::default())
            .expect("write");
    }
    let snap = e.index_snapshot(T, 0).expect("snapshot");
    assert_eq!(e.memory().transient_bytes, 8 * 1_000);
    drop(snap);
    assert_eq!(e.memory().transient_bytes, 0);
    // Holding almost all of the usable budget, writes soon find it full.
    let free = 6 * 64 * 1024 - used(&e);
    let hold = e.try_charge_transient(free - 1024).expect("charge");
    let refused = (1_000..3_000u64)
        .filter(|i| {
            e.write(T, &i.to_le_bytes(), &[1; 100], &RejectRules::default())
                .is_err()
        })
        .count();
    assert!(refused > 0);
    assert!(used(&e) <= e.memory().budget_bytes);
    drop(hold);
    e.check_invariants();
}
