use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::locks::KeyRef;
use std::hash::RandomState;

fn item(key: &str, read: Option<u64>, write: Write) -> Item {
    Item {
        table: 1,
        key: key.as_bytes().to_vec(),
        hash: key.len() as u64,
        read_version: read,
        write,
    }
}

fn put(key: &str, read: Option<u64>) -> Item {
    item(key, read, Write::Put(b"v".to_vec()))
}

fn none(_: &Item) -> u64 {
    0
}

fn anchor(key: &str) -> Anchor {
    Anchor {
        table: 1,
        key: key.as_bytes().to_vec(),
    }
}

#[test]
fn the_primary_is_anchored_at_its_first_item() {
    let mut p = Participant::new(Limits::default());
    p.prepare(1, None, vec![anchor("z")], vec![put("b", None)], 0, none)
        .unwrap();
    let prepared = p.prepared(1).unwrap();
    assert!(prepared.is_primary);
    assert_eq!(prepared.primary, anchor("b"));
    assert_eq!(prepared.others, vec![anchor("z")]);
    p.prepare(2, Some(anchor("q")), vec![], vec![put("c", None)], 0, none)
        .unwrap();
    assert!(!p.prepared(2).unwrap().is_primary);
    assert_eq!(
        p.prepare(3, None, vec![], vec![], 0, none)
            .map_err(|r| matches!(r, Refusal::Bad(_))),
        Err(true),
        "a prepare without items is refused"
    );
    p.check();
}

#[test]
fn restored_parts_merge_lock_and_follow_a_known_decision() {
    let mut p = Participant::new(Limits::default());
    // Two tablets' records of one transaction: the secondary part first,
    // then the primary's anchor record, which makes it the primary here.
    p.restore(5, anchor("a"), false, vec![], vec![put("b", None)], 0)
        .unwrap();
    p.restore(
        5,
        anchor("a"),
        true,
        vec![anchor("x")],
        vec![put("a", None)],
        0,
    )
    .unwrap();
    p.check();
    assert!(p.locks().is_locked(1, b"a") && p.locks().is_locked(1, b"b"));
    let prepared = p.prepared(5).unwrap();
    assert!(prepared.is_primary);
    assert_eq!(prepared.others, vec![anchor("x")]);
    assert_eq!(prepared.items.len(), 2);
    // A key another transaction holds stays with it; the clash is reported.
    assert!(
        p.restore(6, anchor("a"), false, vec![], vec![put("a", None)], 0)
            .is_err()
    );
    p.decide(6, false, 0);
    // A commit decision restored beside a prepared part: a later decide,
    // even one asking to abort, applies the recorded commit.
    p.restore_decision(5, true, 0);
    let (committed, apply) = p.decide(5, false, 1);
    assert!(committed);
    match apply {
        Apply::Writes(items) => assert_eq!(items.len(), 2),
        Apply::Nothing => panic!("the restored commit was not applied"),
    }
    assert_eq!(p.locks().len(), 0);
    p.check();
}

#[test]
fn a_borrowed_key_hashes_and_compares_as_the_owned_one() {
    use std::hash::BuildHasher;
    let state = RandomState::new();
    for (table, key) in [(0u64, &b""[..]), (7, b"k"), (u64::MAX, &[0u8, 255, 3][..])] {
        let owned = (table, key.to_vec());
        assert_eq!(state.hash_one(KeyRef(table, key)), state.hash_one(&owned));
        assert!(hashbrown::Equivalent::equivalent(
            &KeyRef(table, key),
            &owned
        ));
        assert!(!hashbrown::Equivalent::equivalent(
            &KeyRef(table.wrapping_add(1), key),
            &owned
        ));
    }
    // Through the participant: locked while prepared, free once decided.
    let mut p = Participant::new(Limits::default());
    p.prepare(1, None, vec![], vec![put("a", None)], 0, none)
        .unwrap();
    assert!(p.locks().is_locked(1, b"a"));
    assert!(!p.locks().is_locked(1, b"b") && !p.locks().is_locked(2, b"a"));
    p.decide(1, true, 1);
    assert!(!p.locks().is_locked(1, b"a"));
}

