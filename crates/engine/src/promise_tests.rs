//! A promised group applies whatever fills the budget after the promise:
//! the case of a transaction's decision (`promise.rs`). Each scenario runs
//! once without the promise too, to show that it is the case that fails.

use super::*;
use crate::test_engine::engine_with;
use crate::{RecordId, RejectRules, max_entry_bytes};

/// The promised table, and another one competing for the budget.
const T: u64 = 4;
const OTHER: u64 = 5;
const SEGMENT: usize = 8192;

fn engine() -> Engine {
    engine_of(32)
}

fn engine_of(segments: usize) -> Engine {
    engine_with(SEGMENT, segments, 512, &[T, OTHER])
}

fn rid(class: u8, id: u64) -> RecordId {
    RecordId { class, id }
}

/// What a decision does: a commit record, `keys` new keys, the prepared
/// record's removal.
fn group(keys: usize) -> GroupSize {
    GroupSize {
        bytes: max_entry_bytes(6, 9) + keys * max_entry_bytes(8, 16) + max_entry_bytes(6, 17),
        new_keys: keys,
        new_records: 1,
        longest_key: 8,
    }
}

fn group_key(i: usize) -> Vec<u8> {
    format!("g{i:07}").into_bytes()
}

/// Apply the group: every step must succeed.
fn apply(e: &mut Engine, keys: usize) -> Result<(), EngineError> {
    e.put_record(T, b"anchor", rid(2, 7), &[0; 9])?;
    for i in 0..keys {
        e.write(T, &group_key(i), &[i as u8; 16], &RejectRules::default())?;
    }
    e.remove_record(T, b"anchor", rid(1, 7))?;
    Ok(())
}

/// Write new keys of falling sizes into both tables until every size is
/// refused: no head has room left and the budget is spent (every key is
/// live, so cleaning frees nothing). Returns how many keys were written.
fn fill(e: &mut Engine) -> usize {
    let mut n = 0;
    for size in [512usize, 128, 32, 4, 1] {
        let mut refused = 0;
        while refused < 40 {
            let table = if n % 3 == 0 { OTHER } else { T };
            let key = format!("f{n:07}");
            match e.write(
                table,
                key.as_bytes(),
                &vec![7; size],
                &RejectRules::default(),
            ) {
                Ok(_) => refused = 0,
                Err(EngineError::OutOfMemory) => refused += 1,
                Err(other) => panic!("filling: {other}"),
            }
            n += 1;
        }
    }
    n
}

#[test]
fn a_promised_decision_applies_on_a_budget_filled_after_the_promise() {
    for keys in [3, 120] {
        let mut e = engine();
        e.put_record(T, b"anchor", rid(1, 7), b"prepared")
            .expect("record");
        let g = group(keys);
        let promise = e.promise_head(T, 0, g).expect("promise");
        assert!(promise.bytes() >= g.bytes);
        assert_eq!(e.promised_bytes(T, 0), promise.bytes());
        fill(&mut e);
        assert_eq!(
            e.write(T, b"late", b"x", &RejectRules::default()),
            Err(EngineError::OutOfMemory),
            "the budget is spent"
        );
        // A first remove still fits (the head kept its tombstone slack
        // beside the promise).
        e.remove(T, b"f0000001", &RejectRules::default())
            .expect("a first remove on a full budget");
        let allocated = e.memory().segment_bytes;
        e.reserve_promised_head(promise, g.bytes)
            .expect("the promised room");
        assert_eq!(e.promised_bytes(T, 0), 0);
        apply(&mut e, keys).expect("every append of the promised group");
        assert_eq!(e.memory().segment_bytes, allocated, "nothing allocated");
        for i in 0..keys {
            assert_eq!(e.read(T, &group_key(i)).expect("read").value, [i as u8; 16]);
        }
        e.check_invariants();
    }
}

#[test]
fn without_the_promise_the_same_decision_is_refused() {
    // The control: the scenario above is one a decision cannot survive
    // without its promise (if this passes with the group applied, the test
    // above proves nothing).
    let keys = 120;
    let mut e = engine();
    e.put_record(T, b"anchor", rid(1, 7), b"prepared")
        .expect("record");
    fill(&mut e);
    let applied = e
        .reserve_head(T, 0, group(keys).bytes)
        .and_then(|()| apply(&mut e, keys));
    assert_eq!(applied, Err(EngineError::OutOfMemory));
}

