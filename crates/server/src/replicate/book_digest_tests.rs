//! The log digests' bookkeeping alone (split from `book_tests.rs`, whose
//! helpers it uses): frees held back by digests, the carrier's moves, the
//! closes that wait for a newer digest, and when the digests are settled.

use super::*;

fn frees_of(plan: &Plan) -> usize {
    plan.batches.iter().map(|b| b.frees.len()).sum()
}

#[test]
fn a_freed_segment_waits_for_a_held_digest_that_no_longer_lists_it() {
    let mut e = written(4000, 300);
    let now = Instant::now();
    let mut b = book(2, 2, "");
    round_all(&mut b, &e, now); // every segment held by 2 backups
    round_all(&mut b, &e, now); // the first digest lists them all
    let log = b.segs.keys().next().expect("segments").0;
    let first = b.logs[&log].listed.clone();
    assert!(first.len() > 2 && b.logs[&log].acked, "{first:?}");
    e.clean();
    // The round that carries the survivors also carries a digest without
    // the freed segments; here its digest is lost (only the appends are
    // acknowledged).
    let plan = b.plan(&e, usize::MAX, now);
    assert!(plan.complete);
    let freed: Vec<u64> = b.frees.iter().map(|f| f.segment).collect();
    assert!(!freed.is_empty(), "cleaning freed segments");
    let newer = b.logs[&log].listed.clone();
    assert!(
        freed
            .iter()
            .all(|s| first.contains(s) && !newer.contains(s))
    );
    for batch in &plan.batches {
        let no_digest = BackupBatch {
            addr: batch.addr.clone(),
            frames: Vec::new(),
            expect: batch.expect.clone(),
            frees: Vec::new(),
            digests: Vec::new(),
        };
        b.acknowledged(&no_digest);
    }
    b.round_complete(plan.walk);
    // The survivors are held, but a recovery could still find only the
    // digest listing the freed segments: no free goes, the digest does.
    let plan = b.plan(&e, usize::MAX, now);
    assert_eq!(frees_of(&plan), 0, "a free before its digest is held");
    assert!(
        plan.batches.iter().any(|x| !x.digests.is_empty()),
        "the digest is sent again"
    );
    ack_all(&mut b, &plan);
    let plan = b.plan(&e, usize::MAX, now);
    assert_eq!(frees_of(&plan), freed.len());
}

#[test]
fn a_dropped_log_is_freed_without_a_digest_and_forgotten() {
    let mut e = written(1000, 300);
    let now = Instant::now();
    let mut b = book(1, 1, "");
    round_all(&mut b, &e, now);
    round_all(&mut b, &e, now);
    assert_eq!(b.logs.len(), 1);
    assert!(e.drop_tablet(1, 0));
    let plan = b.plan(&e, usize::MAX, now);
    assert!(b.logs.is_empty(), "a log with no segment left is forgotten");
    ack_all(&mut b, &plan);
    let plan = b.plan(&e, usize::MAX, now);
    assert!(frees_of(&plan) > 0);
    ack_all(&mut b, &plan);
    assert!(b.frees.is_empty());
}

#[test]
fn a_backup_refusing_only_a_digest_loses_the_carrier_to_another() {
    let e = written(1000, 300);
    let now = Instant::now();
    let mut b = book(1, 2, "");
    round_all(&mut b, &e, now);
    // The next round carries a digest listing the durable segments, to the
    // carrier's backup, which refuses it (say its disk is full); beside it
    // go only closes of the sealed segments.
    let plan = b.plan(&e, usize::MAX, now);
    let with_digest = digest_batches(&plan);
    let [batch] = &with_digest[..] else {
        panic!("one backup gets the digest: {:?}", plan.batches);
    };
    assert!(batch.expect.iter().all(|x| x.3) && batch.digests.len() == 1);
    let (log, carrier, _) = batch.digests[0];
    let bad = batch.addr.clone();
    b.failed(batch, now);
    // The carrier goes to the other backup, from offset 0, with the digest;
    // the refusing one is owed a free of it.
    let plan = b.plan(&e, usize::MAX, now);
    let with_digest = digest_batches(&plan);
    let [batch] = &with_digest[..] else {
        panic!("one backup gets the carrier: {:?}", plan.batches);
    };
    assert_ne!(batch.addr, bad);
    assert!(batch.expect.iter().any(|x| (x.0, x.1) == (log, carrier)));
    assert_eq!(batch.digests.len(), 1);
    assert!(
        b.frees
            .iter()
            .any(|f| f.addr == bad && f.segment == carrier)
    );
    ack_all(&mut b, &plan);
    assert!(b.logs[&log].acked);
}

