//! A full budget: removes must always succeed, and the space they free must
//! become usable for new writes.

mod shared;

use shared::segment_copies;

use insitu_engine::{
    Engine, EngineConfig, EngineError, HashRange, RejectRules, max_entry_bytes, object_entry_bytes,
};

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

const SEG: usize = 4096;
/// The tablet whose first remove is at stake, and the one holding the remove reserve.
const PACKED: u64 = 1;
const OTHER: u64 = 2;

/// Write `value` under `key` until the budget refuses it; returns whether it fitted.
fn fits(e: &mut Engine, table: u64, key: &[u8], value: &[u8]) -> bool {
    match e.write(table, key, value, &RejectRules::default()) {
        Ok(_) => true,
        Err(EngineError::OutOfMemory) => false,
        Err(other) => panic!("unexpected {other}"),
    }
}

/// Write objects with keys `{prefix}-{n}` into `table`, values of
/// `max_value` bytes and then of every shorter length, each until the budget
/// refuses it 20 times in a row: the head ends packed. Appends the keys
/// written to `keys`.
fn pack(e: &mut Engine, table: u64, prefix: &str, max_value: usize, keys: &mut Vec<Vec<u8>>) {
    for len in (0..=max_value).rev() {
        let mut refused = 0;
        while refused < 20 {
            let key = format!("{prefix}-{:06}", keys.len()).into_bytes();
            if fits(e, table, &key, &vec![3; len]) {
                keys.push(key);
                refused = 0;
            } else {
                refused += 1;
            }
        }
    }
}

/// The case a remove reserve cannot cover: a budget of 8 small segments,
/// tablet `PACKED` holding only live objects (no remove, no overwrite) in a
/// head filled until writes of every value length up to `max_value` fail,
/// the rest of the budget full of `OTHER`'s objects, and `OTHER` holding the
/// remove reserve with a head opened for its own removes. Returns the engine
/// and `PACKED`'s keys.
fn packed_tablet_on_a_full_budget(max_value: usize) -> (Engine, Vec<Vec<u8>>) {
    let config = EngineConfig {
        segment_bytes: SEG,
        memory_budget_bytes: 8 * SEG,
        max_value_bytes: 600,
    };
    let mut e = Engine::with_max_key_bytes(config, 64).expect("config");
    e.create_tablet(PACKED, HashRange::FULL).expect("tablet");
    e.create_tablet(OTHER, HashRange::FULL).expect("tablet");
    let packed_key = |i: usize| format!("packed-{i:06}").into_bytes();
    // While the budget is roomy, enough objects that the index already has
    // slots for the whole packed head (it grows at 29 and 113 objects, to
    // 56 and 224 slots): packing must be refused for the head, not the index.
    let prime = if max_value >= 100 { 29 } else { 113 };
    let mut keys: Vec<Vec<u8>> = (0..prime).map(packed_key).collect();
    for key in &keys {
        assert!(
            fits(&mut e, PACKED, key, &vec![1; max_value]),
            "a roomy budget"
        );
    }
    // The other tablet takes everything else (300-byte values keep its
    // index small), and both heads are packed.
    let mut other = Vec::new();
    pack(&mut e, OTHER, "other", 300, &mut other);
    pack(&mut e, PACKED, "packed", max_value, &mut keys);
    let packed = e.tablet_stats(PACKED, 0).expect("stats");
    assert_eq!(packed.segments, 1, "the packed tablet is its head alone");
    assert_eq!(packed.object_count, keys.len() as u64);
    // Only live objects after one version mark: the head's free room is
    // less than the smallest object and a tombstone for a key twice as long
    // (the most room a head keeps for one).
    let room = SEG - object_entry_bytes(0, 0, 1) - packed.live_bytes as usize;
    let key_len = keys[0].len();
    assert!(
        room < max_entry_bytes(key_len, 0) + max_entry_bytes(2 * key_len, 8),
        "the head is not packed: {room} bytes free"
    );
    // The other tablet's removes take the remove reserve for a new head.
    // Its first remove (or second, after its head's room for one tombstone).
    let segments_before = e.memory().segment_bytes;
    for key in other.iter().take(2) {
        e.remove(OTHER, key, &RejectRules::default())
            .expect("the reserve lets the other tablet remove");
        if e.memory().segment_bytes > segments_before {
            break;
        }
    }
    let m = e.memory();
    assert!(
        m.segment_bytes > segments_before,
        "the reserve was not taken"
    );
    assert!(
        m.segment_bytes + m.index_bytes + m.transient_bytes + 2 * SEG as u64 > m.budget_bytes,
        "a tombstone head (beside the cleaner reserve) must not fit any more: {m:?}"
    );
    e.check_invariants();
    (e, keys)
}

