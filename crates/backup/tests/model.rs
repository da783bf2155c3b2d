//! Replicas against a model, on a simulated disk that tears writes, loses
//! unsynced data at a crash, flips bits and runs out of space.
//!
//! The model holds, per replica, every byte the store accepted and how many
//! of them were durable (synced) when it said so. After any crash and
//! reopen the store must hold, per replica, a prefix of what it accepted that
//! is at least as long as the durable part — never a byte that was not sent,
//! never less than what a sync covered.

use std::path::PathBuf;

use insitu_backup::AppendMode::{Buffered, Now, Synced};
use insitu_backup::io::sim::SimIo;
use insitu_backup::{
    BackupConfig, BackupError, BackupStore, FsIo, OpenReport, ReplicaId, SyncMode, Tablet,
};
use proptest::prelude::*;

#[path = "model/harness.rs"]
mod harness;

use harness::{Op, op, run};

const CLUSTER: u64 = 0xC1;

fn tablet(id: ReplicaId) -> Tablet {
    Tablet {
        table: id.log + 100,
        start_hash: id.log << 60,
    }
}

fn config(sync: SyncMode, disk_budget_bytes: u64) -> BackupConfig {
    BackupConfig {
        dir: PathBuf::from("/backup"),
        cluster: CLUSTER,
        disk_budget_bytes,
        buffer_budget_bytes: 4096,
        // Small: appends of more than 100 bytes are cut into records.
        record_slice_bytes: 100,
        sync,
    }
}

/// A disk budget (1 MiB) the tests of single scenarios never fill.
const ROOMY: u64 = 1 << 20;

/// Open (or reopen) a store of `config(sync, budget)` on the simulated disk
/// `io`: a fresh one, or one a test crashed.
fn open_sim(sync: SyncMode, budget: u64, io: SimIo) -> (BackupStore<SimIo>, OpenReport) {
    BackupStore::open(config(sync, budget), io).expect("the store opens")
}

/// A roomy store on a fresh simulated disk whose replica `rid(1)` holds
/// "abc": where several tests start.
fn holding_abc(sync: SyncMode) -> BackupStore<SimIo> {
    let (mut store, _) = open_sim(sync, ROOMY, SimIo::default());
    store
        .append(rid(1), tablet(rid(1)), 0, b"abc", false, Synced)
        .expect("a roomy store takes the append");
    store
}

/// Open (or reopen) a roomy `SyncMode::Always` store in `dir` on the real
/// file system.
fn open_fs(dir: &tempfile::TempDir) -> (BackupStore<FsIo>, OpenReport) {
    let cfg = BackupConfig {
        dir: dir.path().join("backup"),
        ..config(SyncMode::Always, ROOMY)
    };
    BackupStore::open(cfg, FsIo::default()).expect("the store opens")
}