/// The batches of a plan that carry a digest.
fn digest_batches(plan: &Plan) -> Vec<&BackupBatch> {
    plan.batches
        .iter()
        .filter(|x| !x.digests.is_empty())
        .collect()
}

/// Every op of a plan as (backup, op).
fn ops_of(plan: &Plan) -> Vec<(String, OwnedOp)> {
    plan.batches
        .iter()
        .flat_map(|x| {
            x.frames
                .iter()
                .flatten()
                .map(|op| (x.addr.to_string(), op.clone()))
        })
        .collect()
}

#[test]
fn a_sealed_carrier_is_closed_only_after_a_newer_digest_is_held() {
    let mut e = written(10, 10);
    let now = Instant::now();
    let mut b = book(1, 2, "");
    // The first round carries the head's bytes and a digest listing none;
    // it makes the head durable, so the digests are not settled yet (a
    // write in it would wait), until the next round's digest lists it.
    let plan = b.plan(&e, usize::MAX, now);
    assert!(ops_of(&plan).iter().any(
        |(_, op)| matches!(op, OwnedOp::Digest { seq: 1, segments, .. } if segments.is_empty())
    ));
    ack_all(&mut b, &plan);
    assert!(!b.digests_settled());
    round_all(&mut b, &e, now);
    assert!(b.digests_settled());
    let log = b.segs.keys().next().expect("a segment").0;
    let mut rolls = 0;
    for _ in 0..40 {
        let head = b.logs[&log].carrier;
        write_n(&mut e, 200, 1_000_000);
        let before: HashMap<(u64, String), bool> = b
            .segs
            .iter()
            .flat_map(|(k, s)| {
                s.replicas
                    .iter()
                    .map(move |r| ((k.1, r.addr.to_string()), r.closed))
            })
            .collect();
        let (acked, carrier) = (b.logs[&log].acked, b.logs[&log].carrier);
        let plan = b.plan(&e, usize::MAX, now);
        let ops = ops_of(&plan);
        for (addr, op) in &ops {
            match op {
                OwnedOp::Digest { segment, .. } => {
                    // Never into a closed replica, nor one closed this round.
                    assert_ne!(before.get(&(*segment, addr.clone())), Some(&true));
                    assert!(!ops.iter().any(|(a, o)| a == addr && matches!(o, OwnedOp::Append { segment: s, close: true, .. } if s == segment)));
                }
                OwnedOp::Append {
                    segment,
                    close: true,
                    ..
                } => {
                    // Only once a digest on another carrier is held.
                    assert!(
                        acked && carrier != *segment,
                        "segment {segment} closed early"
                    );
                }
                _ => {}
            }
        }
        if b.logs[&log].carrier != head {
            rolls += 1;
            assert!(
                !ops.iter().any(|(_, o)| matches!(o, OwnedOp::Append { segment, close: true, .. } if *segment == head)),
                "the old carrier stays open in the round that moves the digest"
            );
        }
        ack_all(&mut b, &plan);
        // Settled: every durable segment listed, every replica keeping an
        // older digest (not the carrier's) closed.
        while !b.digests_settled() {
            round_all(&mut b, &e, now);
        }
        let d = &b.logs[&log];
        for (&(_, segment), s) in &b.segs {
            assert!(!s.durable || d.listed.contains(&segment));
            for r in &s.replicas {
                assert!(
                    segment == d.carrier || r.digest == 0 || r.closed,
                    "{segment}: {r:?}"
                );
            }
        }
    }
    assert!(rolls >= 3, "the head moved {rolls} times");
}
