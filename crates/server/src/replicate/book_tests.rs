//! The bookkeeping alone, on a real engine: choice of backups, what a round
//! sends, when frees go, how a failure moves segments, frame splitting.

use std::collections::HashMap;

use insitu_engine::{Engine, EngineConfig, HashRange, RejectRules};
use insitu_protocol::{MAX_BODY_BYTES, ServerInfo, ServerState, encoded_len};
use tokio::time::Instant;

use super::*;

#[path = "book_digest_tests.rs"]
mod digests;

fn engine() -> Engine {
    Engine::new(EngineConfig {
        segment_bytes: 128 * 1024,
        memory_budget_bytes: 8 << 20,
        max_value_bytes: 4096,
    })
    .expect("engine")
}

fn servers(n: u64) -> Vec<ServerInfo> {
    (1..=n)
        .map(|id| ServerInfo {
            id,
            shard_addrs: vec![format!("s{id}")],
            backup_addr: format!("b{id}"),
            state: ServerState::Up,
        })
        .collect()
}

/// A book for server 1 (whose own backup is "b1") with `others` more servers.
fn book(r: usize, others: u64, own: &str) -> Book {
    let mut b = Book::new(r, own, insitu_testkit::rng(7));
    b.set_live(1, &servers(others + 1));
    b
}

/// An engine with one tablet (table 1) and `n` writes to `distinct` keys.
fn written(n: u32, distinct: u32) -> Engine {
    let mut e = engine();
    e.create_tablet(1, HashRange::FULL).expect("tablet");
    write_n(&mut e, n, distinct);
    e
}

fn write_n(e: &mut Engine, n: u32, distinct: u32) {
    for i in 0..n {
        let key = (i % distinct).to_le_bytes();
        e.write(1, &key, &[i as u8; 200], &RejectRules::default())
            .expect("write");
    }
}

/// Apply a plan as if every backup answered Done; returns per backup the
/// ops it got, in order.
fn ack_all(b: &mut Book, plan: &Plan) -> HashMap<String, Vec<OwnedOp>> {
    let mut got = HashMap::new();
    for batch in &plan.batches {
        b.acknowledged(batch);
        let ops: Vec<OwnedOp> = batch.frames.iter().flatten().cloned().collect();
        got.insert(batch.addr.to_string(), ops);
    }
    if plan.complete {
        b.round_complete(plan.walk);
    }
    got
}

/// The backups of a segment, sorted.
fn addrs(s: &Seg) -> Vec<&str> {
    let mut addrs: Vec<&str> = s.replicas.iter().map(|r| &*r.addr).collect();
    addrs.sort();
    addrs
}

/// Plan a round and acknowledge all of it.
fn round_all(b: &mut Book, e: &Engine, now: Instant) -> HashMap<String, Vec<OwnedOp>> {
    let plan = b.plan(e, usize::MAX, now);
    ack_all(b, &plan)
}

#[test]
fn backups_are_distinct_others_and_own_only_as_a_last_resort() {
    let mut e = engine();
    e.create_tablet(1, HashRange::FULL).expect("tablet");
    write_n(&mut e, 2000, 2000); // several segments
    let now = Instant::now();
    let mut b = book(2, 3, "b1");
    let plan = b.plan(&e, usize::MAX, now);
    assert!(plan.complete);
    let mut used = HashMap::new();
    for s in b.segs.values() {
        assert_eq!(s.replicas.len(), 2);
        assert_ne!(s.replicas[0].addr, s.replicas[1].addr);
        for r in &s.replicas {
            assert_ne!(&*r.addr, "b1", "own backup while others suffice");
            *used.entry(r.addr.to_string()).or_insert(0) += 1;
        }
    }
    assert!(used.len() >= 2, "spread over the backups: {used:?}");

    // One other server: it and this server's own backup.
    let mut b = book(2, 1, "b1");
    b.plan(&e, usize::MAX, now);
    for s in b.segs.values() {
        assert_eq!(addrs(s), ["b1", "b2"]);
    }
    // A single server keeps its replicas on its own disk.
    let mut b = book(1, 0, "b1");
    assert!(b.plan(&e, usize::MAX, now).complete);
    assert!(b.segs.values().all(|s| &*s.replicas[0].addr == "b1"));
    // No own backup and nobody else: the round cannot be complete.
    let mut b = book(1, 0, "");
    assert!(!b.plan(&e, usize::MAX, now).complete);
}

