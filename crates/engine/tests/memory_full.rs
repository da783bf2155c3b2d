//! A full budget: removes must always succeed, and the space they free must
//! become usable for new writes.

use insitu_engine::{Engine, EngineConfig, EngineError, HashRange, RejectRules};

const TABLE: u64 = 4;
const TABLETS: u64 = 6;
const VALUE_BYTES: usize = 1024;

/// Default-sized segments (2 MiB) and a budget of 30 MiB over several tablets.
fn full_engine() -> (Engine, Vec<Vec<u8>>) {
    let config = EngineConfig {
        segment_bytes: 2 << 20,
        memory_budget_bytes: 30 << 20,
        max_value_bytes: 1 << 20,
    };
    let mut e = Engine::new(config).expect("config");
    let step = u64::MAX / TABLETS;
    for i in 0..TABLETS {
        let end = if i + 1 == TABLETS {
            u64::MAX
        } else {
            (i + 1) * step - 1
        };
        e.create_tablet(
            TABLE,
            HashRange {
                start: i * step,
                end,
            },
        )
        .expect("tablet");
    }
    // Fill every tablet's head: go on past the first OutOfMemory (other
    // tablets may still have room) until 1,000 writes in a row fail.
    let mut keys = Vec::new();
    let value = vec![7u8; VALUE_BYTES];
    let mut failures_in_a_row = 0;
    for i in 0u64..1_000_000 {
        let key = format!("object-{i:08}").into_bytes();
        match e.write(TABLE, &key, &value, &RejectRules::default()) {
            Ok(_) => {
                keys.push(key);
                failures_in_a_row = 0;
            }
            Err(EngineError::OutOfMemory) => failures_in_a_row += 1,
            Err(other) => panic!("unexpected {other}"),
        }
        if failures_in_a_row == 1_000 {
            break;
        }
    }
    assert_eq!(failures_in_a_row, 1_000, "the budget never filled");
    (e, keys)
}

#[test]
fn removes_succeed_on_a_full_budget_and_free_space_for_new_writes() {
    let (mut e, keys) = full_engine();
    assert!(keys.len() > 21_000, "filled with {} objects", keys.len());
    // 20,000 removes, spread over every tablet: none may fail.
    let mut failed = 0;
    for key in keys.iter().take(20_000) {
        match e.remove(TABLE, key, &RejectRules::default()) {
            Ok(v) => assert!(v > 0),
            Err(EngineError::OutOfMemory) => failed += 1,
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert_eq!(
        failed, 0,
        "removes failed with OutOfMemory on a full budget"
    );
    e.check_invariants();
    // ~20 MB were removed: 15,000 new 1 KB objects must fit.
    let value = vec![9u8; VALUE_BYTES];
    let mut failed = 0;
    for i in 0..15_000u64 {
        let key = format!("new-{i:08}").into_bytes();
        if let Err(err) = e.write(TABLE, &key, &value, &RejectRules::default()) {
            assert_eq!(err, EngineError::OutOfMemory);
            failed += 1;
        }
    }
    assert_eq!(failed, 0, "writes failed after removes freed the space");
    e.check_invariants();
    for key in keys.iter().skip(20_000) {
        assert_eq!(
            e.read(TABLE, key).expect("survivor").value.len(),
            VALUE_BYTES
        );
    }
}
