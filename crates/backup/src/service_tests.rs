//! The backup service's request handling on a simulated disk.

use std::path::PathBuf;

use insitu_protocol::{BackupOp, Request, Status, blob};

use super::{BackupService, MAX_READ_BYTES, Outcome};
use crate::io::sim::SimIo;
use crate::store::{BackupConfig, BackupStore, SyncMode};

const CLUSTER: u64 = 0;

fn config(sync: SyncMode, disk_budget_bytes: u64) -> BackupConfig {
    BackupConfig {
        dir: PathBuf::from("/replicas"),
        cluster: CLUSTER,
        disk_budget_bytes,
        buffer_budget_bytes: 1 << 20,
        record_slice_bytes: crate::RECORD_SLICE_BYTES,
        sync,
    }
}

fn service(sync: SyncMode, budget: u64) -> BackupService<SimIo> {
    let (store, _) = BackupStore::open(config(sync, budget), SimIo::default()).unwrap();
    BackupService::new(store)
}

/// Lose power (keep only what was synced) and open the store again.
fn power_loss(svc: BackupService<SimIo>, sync: SyncMode) -> BackupService<SimIo> {
    let mut io = svc.into_store().into_io();
    io.crash(|_| 0);
    let (store, _) = BackupStore::open(config(sync, 1 << 30), io).unwrap();
    BackupService::new(store)
}

fn append<'a>(log: u64, segment: u64, offset: u64, bytes: &'a [u8]) -> BackupOp<'a> {
    BackupOp::Append {
        log,
        table: 7,
        start_hash: log << 56,
        segment,
        offset,
        bytes: blob(bytes),
        close: false,
    }
}

fn write<'a>(master: u64, ops: Vec<BackupOp<'a>>) -> Request<'a> {
    Request::BackupWrite {
        cluster: CLUSTER,
        master,
        ops,
    }
}

fn list(master: u64, fence: bool) -> Request<'static> {
    Request::BackupList {
        cluster: CLUSTER,
        master,
        fence,
    }
}

fn read(master: u64, log: u64, segment: u64, offset: u64, max_bytes: u32) -> Request<'static> {
    Request::BackupRead {
        cluster: CLUSTER,
        master,
        log,
        segment,
        offset,
        max_bytes,
    }
}

fn one(svc: &mut BackupService<SimIo>, r: Request<'_>) -> Outcome {
    svc.handle_group(&[r]).remove(0)
}