#[test]
fn fewer_backups_than_r_are_used_and_topped_up_as_servers_join() {
    let e = written(1000, 1000);
    let now = Instant::now();
    // Before the first server list nothing is chosen: an empty list means
    // "not known yet", and the own backup would crowd out the others.
    let mut b = Book::new(2, "b1", insitu_testkit::rng(7));
    assert!(!b.plan(&e, usize::MAX, now).complete);
    assert!(b.segs.values().all(|s| s.replicas.is_empty()));
    // Alone, with R = 2: the own backup is every backup there is, and it
    // suffices (a one-server cluster acknowledges writes).
    b.set_live(1, &servers(1));
    assert_eq!(b.target_replicas(), 1);
    let plan = b.plan(&e, usize::MAX, now);
    assert!(
        plan.complete,
        "one backup for R = 2 completes a round when it is all there is"
    );
    ack_all(&mut b, &plan);
    assert!(b.segs.values().all(|s| s.replicas.len() == 1));
    // A second server joins: the next round, with no new write, gives every
    // segment its second replica, sent from offset 0.
    b.set_live(1, &servers(2));
    assert_eq!(b.target_replicas(), 2);
    assert!(b.has_work(now), "a top-up is work even for an idle engine");
    let got = round_all(&mut b, &e, now);
    let to_new = &got["b2"];
    assert!(!to_new.is_empty());
    for op in to_new {
        let OwnedOp::Append { offset, .. } = op else {
            // The log's carrier gets its digest after its bytes.
            assert!(matches!(op, OwnedOp::Digest { .. }), "{op:?}");
            assert!(matches!(to_new.last(), Some(OwnedOp::Digest { .. })));
            continue;
        };
        assert_eq!(*offset, 0, "a new replica starts at the segment's start");
    }
    for s in b.segs.values() {
        assert_eq!(addrs(s), ["b1", "b2"]);
    }
}

#[test]
fn a_round_sends_only_new_bytes_and_nothing_when_idle() {
    let mut e = engine();
    e.create_tablet(1, HashRange::FULL).expect("tablet");
    write_n(&mut e, 100, 100);
    let now = Instant::now();
    let mut b = book(2, 2, "");
    let got = round_all(&mut b, &e, now);
    assert_eq!(got.len(), 2);
    let first_len: u64 = got["b2"]
        .iter()
        .map(|op| match op {
            OwnedOp::Append { bytes, .. } => bytes.len() as u64,
            OwnedOp::Free { .. } | OwnedOp::Digest { .. } => 0,
        })
        .sum();
    // The segment is now held by R backups: the next round sends only a
    // digest that lists it (the first, sent with its bytes, listed none).
    let got = round_all(&mut b, &e, now);
    for ops in got.values() {
        let [
            OwnedOp::Digest {
                seq: 2, segments, ..
            },
        ] = &ops[..]
        else {
            panic!("only a digest expected: {ops:?}");
        };
        assert_eq!(segments.len(), 1);
    }
    // Nothing changed: nothing to send.
    let plan = b.plan(&e, usize::MAX, now);
    assert!(plan.batches.is_empty() && plan.complete);
    write_n(&mut e, 10, 100);
    let got = round_all(&mut b, &e, now);
    for ops in got.values() {
        for op in ops {
            let OwnedOp::Append { offset, bytes, .. } = op else {
                panic!("no frees expected: {op:?}");
            };
            assert_eq!(*offset, first_len, "appends start where the backup is");
            assert!(!bytes.is_empty() && bytes.len() < 10 * 300);
        }
    }
}

#[test]
fn frees_wait_for_the_round_that_carried_the_survivors() {
    let mut e = written(4000, 300);
    let now = Instant::now();
    let mut b = book(1, 1, "");
    round_all(&mut b, &e, now);
    e.clean();
    let survivors = b.plan(&e, usize::MAX, now);
    let has_free = |p: &Plan| {
        p.batches
            .iter()
            .flat_map(|b| b.frames.iter().flatten())
            .any(|op| matches!(op, OwnedOp::Free { .. }))
    };
    assert!(
        !has_free(&survivors),
        "frees never ride with their survivors"
    );
    assert!(!b.frees.is_empty(), "cleaning freed segments");
    // The survivors' round failed: still no frees.
    let retry = b.plan(&e, usize::MAX, now);
    assert!(!has_free(&retry));
    // Once a round with the survivors succeeded, the frees go.
    ack_all(&mut b, &retry);
    let next = b.plan(&e, usize::MAX, now);
    assert!(has_free(&next));
    ack_all(&mut b, &next);
    assert!(b.frees.is_empty());
}