#[test]
fn a_locked_key_refuses_other_transactions_until_decided() {
    let mut p = Participant::new(Limits::default());
    p.prepare(1, None, vec![], vec![put("a", None)], 0, none)
        .unwrap();
    assert!(p.locks().is_locked(1, b"a"));
    let refused = p.prepare(2, None, vec![], vec![put("a", None)], 0, none);
    assert!(
        matches!(refused, Err(Refusal::Locked { by: 1, .. })),
        "{refused:?}"
    );
    // A read of a locked key is refused too: it may be about to change.
    let refused = p.prepare(
        3,
        None,
        vec![],
        vec![item("a", Some(0), Write::None)],
        0,
        none,
    );
    assert!(
        matches!(refused, Err(Refusal::Locked { by: 1, .. })),
        "{refused:?}"
    );
    let (committed, apply) = p.decide(1, true, 1);
    assert!(committed);
    assert_eq!(apply, Apply::Writes(vec![put("a", None)]));
    assert!(!p.locks().is_locked(1, b"a"));
    p.prepare(2, None, vec![], vec![put("a", None)], 1, none)
        .unwrap();
    p.check();
}

#[test]
fn a_released_part_unlocks_and_records_no_decision() {
    let mut p = Participant::new(Limits::default());
    let items = vec![
        put("a", None),
        item("b", Some(0), Write::None),
        put("c", None),
    ];
    p.prepare(7, None, vec![], items, 0, none).unwrap();
    assert!(p.locks().is_locked(1, b"a") && p.locks().is_locked(1, b"c"));
    assert!(p.held_bytes() > 0);
    let writes = p.release(7).expect("prepared");
    assert_eq!(
        writes,
        vec![put("a", None), put("c", None)],
        "its writes, not its reads"
    );
    assert!(p.locks().is_empty() && p.held_bytes() == 0);
    assert_eq!(p.decision(7), None, "nothing recorded");
    assert_eq!(p.release(7), None, "released once");
    // The same id may prepare again (it was never decided).
    p.prepare(7, None, vec![], vec![put("a", None)], 1, none)
        .unwrap();
    p.check();
}

#[test]
fn a_changed_read_is_refused_and_locks_nothing() {
    let mut p = Participant::new(Limits::default());
    let refused = p.prepare(
        1,
        None,
        vec![],
        vec![put("b", None), item("a", Some(3), Write::None)],
        0,
        |i| if i.key == b"a" { 4 } else { 0 },
    );
    assert_eq!(
        refused,
        Err(Refusal::Changed {
            table: 1,
            key: b"a".to_vec(),
            read: 3,
            now: 4
        })
    );
    assert_eq!(p.locks().len(), 0);
    assert_eq!(p.held_bytes(), 0);
    p.check();
}

#[test]
fn reads_are_validated_but_not_locked() {
    let mut p = Participant::new(Limits::default());
    p.prepare(
        1,
        None,
        vec![],
        vec![item("a", Some(0), Write::None)],
        0,
        none,
    )
    .unwrap();
    assert!(!p.locks().is_locked(1, b"a"));
    assert_eq!(p.decide(1, true, 0), (true, Apply::Writes(vec![])));
}

#[test]
fn the_first_decision_stands() {
    let mut p = Participant::new(Limits::default());
    p.prepare(7, None, vec![], vec![put("a", None)], 0, none)
        .unwrap();
    assert_eq!(p.decide(7, false, 0), (false, Apply::Nothing));
    assert_eq!(p.decide(7, true, 0), (false, Apply::Nothing));
    assert_eq!(p.decision(7), Some(false));
    // A resent prepare after the decision is refused with it.
    let refused = p.prepare(7, None, vec![], vec![put("a", None)], 0, none);
    assert_eq!(refused, Err(Refusal::Decided { committed: false }));
}