/// Replicas 0 and 4 are two segments of one log (a log's digest may move
/// from one carrier to another); the others each have a log of their own.
fn rid(i: u8) -> ReplicaId {
    ReplicaId {
        master: u64::from(i % 2) + 1,
        log: u64::from((i / 2) % 2),
        segment: u64::from(i),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn replicas_survive_crashes_always_sync(ops in prop::collection::vec(op(), 1..60)) {
        run(ops, SyncMode::Always);
    }

    // This model found a replica synced by a Flush missing after a second
    // crash: the first crash tore the file's creation, and the re-sent
    // segment was appended behind the garbage (the saved regression).
    #[test]
    fn replicas_survive_crashes_interval_sync(ops in prop::collection::vec(op(), 1..60)) {
        run(ops, SyncMode::Interval);
    }
}

/// Found by the model (a model bug, not the store's): a crash lost an older
/// digest's record, still buffered, while a newer digest of the log, synced
/// on another carrier, survived; the newer carrier was freed and a flush
/// followed. The flush cannot make the lost record durable, so after the next
/// crash nothing of the log may be listed.
#[test]
fn an_older_digest_a_crash_may_have_lost_is_not_durable_after_a_flush() {
    let append = |replica, len, way| Op::Append {
        replica,
        len,
        close: false,
        fill: 0,
        way,
    };
    run(
        vec![
            append(4, 101, 2),
            append(0, 0, 0),
            Op::Digest { replica: 4 },
            Op::Digest { replica: 0 },
            Op::Resend {
                replica: 0,
                back: 0,
            },
            Op::Crash {
                seed: 14481920925154927741,
            },
            Op::Free { replica: 0 },
            Op::Flush,
            Op::Crash { seed: 0 },
        ],
        SyncMode::Always,
    );
}

#[test]
fn a_replica_of_another_cluster_refuses_to_open() {
    let io = holding_abc(SyncMode::Always).into_io();
    let mut other = config(SyncMode::Always, ROOMY);
    other.cluster = CLUSTER + 1;
    match BackupStore::open(other, io) {
        Err(e @ BackupError::OtherCluster { .. }) => {
            assert!(e.to_string().contains("another --dir"), "{e}")
        }
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("opened another cluster's replicas"),
    }
}

#[test]
fn a_flipped_bit_on_disk_is_reported_by_read_and_cut_at_reopen() {
    let (mut store, _) = open_sim(SyncMode::Always, ROOMY, SimIo::default());
    store
        .append(rid(1), tablet(rid(1)), 0, &[7u8; 100], false, Synced)
        .unwrap();
    store
        .append(rid(1), tablet(rid(1)), 100, &[8u8; 100], true, Synced)
        .unwrap();
    let path = store.io_mut().paths()[0].clone();
    // A bit in the second record's payload.
    let len = store.io_mut().len(&path).unwrap();
    store.io_mut().corrupt(&path, len - 24 - 10);
    match store.read(rid(1)) {
        Err(BackupError::Corrupt { why, .. }) => assert!(why.contains("checksum"), "{why}"),
        other => panic!("corruption not reported: {other:?}"),
    }
    let (mut store, report) = open_sim(SyncMode::Always, ROOMY, store.into_io());
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(report.problems[0].contains("cut"), "{:?}", report.problems);
    let (data, closed) = store.read(rid(1)).unwrap();
    assert_eq!(data, vec![7u8; 100]);
    assert!(!closed);
}

#[test]
fn real_files_round_trip_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = open_fs(&dir);
    store
        .append(rid(2), tablet(rid(2)), 0, b"hello ", false, Synced)
        .unwrap();
    store
        .append(rid(2), tablet(rid(2)), 6, b"world", true, Synced)
        .unwrap();
    // Written at once in records of 100 bytes (vectored writes), a new
    // replica's header first.
    let long: Vec<u8> = (0..1234u32).map(|i| (i % 199) as u8).collect();
    store
        .append(rid(3), tablet(rid(3)), 0, &long[..1000], false, Now)
        .unwrap();
    store
        .append(rid(3), tablet(rid(3)), 1000, &long[1000..], true, Now)
        .unwrap();
    store.flush().unwrap();
    drop(store);
    let (mut store, report) = open_fs(&dir);
    assert_eq!(report.replicas, 2);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(store.read(rid(2)).unwrap(), (b"hello world".to_vec(), true));
    assert_eq!(store.read(rid(3)).unwrap(), (long, true));
    store.free(rid(2));
    store.free(rid(3));
    assert!(store.list(None).is_empty());
}

#[test]
fn a_full_disk_budget_refuses_the_append_and_keeps_the_rest() {
    let (mut store, _) = open_sim(SyncMode::Always, 200, SimIo::default());
    store
        .append(rid(1), tablet(rid(1)), 0, &[1u8; 50], false, Synced)
        .unwrap();
    match store.append(rid(1), tablet(rid(1)), 50, &[1u8; 200], false, Synced) {
        Err(e @ BackupError::DiskFull { .. }) => assert!(e.to_string().contains("budget full")),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.read(rid(1)).unwrap().0, vec![1u8; 50]);
}

#[test]
fn fences_survive_a_reopen_and_forget_removes_them() {
    let mut store = holding_abc(SyncMode::Always);
    store.fence(rid(1).master).unwrap();
    assert!(store.is_fenced(rid(1).master));
    let mut io = store.into_io();
    // Nothing unsynced may be needed for the fence to hold.
    io.crash(|_| 0);
    let (mut store, report) = open_sim(SyncMode::Always, ROOMY, io);
    assert_eq!(report.fenced, 1);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(store.is_fenced(rid(1).master));
    assert!(!store.is_fenced(rid(2).master));
    store.forget_master(rid(1).master).unwrap();
    assert!(store.list(Some(rid(1).master)).is_empty());
    let (store, report) = open_sim(SyncMode::Always, ROOMY, store.into_io());
    assert_eq!((report.fenced, report.replicas), (0, 0));
    assert!(!store.is_fenced(rid(1).master));
}