#[test]
fn a_failed_backup_loses_its_segments_to_another_and_is_owed_a_free() {
    let mut e = engine();
    e.create_tablet(1, HashRange::FULL).expect("tablet");
    write_n(&mut e, 1000, 1000);
    let now = Instant::now();
    let mut b = book(1, 2, "");
    let plan = b.plan(&e, usize::MAX, now);
    ack_all(&mut b, &plan);
    write_n(&mut e, 10, 1000);
    let plan = b.plan(&e, usize::MAX, now);
    let failed = &plan.batches[0];
    let (bad, good) = (
        failed.addr.clone(),
        if &*failed.addr == "b2" { "b3" } else { "b2" },
    );
    b.failed(failed, now);
    for other in &plan.batches[1..] {
        b.acknowledged(other);
    }
    // The next round resends every affected segment to the other backup from 0.
    let plan = b.plan(&e, usize::MAX, now);
    assert_eq!(plan.batches.len(), 1);
    assert_eq!(&*plan.batches[0].addr, good);
    let resent: Vec<u64> = plan.batches[0]
        .frames
        .iter()
        .flatten()
        .filter_map(|op| match op {
            OwnedOp::Append { offset, .. } => Some(*offset),
            OwnedOp::Free { .. } | OwnedOp::Digest { .. } => None,
        })
        .collect();
    assert!(resent.contains(&0), "resent from offset 0: {resent:?}");
    assert!(b.frees.iter().all(|f| f.addr == bad));
    let count = b.frees.len();
    assert!(count > 0, "the failed backup is owed frees of what it held");
    ack_all(&mut b, &plan);
    // The owed frees go once the new replicas are held, when the backup is retried.
    b.suspect_until.clear();
    let plan = b.plan(&e, usize::MAX, now);
    let to_bad = plan.batches.iter().find(|x| x.addr == bad).expect("frees");
    assert_eq!(to_bad.frees.len(), count);
}

#[test]
fn server_down_drops_its_replicas_and_a_round_refills_them() {
    let mut e = engine();
    e.create_tablet(1, HashRange::FULL).expect("tablet");
    write_n(&mut e, 1000, 1000);
    let now = Instant::now();
    let mut b = book(2, 3, "");
    round_all(&mut b, &e, now);
    // A round in flight to b2 when it is declared dead fails: nothing is
    // owed to it afterwards (its frees would block others forever).
    write_n(&mut e, 10, 1000);
    b.frees.push(PendingFree {
        addr: Rc::from("b2"),
        log: 9,
        segment: 1,
        after: 0,
        max_tomb: 0,
    });
    let in_flight = b.plan(&e, usize::MAX, now);
    assert!(
        in_flight
            .batches
            .iter()
            .any(|x| &*x.addr == "b2" && !x.frees.is_empty())
    );
    assert_eq!(b.server_down(2).as_deref(), Some("b2"));
    for batch in &in_flight.batches {
        b.failed(batch, now);
    }
    assert!(b.frees.iter().all(|f| &*f.addr != "b2"));
    assert!(b.dirty && b.has_work(now));
    let plan = b.plan(&e, usize::MAX, now);
    assert!(plan.batches.iter().all(|x| &*x.addr != "b2"));
    ack_all(&mut b, &plan);
    for s in b.segs.values() {
        assert_eq!(s.replicas.len(), 2);
        assert!(s.replicas.iter().all(|r| &*r.addr != "b2"));
    }
    // A stale list that still shows it up does not bring it back.
    b.set_live(1, &servers(4));
    assert!(b.live.iter().all(|x| x.id != 2));
}