#[test]
fn promises_are_limited_and_larger_writes_wait_for_them() {
    let mut e = engine();
    let fresh = SEGMENT - crate::entry::MAX_HEADER_BYTES;
    // A group larger than a fresh head can never be promised.
    let huge = GroupSize {
        bytes: fresh,
        ..GroupSize::default()
    };
    assert!(matches!(
        e.promise_head(T, 0, huge),
        Err(EngineError::ValueTooLarge { .. })
    ));
    // A lone promise may take most of the head; then nothing else fits
    // beside it, neither a second promise nor a write, until it goes.
    let big = GroupSize {
        bytes: fresh - 300,
        ..GroupSize::default()
    };
    let first = e.promise_head(T, 0, big).expect("a lone promise");
    assert!(matches!(
        e.promise_head(T, 0, group(1)),
        Err(EngineError::HeadPromised { .. })
    ));
    let value = vec![1u8; 512];
    assert!(matches!(
        e.write(T, b"k", &value, &RejectRules::default()),
        Err(EngineError::HeadPromised { .. })
    ));
    // Other tablets are not held.
    e.write(OTHER, b"k", &value, &RejectRules::default())
        .expect("another tablet");
    drop(first);
    e.write(T, b"k", &value, &RejectRules::default())
        .expect("the write once the promise is gone");
    // Several promises share half a head.
    let mut held = Vec::new();
    loop {
        match e.promise_head(T, 0, group(4)) {
            Ok(p) => held.push(p),
            Err(EngineError::HeadPromised { max, .. }) => {
                assert_eq!(max, fresh / 2);
                break;
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert!(held.len() >= 2);
    assert!(e.promised_bytes(T, 0) <= fresh / 2);
    // Writes up to half a head still fit beside them.
    e.write(T, b"k2", &value, &RejectRules::default())
        .expect("a write beside the promises");
    drop(held);
    assert_eq!(e.promised_bytes(T, 0), 0);
    e.check_invariants();
}

#[test]
fn a_promise_holds_index_slots_against_other_new_keys() {
    let mut e = engine();
    let g = GroupSize {
        bytes: 64,
        new_keys: 40,
        new_records: 0,
        longest_key: 0,
    };
    let t = |e: &mut Engine| -> (usize, usize) {
        let t = e
            .tablets
            .iter()
            .flatten()
            .find(|t| t.table == T)
            .expect("tablet");
        (t.index.capacity(), t.index.len())
    };
    let promise = e.promise_head(T, 0, g).expect("promise");
    // Other new keys never take the promised slots.
    for i in 0..200 {
        e.write(T, format!("n{i}").as_bytes(), b"v", &RejectRules::default())
            .expect("write");
        let (capacity, len) = t(&mut e);
        assert!(capacity - len >= 40, "{capacity} - {len}");
    }
    drop(promise);
}

#[derive(Clone, Debug)]
enum Op {
    /// Write key `0..200` of the plain keys with a value of `size` bytes.
    Write(u8, u16),
    Remove(u8),
    /// Promise a group of `n` new keys.
    Promise(u8),
    /// Apply the promised group at this position (modulo how many are held).
    Apply(u8),
    /// A whole cleaner pass.
    Clean,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        8 => (0u8..200, 0u16..512).prop_map(|(k, s)| Op::Write(k, s)),
        2 => (0u8..200).prop_map(Op::Remove),
        1 => (1u8..30).prop_map(Op::Promise),
        1 => any::<u8>().prop_map(Op::Apply),
        1 => Just(Op::Clean),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// On a budget that fills and empties, a promised group always applies
    /// whole, whatever was written, removed or promised in between; plain
    /// writes may be refused (for memory, or for room promised), and the
    /// engine agrees with a model of what was acknowledged.
    #[test]
    fn promised_groups_always_apply(ops in proptest::collection::vec(op(), 1..600)) {
        // Small enough that the writes fill it (and removes empty it): in
        // about 60 % of the cases some writes are refused.
        let mut e = engine_of(8);
        let mut model = std::collections::BTreeMap::<Vec<u8>, Vec<u8>>::new();
        let mut held: Vec<(HeadPromise, u64, usize)> = Vec::new();
        let mut next_group = 0u64;
        let group_key = |g: u64, i: usize| format!("p{g:05}-{i:02}").into_bytes();
        for op in ops {
            match op {
                Op::Write(k, size) => {
                    let key = format!("k{k:03}").into_bytes();
                    let value = vec![k; usize::from(size)];
                    match e.write(T, &key, &value, &RejectRules::default()) {
                        Ok(_) => {
                            model.insert(key, value);
                        }
                        Err(EngineError::OutOfMemory | EngineError::HeadPromised { .. }) => {}
                        Err(other) => panic!("write: {other}"),
                    }
                }
                Op::Remove(k) => {
                    let key = format!("k{k:03}").into_bytes();
                    match e.remove(T, &key, &RejectRules::default()) {
                        Ok(_) => {
                            model.remove(&key);
                        }
                        Err(EngineError::OutOfMemory) => {}
                        Err(other) => panic!("remove: {other}"),
                    }
                }
                Op::Promise(n) => {
                    let n = usize::from(n);
                    let g = GroupSize {
                        bytes: n * max_entry_bytes(9, 16),
                        new_keys: n,
                        new_records: 0,
                        longest_key: 9,
                    };
                    match e.promise_head(T, 0, g) {
                        Ok(p) => {
                            held.push((p, next_group, n));
                            next_group += 1;
                        }
                        Err(EngineError::OutOfMemory | EngineError::HeadPromised { .. }) => {}
                        Err(other) => panic!("promise: {other}"),
                    }
                }
                Op::Clean => {
                    e.clean();
                }
                Op::Apply(i) => {
                    if held.is_empty() {
                        continue;
                    }
                    let (p, g, n) = held.swap_remove(usize::from(i) % held.len());
                    e.reserve_promised_head(p, n * max_entry_bytes(9, 16))
                        .expect("the promised room");
                    for j in 0..n {
                        let key = group_key(g, j);
                        e.write(T, &key, &[j as u8; 16], &RejectRules::default())
                            .expect("a promised write");
                        model.insert(key, vec![j as u8; 16]);
                    }
                }
            }
        }
        drop(held);
        for (key, value) in &model {
            let got = e.read(T, key).expect("an acknowledged key");
            proptest::prop_assert_eq!(got.value, &value[..]);
        }
        e.check_invariants();
    }
}