#[test]
fn asking_about_an_unknown_transaction_aborts_its_late_prepare() {
    let mut p = Participant::new(Limits::default());
    assert_eq!(p.phase(9, &anchor("a"), 0), Phase::Aborted);
    let refused = p.prepare(9, Some(anchor("x")), vec![], vec![put("a", None)], 1, none);
    assert_eq!(refused, Err(Refusal::Decided { committed: false }));
    assert_eq!(p.locks().len(), 0);
}

#[test]
fn a_resent_prepare_is_a_yes_and_an_id_collision_is_refused() {
    let mut p = Participant::new(Limits::default());
    p.prepare(1, None, vec![], vec![put("a", None)], 0, none)
        .unwrap();
    p.prepare(1, None, vec![], vec![put("a", None)], 0, none)
        .unwrap();
    let refused = p.prepare(1, None, vec![], vec![put("b", None)], 0, none);
    assert!(matches!(refused, Err(Refusal::Bad(_))), "{refused:?}");
    let refused = p.prepare(
        2,
        None,
        vec![],
        vec![put("c", None), put("c", None)],
        0,
        none,
    );
    assert!(matches!(refused, Err(Refusal::Bad(_))), "{refused:?}");
    p.check();
}

#[test]
fn held_bytes_are_bounded() {
    let mut p = Participant::new(Limits {
        max_held_bytes: 1000,
        ..Limits::default()
    });
    let big = item("a", None, Write::Put(vec![0; 900]));
    let refused = p.prepare(1, None, vec![], vec![big], 0, none);
    assert!(matches!(refused, Err(Refusal::Full { .. })), "{refused:?}");
    p.prepare(
        2,
        None,
        vec![],
        vec![item("a", None, Write::Put(vec![0; 500]))],
        0,
        none,
    )
    .unwrap();
    assert!(p.held_bytes() > 500);
    p.decide(2, false, 0);
    assert_eq!(p.held_bytes(), 0);
}

#[test]
fn overdue_and_expiry_follow_the_clock() {
    let mut p = Participant::new(Limits {
        decision_ttl_ms: 100,
        max_decisions: 2,
        ..Limits::default()
    });
    p.prepare(1, None, vec![], vec![put("a", None)], 10, none)
        .unwrap();
    assert!(p.overdue(50, 50).is_empty());
    assert_eq!(p.overdue(60, 50), vec![1]);
    p.decide(1, true, 60);
    assert!(p.expire(159).is_empty());
    assert_eq!(p.decision(1), Some(true));
    assert_eq!(p.expire(160), vec![1], "expired decisions are handed out");
    assert_eq!(p.decision(1), None);
    // Past `max_decisions` the oldest is forgotten, and handed out next.
    p.decide(2, false, 0);
    p.decide(3, false, 0);
    p.decide(4, false, 0);
    assert_eq!(p.decision(2), None);
    assert_eq!(p.decision(4), Some(false));
    assert_eq!(p.expire(1), vec![2]);
    // A settled transaction keeps its decision until it is finished.
    p.prepare(5, None, vec![], vec![put("e", None)], 0, none)
        .unwrap();
    assert!(p.settle(5, true, 0));
    assert!(p.locks().is_locked(1, b"e"), "settle keeps the locks");
    assert!(!p.expire(1_000).contains(&5));
    assert_eq!(p.decision(5), Some(true));
    assert!(matches!(p.finish(5), Apply::Writes(w) if w.len() == 1));
    assert!(!p.locks().is_locked(1, b"e"));
}