#[test]
fn big_rounds_are_split_into_frames_that_fit_and_capped() {
    let mut e = Engine::new(EngineConfig {
        segment_bytes: 2 << 20,
        memory_budget_bytes: 64 << 20,
        max_value_bytes: 64 * 1024,
    })
    .expect("engine");
    e.create_tablet(1, HashRange::FULL).expect("tablet");
    for i in 0..200u32 {
        e.write(1, &i.to_le_bytes(), &[1u8; 60_000], &RejectRules::default())
            .expect("write");
    }
    let now = Instant::now();
    let mut b = book(1, 1, "");
    let plan = b.plan(&e, usize::MAX, now);
    let frames = &plan.batches[0].frames;
    assert!(frames.len() >= 3, "12 MB take several frames");
    for f in frames {
        let size = encoded_len(&request(u64::MAX, u64::MAX, f));
        assert!(size <= MAX_BODY_BYTES, "{size}");
    }
    // The byte cap leaves the rest for later rounds, which complete it.
    let mut b = book(1, 1, "");
    let mut rounds = 0;
    loop {
        let plan = b.plan(&e, 3 << 20, now);
        ack_all(&mut b, &plan);
        rounds += 1;
        if plan.complete {
            break;
        }
        assert!(rounds < 20);
    }
    assert!(rounds >= 3, "{rounds}");
    assert!(b.segs.values().all(|s| s.replicas[0].held > 0));
}

#[test]
fn a_free_waits_for_the_frees_of_segments_its_tombstones_cover() {
    let e = engine();
    let now = Instant::now();
    let mut b = book(1, 2, "");
    let free = |addr: &str, segment: u64, max_tomb: u64| PendingFree {
        addr: Rc::from(addr),
        log: 9,
        segment,
        after: 0,
        max_tomb,
    };
    // Segment 5's tombstones cover ids up to 3: segment 2's free (owed to
    // another backup) must be acknowledged first; segment 4's need not.
    b.frees = vec![free("b2", 5, 3), free("b3", 2, 0), free("b2", 4, 0)];
    let sent = |plan: &Plan| {
        let mut s: Vec<u64> = plan
            .batches
            .iter()
            .flat_map(|x| x.frees.iter().map(|f| f.segment))
            .collect();
        s.sort();
        s
    };
    let first = b.plan(&e, usize::MAX, now);
    assert_eq!(sent(&first), [2, 4]);
    // Segment 2's backup fails: segment 5 still waits.
    let to_b3 = first.batches.iter().find(|x| &*x.addr == "b3").unwrap();
    b.failed(to_b3, now);
    b.suspect_until.clear();
    let b2 = first.batches.iter().find(|x| &*x.addr == "b2").unwrap();
    b.acknowledged(b2);
    let second = b.plan(&e, usize::MAX, now);
    assert_eq!(sent(&second), [2]);
    ack_all(&mut b, &second);
    let third = b.plan(&e, usize::MAX, now);
    assert_eq!(sent(&third), [5]);
}

/// The frees a plan carries.
#[test]
fn replicas_on_the_own_backup_move_to_others_once_they_are_known() {
    let e = written(2000, 2000);
    let now = Instant::now();
    // Alone at first (R = 1): every segment is kept by the own backup.
    let mut b = Book::new(1, "b1", insitu_testkit::rng(7));
    b.set_live(1, &servers(1));
    round_all(&mut b, &e, now);
    assert!(b.segs.values().all(|s| &*s.replicas[0].addr == "b1"));
    // Others join: a recovery would not wait for this server's own disk,
    // so the next round moves every segment to one of them, from offset
    // 0, and the own backup is owed frees of them.
    b.set_live(1, &servers(3));
    assert!(b.has_work(now), "the move is work even for an idle engine");
    let got = round_all(&mut b, &e, now);
    assert!(
        !got.contains_key("b1")
            || got["b1"]
                .iter()
                .all(|op| matches!(op, OwnedOp::Free { .. }))
    );
    for s in b.segs.values() {
        assert_eq!(s.replicas.len(), 1);
        assert_ne!(&*s.replicas[0].addr, "b1");
    }
    assert_eq!(
        b.frees.iter().filter(|f| &*f.addr == "b1").count() + frees_sent(&got, "b1"),
        b.segs.len()
    );
    // With R = 2 and one other server the own backup is still needed: kept.
    let mut b = Book::new(2, "b1", insitu_testkit::rng(7));
    b.set_live(1, &servers(2));
    round_all(&mut b, &e, now);
    let replaced = b.replaced;
    round_all(&mut b, &e, now);
    assert_eq!(b.replaced, replaced, "no replica moved");
    for s in b.segs.values() {
        assert_eq!(addrs(s), ["b1", "b2"]);
    }
}

fn frees_sent(got: &HashMap<String, Vec<OwnedOp>>, addr: &str) -> usize {
    got.get(addr)
        .map(|ops| {
            ops.iter()
                .filter(|op| matches!(op, OwnedOp::Free { .. }))
                .count()
        })
        .unwrap_or(0)
}