/// The removed key stays removed after a replay of the tablet's segments
/// (a recovery), and every other key comes back with its value.
fn assert_replay_keeps_removed(e: &Engine, removed: &[Vec<u8>], kept: &[Vec<u8>]) {
    let segments = segment_copies(e, PACKED, 0);
    let config = EngineConfig {
        memory_budget_bytes: 64 * SEG,
        ..e.config().clone()
    };
    let mut fresh = Engine::with_max_key_bytes(config, 64).expect("config");
    fresh
        .replay(PACKED, HashRange::FULL, segments.iter().map(|s| &s[..]))
        .expect("replay");
    for key in removed {
        assert_eq!(
            fresh.read(PACKED, key).map(|o| o.version),
            Err(EngineError::ObjectDoesntExist),
            "a removed key came back after replay"
        );
    }
    for key in kept {
        assert_eq!(
            fresh.read(PACKED, key).map(|_| ()),
            e.read(PACKED, key).map(|_| ())
        );
    }
    fresh.check_invariants();
}

/// The first remove in a tablet of only live, packed objects succeeds on a
/// full budget whose remove reserve another tablet holds (a head keeps room
/// for one tombstone of its tablet's keys), and every later remove does too
/// (each removed 100-byte object leaves more dead bytes than its tombstone).
#[test]
fn the_first_remove_in_a_packed_tablet_succeeds_when_the_remove_reserve_is_taken() {
    let (mut e, keys) = packed_tablet_on_a_full_budget(100);
    let first = e.remove(PACKED, &keys[0], &RejectRules::default());
    assert!(matches!(first, Ok(v) if v > 0), "first remove: {first:?}");
    assert_eq!(
        e.read(PACKED, &keys[0]).map(|_| ()),
        Err(EngineError::ObjectDoesntExist)
    );
    e.check_invariants();
    assert_replay_keeps_removed(&e, &keys[..1], &keys[1..]);
    for (i, key) in keys.iter().enumerate().skip(1) {
        let got = e.remove(PACKED, key, &RejectRules::default());
        assert!(
            matches!(got, Ok(v) if v > 0),
            "remove {i} of {}: {got:?}",
            keys.len()
        );
    }
    e.check_invariants();
    assert_eq!(e.tablet_stats(PACKED, 0).expect("stats").object_count, 0);
    assert_replay_keeps_removed(&e, &keys, &[]);
}

/// The same with values shorter than a tombstone's 8 bytes, where a removed
/// object's dead entry is smaller than the tombstone written for it: the
/// head's room for one tombstone is what lets the first remove through.
#[test]
fn the_first_remove_of_a_small_value_in_a_packed_tablet_succeeds() {
    for max_value in [0, 7] {
        let (mut e, keys) = packed_tablet_on_a_full_budget(max_value);
        let last = keys.last().expect("a key");
        let first = e.remove(PACKED, last, &RejectRules::default());
        assert!(
            matches!(first, Ok(v) if v > 0),
            "values of at most {max_value} bytes: {first:?}"
        );
        e.check_invariants();
        assert_replay_keeps_removed(&e, &keys[keys.len() - 1..], &keys[..keys.len() - 1]);
    }
}