#[test]
fn an_append_naming_another_tablet_is_refused() {
    let mut store = holding_abc(SyncMode::Interval);
    let other = Tablet {
        table: 999,
        start_hash: 0,
    };
    match store.append(rid(1), other, 3, b"def", false, Synced) {
        Err(e @ BackupError::WrongTablet { .. }) => assert!(e.to_string().contains("999")),
        r => panic!("{r:?}"),
    }
}

#[test]
fn a_flush_of_many_real_files_syncs_them_all_and_they_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = open_fs(&dir);
    for i in 0..5u8 {
        let id = rid(i);
        store
            .append(id, tablet(id), 0, &[i; 10], false, Buffered)
            .unwrap();
    }
    assert!(store.needs_flush());
    assert!(store.flush_each().is_empty());
    assert!(!store.needs_flush());
    drop(store);
    let (mut store, report) = open_fs(&dir);
    assert_eq!(report.replicas, 5);
    for i in 0..5u8 {
        assert_eq!(store.read(rid(i)).unwrap().0, vec![i; 10]);
    }
}

#[test]
fn a_replica_recreated_over_a_torn_file_survives_the_next_crash() {
    let open = |io| open_sim(SyncMode::Interval, ROOMY, io);
    let (mut store, _) = open(SimIo::default());
    store
        .append(rid(3), tablet(rid(3)), 0, &[5u8; 300], false, Synced)
        .unwrap();
    store.write_pending();
    let mut io = store.into_io();
    // The crash keeps the file but only 10 bytes of it: a torn header.
    io.crash(|n| if n == 2 { 1 } else { 10.min(n - 1) });
    let (mut store, report) = open(io);
    assert_eq!(report.replicas, 0, "{:?}", report.problems);
    // The master re-sends the segment from 0; a flush makes it durable.
    store
        .append(rid(3), tablet(rid(3)), 0, &[6u8; 1], false, Synced)
        .unwrap();
    store.flush().unwrap();
    let mut io = store.into_io();
    io.crash(|_| 0);
    let (mut store, report) = open(io);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(store.read(rid(3)).unwrap(), (vec![6u8; 1], false));
}

#[test]
fn a_log_lists_its_newest_digest_across_carriers_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let digest = |seq: u64, segments: &[u64]| insitu_backup::Digest {
        seq,
        segments: segments.to_vec(),
    };
    let (mut store, _) = open_fs(&dir);
    let (a, b) = (rid(0), rid(4)); // two segments of one log
    assert!(matches!(
        store.digest(a, digest(1, &[0])),
        Err(BackupError::Unknown(_))
    ));
    store
        .append(a, tablet(a), 0, b"head", true, Synced)
        .unwrap();
    store.digest(a, digest(1, &[0])).unwrap();
    store
        .append(b, tablet(b), 0, b"next", false, Synced)
        .unwrap();
    store.digest(b, digest(2, &[0, 4])).unwrap();
    // A resend of an older digest changes nothing.
    store.digest(a, digest(1, &[0])).unwrap();
    assert!(matches!(
        store.digest(b, digest(3, &[4, 0])),
        Err(BackupError::Malformed(_))
    ));
    let too_many: Vec<u64> =
        (0..=insitu_backup::replica_file::MAX_DIGEST_SEGMENTS as u64).collect();
    assert!(matches!(
        store.digest(b, digest(3, &too_many)),
        Err(BackupError::TooLarge { .. })
    ));
    assert_eq!(store.digests(1), vec![(b, digest(2, &[0, 4]))]);
    store.flush().unwrap();
    drop(store);
    let (mut store, report) = open_fs(&dir);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(store.digests(1), vec![(b, digest(2, &[0, 4]))]);
    // Digest records add no segment bytes.
    assert_eq!(store.read(a).unwrap(), (b"head".to_vec(), true));
    assert_eq!(store.read(b).unwrap(), (b"next".to_vec(), false));
    store.free(b);
    assert_eq!(store.digests(1), vec![]);
}