fn refused(o: &Outcome) -> (Status, &str) {
    match o {
        Outcome::Refused { status, message } => (*status, message.as_str()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn bytes_of(o: Outcome) -> (Vec<u8>, bool) {
    match o {
        Outcome::Bytes { bytes, end } => (bytes, end),
        other => panic!("expected bytes, got {other:?}"),
    }
}

#[test]
fn a_group_is_made_durable_by_one_flush_before_it_is_answered() {
    let mut svc = service(SyncMode::Always, 1 << 30);
    // Two masters, several appends each, two of them to the same segment.
    let group = [
        write(1, vec![append(1, 1, 0, b"aaa"), append(1, 1, 3, b"bbb")]),
        write(2, vec![append(5, 1, 0, b"ccc")]),
        write(1, vec![append(1, 1, 6, b"ddd")]),
    ];
    let outcomes = svc.handle_group(&group);
    assert_eq!(outcomes, vec![Outcome::Done; 3]);
    // One fsync per file touched (two files), not one per op (four) — and
    // they all happened before the answers were returned.
    assert_eq!(svc.store_mut().io_mut().syncs, 2);
    let mut svc = power_loss(svc, SyncMode::Always);
    assert_eq!(
        bytes_of(one(&mut svc, read(1, 1, 1, 0, 100))).0,
        b"aaabbbddd"
    );
    assert_eq!(bytes_of(one(&mut svc, read(2, 5, 1, 0, 100))).0, b"ccc");
}

#[test]
fn interval_mode_answers_from_memory_and_the_timer_flush_makes_it_durable() {
    let mut svc = service(SyncMode::Interval, 1 << 30);
    assert_eq!(
        one(&mut svc, write(1, vec![append(1, 1, 0, b"abc")])),
        Outcome::Done
    );
    assert_eq!(
        svc.store_mut().io_mut().syncs,
        0,
        "answered before any fsync"
    );
    assert!(svc.flush().is_empty());
    assert_eq!(svc.store_mut().io_mut().syncs, 1);
    let mut svc = power_loss(svc, SyncMode::Interval);
    assert_eq!(bytes_of(one(&mut svc, read(1, 1, 1, 0, 100))).0, b"abc");
}

#[test]
fn a_fenced_master_is_refused_also_after_a_restart() {
    let mut svc = service(SyncMode::Always, 1 << 30);
    assert_eq!(
        one(&mut svc, write(3, vec![append(1, 1, 0, b"abc")])),
        Outcome::Done
    );
    match one(&mut svc, list(3, true)) {
        Outcome::Replicas(r, _) => {
            assert_eq!(r.len(), 1);
            assert_eq!((r[0].log, r[0].table, r[0].start_hash), (1, 7, 1 << 56));
            assert_eq!((r[0].segment, r[0].bytes, r[0].closed), (1, 3, false));
        }
        other => panic!("{other:?}"),
    }
    let w = one(&mut svc, write(3, vec![append(1, 1, 3, b"def")]));
    assert_eq!(refused(&w).0, Status::Fenced);
    // Another master is not affected.
    assert_eq!(
        one(&mut svc, write(4, vec![append(1, 1, 0, b"x")])),
        Outcome::Done
    );
    let mut svc = power_loss(svc, SyncMode::Always);
    let w = one(&mut svc, write(3, vec![append(1, 1, 3, b"def")]));
    assert_eq!(refused(&w).0, Status::Fenced, "the fence was not durable");
    // A list without fence does not fence.
    let _ = one(&mut svc, list(4, false));
    assert_eq!(
        one(&mut svc, write(4, vec![append(1, 1, 1, b"y")])),
        Outcome::Done
    );
}

#[test]
fn forget_deletes_a_masters_replicas_and_keeps_the_others() {
    let mut svc = service(SyncMode::Always, 1 << 30);
    let group = [
        write(1, vec![append(1, 1, 0, b"a"), append(1, 2, 0, b"b")]),
        write(2, vec![append(1, 1, 0, b"c")]),
    ];
    assert_eq!(svc.handle_group(&group), vec![Outcome::Done; 2]);
    let _ = one(&mut svc, list(1, true));
    let forget = Request::BackupForget {
        cluster: CLUSTER,
        master: 1,
    };
    assert_eq!(one(&mut svc, forget), Outcome::Done);
    assert_eq!(
        one(&mut svc, list(1, false)),
        Outcome::Replicas(vec![], vec![])
    );
    assert_eq!(
        svc.store_mut().io_mut().paths().len(),
        1,
        "files left behind"
    );
    assert_eq!(bytes_of(one(&mut svc, read(2, 1, 1, 0, 10))).0, b"c");
}

#[test]
fn frees_drop_one_segment_or_a_whole_log() {
    let mut svc = service(SyncMode::Always, 1 << 30);
    let ops = vec![
        append(1, 1, 0, b"a"),
        append(1, 2, 0, b"b"),
        append(2, 1, 0, b"c"),
    ];
    assert_eq!(one(&mut svc, write(1, ops)), Outcome::Done);
    let frees = vec![
        BackupOp::Free { log: 1, segment: 1 },
        BackupOp::FreeLog { log: 2 },
    ];
    assert_eq!(one(&mut svc, write(1, frees)), Outcome::Done);
    match one(&mut svc, list(1, false)) {
        Outcome::Replicas(r, _) => assert_eq!(
            r.iter().map(|r| (r.log, r.segment)).collect::<Vec<_>>(),
            [(1, 2)]
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_full_disk_budget_answers_no_space() {
    let mut svc = service(SyncMode::Always, 300);
    let big = vec![1u8; 400];
    let w = one(&mut svc, write(1, vec![append(1, 1, 0, &big)]));
    let (status, message) = refused(&w);
    assert_eq!(status, Status::NoSpace);
    assert!(message.contains("budget full"), "{message}");
    assert!(message.contains("another backup"), "{message}");
}

#[test]
fn a_full_disk_answers_no_space_and_only_the_requests_that_touched_it() {
    let mut svc = service(SyncMode::Always, 1 << 30);
    let group = [
        write(1, vec![append(1, 1, 0, &[1u8; 100])]),
        write(2, vec![append(1, 1, 0, &[2u8; 100])]),
    ];
    // Room for the first file only: the second's write fails at the flush.
    svc.store_mut().io_mut().free_bytes = Some(250);
    let outcomes = svc.handle_group(&group);
    assert_eq!(outcomes[0], Outcome::Done);
    assert_eq!(refused(&outcomes[1]).0, Status::NoSpace);
}

#[test]
fn another_clusters_request_is_refused() {
    let mut svc = service(SyncMode::Always, 1 << 30);
    let bytes = [1u8];
    let requests = [
        Request::BackupWrite {
            cluster: 9,
            master: 1,
            ops: vec![append(1, 1, 0, &bytes)],
        },
        Request::BackupList {
            cluster: 9,
            master: 1,
            fence: true,
        },
        Request::BackupForget {
            cluster: 9,
            master: 1,
        },
    ];
    for o in svc.handle_group(&requests) {
        let (status, message) = refused(&o);
        assert_eq!(status, Status::BadRequest);
        assert!(message.contains("cluster 0x9"), "{message}");
    }
    assert!(!svc.store().is_fenced(1), "a foreign list fenced a master");
    assert!(svc.store().list(None).is_empty());
}

#[test]
fn a_corrupt_replica_is_refused_naming_it_and_a_good_copy_still_reads() {
    // The same segment on two backups; one of them gets a flipped bit.
    let mut good = service(SyncMode::Always, 1 << 30);
    let mut bad = service(SyncMode::Always, 1 << 30);
    let data = vec![5u8; 1000];
    for svc in [&mut good, &mut bad] {
        assert_eq!(
            one(svc, write(1, vec![append(3, 4, 0, &data)])),
            Outcome::Done
        );
    }
    let path = bad.store_mut().io_mut().paths()[0].clone();
    bad.store_mut().io_mut().corrupt(&path, 500);
    let o = one(&mut bad, read(1, 3, 4, 0, 4096));
    let (status, message) = refused(&o);
    assert_eq!(status, Status::Internal);
    assert!(message.contains("corrupt"), "{message}");
    assert!(
        message.contains("segment: 4"),
        "names the replica: {message}"
    );
    assert!(message.contains("another backup"), "{message}");
    assert_eq!(bytes_of(one(&mut good, read(1, 3, 4, 0, 4096))).0, data);
}

#[test]
fn reads_come_in_chunks_of_at_most_max_read_bytes() {
    let mut svc = service(SyncMode::Always, 1 << 30);
    let data: Vec<u8> = (0..(MAX_READ_BYTES as usize + 10))
        .map(|i| i as u8)
        .collect();
    assert_eq!(
        one(&mut svc, write(1, vec![append(1, 1, 0, &data)])),
        Outcome::Done
    );
    let (first, end) = bytes_of(one(&mut svc, read(1, 1, 1, 0, u32::MAX)));
    assert_eq!((first.len(), end), (MAX_READ_BYTES as usize, false));
    let (rest, end) = bytes_of(one(&mut svc, read(1, 1, 1, first.len() as u64, u32::MAX)));
    assert!(end);
    assert_eq!([first, rest].concat(), data);
    let past = one(&mut svc, read(1, 1, 1, data.len() as u64 + 1, 10));
    assert_eq!(refused(&past).0, Status::BadRequest);
    let unknown = one(&mut svc, read(1, 1, 99, 0, 10));
    assert_eq!(refused(&unknown).0, Status::BadRequest);
}

#[test]
fn gaps_and_other_requests_are_bad_requests_with_the_reason() {
    let mut svc = service(SyncMode::Always, 1 << 30);
    let w = one(&mut svc, write(1, vec![append(1, 1, 5, b"abc")]));
    let (status, message) = refused(&w);
    assert_eq!(status, Status::BadRequest);
    assert!(message.contains("only 0 bytes are held"), "{message}");
    assert_eq!(one(&mut svc, Request::Ping), Outcome::Pong);
    let o = one(&mut svc, Request::ListTables);
    assert_eq!(refused(&o).0, Status::BadRequest);
}