/// One step of the model test.
#[derive(Clone, Debug)]
enum Step {
    /// Transaction `txn` reads `reads` (at the versions the model had when
    /// it started) and writes `writes`, then prepares.
    Prepare {
        txn: u8,
        reads: Vec<u8>,
        writes: Vec<u8>,
    },
    Decide {
        txn: u8,
        commit: bool,
    },
    /// Another participant's primary asks about `txn`: about the
    /// participant whose prepare this model sends (`other` false), or about
    /// one that never prepared here (`other` true: its parts live elsewhere).
    Phase {
        txn: u8,
        other: bool,
    },
    /// A plain write (no transaction) to a key, allowed only when unlocked.
    Plain {
        key: u8,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (
            0..6u8,
            proptest::collection::vec(0..5u8, 0..3),
            proptest::collection::vec(0..5u8, 0..3)
        )
            .prop_map(|(txn, reads, writes)| Step::Prepare { txn, reads, writes }),
        (0..6u8, any::<bool>()).prop_map(|(txn, commit)| Step::Decide { txn, commit }),
        (0..6u8, any::<bool>()).prop_map(|(txn, other)| Step::Phase { txn, other }),
        (0..5u8).prop_map(|key| Step::Plain { key }),
    ]
}

proptest! {
    /// Against a store model (key -> version): a transaction commits only if
    /// every key it read still had the version read when it prepared and
    /// nobody wrote it between the prepare and the decision; writes apply
    /// exactly once; no key is ever locked by two transactions; the first
    /// decision of a transaction is the one every later call sees.
    #[test]
    fn commits_are_atomic_and_validated(steps in proptest::collection::vec(step(), 1..60)) {
        let mut p = Participant::new(Limits::default());
        let mut store: BTreeMap<u8, u64> = BTreeMap::new();
        let mut next_version = 1u64;
        let mut decided: BTreeMap<u8, bool> = BTreeMap::new();
        // Versions each prepared transaction read, to check nothing it read
        // changed before it committed.
        let mut read_at: BTreeMap<u8, Vec<(u8, u64)>> = BTreeMap::new();
        for (now, s) in steps.into_iter().enumerate() {
            let now = now as u64;
            match s {
                Step::Prepare { txn, reads, writes } => {
                    let mut items: Vec<Item> = Vec::new();
                    let mut keys = std::collections::BTreeSet::new();
                    for k in &reads {
                        if keys.insert(*k) {
                            let v = store.get(k).copied().unwrap_or(0);
                            let w = if writes.contains(k) { Write::Put(vec![*k]) } else { Write::None };
                            items.push(Item { table: 1, key: vec![*k], hash: *k as u64, read_version: Some(v), write: w });
                        }
                    }
                    for k in &writes {
                        if keys.insert(*k) {
                            items.push(Item { table: 1, key: vec![*k], hash: *k as u64, read_version: None, write: Write::Put(vec![*k]) });
                        }
                    }
                    let was_prepared = p.prepared(txn as u64).is_some();
                    let r = p.prepare(txn as u64, None, vec![], items.clone(), now, |i| store.get(&i.key[0]).copied().unwrap_or(0));
                    if let Some(&c) = decided.get(&txn) {
                        prop_assert_eq!(r, Err(Refusal::Decided { committed: c }));
                    } else if r.is_ok() && !was_prepared {
                        // Its one part is held: the vote counts (the server
                        // says so once every record is written).
                        p.voted(txn as u64, Anchor { table: 1, key: items[0].key.clone() });
                        read_at.insert(txn, items.iter().filter_map(|i| i.read_version.map(|v| (i.key[0], v))).collect());
                    }
                }
                Step::Decide { txn, commit } => {
                    let (outcome, apply) = p.decide(txn as u64, commit, now);
                    match decided.get(&txn) {
                        Some(&c) => {
                            prop_assert_eq!(outcome, c);
                            prop_assert_eq!(apply, Apply::Nothing);
                        }
                        None => {
                            prop_assert_eq!(outcome, commit);
                            decided.insert(txn, commit);
                            if let Apply::Writes(items) = apply {
                                // A key it read and writes is locked from the
                                // prepare (where its version was validated) to
                                // here, so it still has the version read. (A key
                                // only read may change after the prepare: the
                                // transaction takes effect at the prepare.)
                                for (k, v) in read_at.remove(&txn).unwrap_or_default() {
                                    let written_by_self = items.iter().any(|i| i.key[0] == k);
                                    if written_by_self {
                                        prop_assert_eq!(store.get(&k).copied().unwrap_or(0), v);
                                    }
                                }
                                for i in items {
                                    store.insert(i.key[0], next_version);
                                    next_version += 1;
                                }
                            } else {
                                read_at.remove(&txn);
                            }
                        }
                    }
                }
                Step::Phase { txn, other } => {
                    let asked = match (p.prepared(txn as u64), other) {
                        (Some(prep), false) => prep.voters[0].clone(),
                        // A key no model transaction writes: never a voter.
                        _ => Anchor { table: 2, key: vec![txn] },
                    };
                    let prepared = p.prepared(txn as u64).is_some();
                    let phase = p.phase(txn as u64, &asked, now);
                    if let Some(&c) = decided.get(&txn) {
                        prop_assert_eq!(phase, if c { Phase::Committed } else { Phase::Aborted });
                    } else if prepared && other {
                        // Another participant: it never voted here, and the
                        // part here is left to the primary (nothing decided).
                        prop_assert_eq!(phase, Phase::Aborted);
                        prop_assert_eq!(p.decision(txn as u64), None);
                    } else if prepared {
                        prop_assert_eq!(phase, Phase::Prepared);
                    } else {
                        prop_assert_eq!(phase, Phase::Aborted);
                        decided.insert(txn, false);
                    }
                }
                Step::Plain { key } => {
                    if !p.locks().is_locked(1, &[key]) {
                        store.insert(key, next_version);
                        next_version += 1;
                    }
                }
            }
            p.check();
        }
    }
}

#[test]
fn a_participant_is_prepared_only_for_its_own_vote() {
    // A recovery put the primary's part of transaction 4 (anchor "a") on
    // the shard that owns "b", whose own prepare was refused: asked about
    // "b", the shard must not answer for the primary's part.
    let mut p = Participant::new(Limits::default());
    p.restore(
        4,
        anchor("a"),
        true,
        vec![anchor("b")],
        vec![put("a", None)],
        0,
    )
    .unwrap();
    p.voted(4, anchor("a"));
    assert_eq!(p.phase(4, &anchor("b"), 1), Phase::Aborted);
    // Nothing is decided by the answer: the part here still follows the
    // primary, and the primary is asked about itself as prepared.
    assert_eq!(p.decision(4), None);
    assert_eq!(p.phase(4, &anchor("a"), 1), Phase::Prepared);
    // "b"'s late prepare is refused: the id is in use here for other keys.
    let late = p.prepare(4, Some(anchor("a")), vec![], vec![put("b", None)], 2, none);
    assert!(matches!(late, Err(Refusal::Bad(_))), "{late:?}");
    // A prepare is not a vote until the caller says every part is held.
    p.prepare(8, None, vec![anchor("z")], vec![put("c", None)], 3, none)
        .unwrap();
    assert_eq!(p.phase(8, &anchor("c"), 3), Phase::Aborted);
    assert_eq!(p.decision(8), None);
    p.voted(8, anchor("c"));
    assert_eq!(p.phase(8, &anchor("c"), 3), Phase::Prepared);
    p.check();
}

#[test]
fn a_commit_taken_but_not_yet_applied_answers_committed() {
    // A participant took a client's commit (`settle`) and is still applying
    // it (its part prepared, a durable wait between its parts): a primary
    // deciding the orphan must hear "committed", not "prepared", or it would
    // decide again, perhaps at another timestamp.
    let mut p = Participant::new(Limits::default());
    p.prepare(5, Some(anchor("z")), vec![], vec![put("a", None)], 0, none)
        .unwrap();
    p.voted(5, anchor("a"));
    assert_eq!(p.phase(5, &anchor("a"), 1), Phase::Prepared);
    assert!(p.settle(5, true, 1));
    assert!(p.prepared(5).is_some(), "still held until finished");
    assert_eq!(p.phase(5, &anchor("a"), 1), Phase::Committed);
    assert_eq!(p.finish(5), Apply::Writes(vec![put("a", None)]));
    assert_eq!(p.phase(5, &anchor("a"), 2), Phase::Committed);
    p.check();
}
