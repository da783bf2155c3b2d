//! `recover_server` against fake shards: round-robin with fallback to
//! another shard, the committed owner and its activation, `Retry` while
//! tablets are lost, persistence of `lost_from` across a restart, and
//! idempotence. Also the re-home of orphaned tablets at an enlistment
//! (`membership.rs`), which takes them empty and marked lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use insitu_protocol::{Request, Response, Status, decode_request, encode_error, encode_response};

use super::*;
use crate::model::{NEXT_SERVER_ID, NEXT_TABLE_ID, ORPHANED};
use crate::service::usable_map;
use crate::store::Store;

/// A fake shard: records what it gets ("Recover t{table} s{start} m{master}",
/// "Activate ...", "Drop ..."), answers `Recovered{objects: 10, ..}` unless
/// told to refuse recoveries.
struct Fake {
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
    refuse_recover: Arc<AtomicBool>,
    /// The version floor of every `MarkLost` it got, in order.
    floors: Arc<Mutex<Vec<u64>>>,
    /// Refuse `TakeTablet` (a shard that cannot take the tablet).
    refuse_take: Arc<AtomicBool>,
}

/// A fake's answer: `response`, or `status` while the test sets `refuse`.
fn unless_refused(
    refuse: &AtomicBool,
    status: Status,
    response: Response<'static>,
) -> Result<Response<'static>, Status> {
    if refuse.load(Ordering::SeqCst) {
        Err(status)
    } else {
        Ok(response)
    }
}

async fn fake_shard() -> Fake {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let refuse_recover = Arc::new(AtomicBool::new(false));
    let floors: Arc<Mutex<Vec<u64>>> = Arc::default();
    let refuse_take = Arc::new(AtomicBool::new(false));
    let (log2, refuse, floors2) = (log.clone(), refuse_recover.clone(), floors.clone());
    let refuse_take2 = refuse_take.clone();
    let addr = insitu_testkit::peer::serve(move |id, body, out| {
        // What to log of the request, and the answer: a response, or the
        // status of an injected refusal.
        let (line, answer) = match decode_request(body).unwrap() {
            Request::RecoverTablet {
                table,
                start_hash,
                master,
                ..
            } => {
                let recovered = Response::Recovered {
                    objects: 10,
                    segments: 2,
                    bytes: 1000,
                };
                let answer = unless_refused(&refuse, Status::Internal, recovered);
                (format!("Recover t{table} s{start_hash} m{master}"), answer)
            }
            Request::ActivateTablet {
                table,
                start_hash,
                map_version,
                writes,
            } => {
                // Reads only: the first of a recovered tablet's two activations.
                let reads = if writes { "" } else { " reads" };
                let line = format!("Activate t{table} s{start_hash} v{map_version}{reads}");
                (line, Ok(Response::Done))
            }
            Request::MarkLost {
                table,
                start_hash,
                lost_from,
                version_floor,
            } => {
                floors2.lock().unwrap().push(version_floor);
                let line = format!("Mark t{table} s{start_hash} f{lost_from}");
                (line, Ok(Response::Done))
            }
            Request::DropTablet {
                table, start_hash, ..
            } => (format!("Drop t{table} s{start_hash}"), Ok(Response::Done)),
            Request::TakeTablet {
                table,
                start_hash,
                state,
                ..
            } => {
                let answer = unless_refused(&refuse_take2, Status::OutOfMemory, Response::Done);
                (format!("Take t{table} s{start_hash} {state:?}"), answer)
            }
            _ => return encode_error(out, id, Status::BadRequest, "unexpected"),
        };
        log2.lock().unwrap().push(line);
        match answer {
            Ok(response) => encode_response(out, id, Status::Ok, &response).unwrap(),
            Err(status) => encode_error(out, id, status, "injected"),
        }
    })
    .await
    .unwrap();
    Fake {
        addr,
        log,
        refuse_recover,
        floors,
        refuse_take,
    }
}

use crate::test_dir::TestDir as Dir;

fn open(dir: &Dir) -> Coordinator {
    open_with(dir, 2)
}

/// A coordinator on `dir` with R = `replicas`.
fn open_with(dir: &Dir, replicas: u32) -> Coordinator {
    let (store, model, opened) = Store::open(&dir.0, replicas).unwrap();
    Coordinator::new(
        store,
        model,
        0,
        insitu_auth::Credentials::none(),
        opened.timestamp_reservation,
    )
}

const TABLE: u64 = 1;
/// Hash-space starts of the table's four tablets.
const STARTS: [u64; 4] = [0, 1 << 62, 2 << 62, 3 << 62];

/// Server 1 (the one that dies) owns tablets 0 and 2, servers 2 and 3 (one
/// fake shard each) own 1 and 3.
async fn setup(coord: &Coordinator, a: &Fake, b: &Fake) {
    let guard = coord.meta_lock.lock().await;
    let server = |id: u64, addrs: Vec<String>| Op::PutServer {
        id,
        shard_addrs: addrs,
        identity: String::new(),
        backup_addr: String::new(),
    };
    let owners = [(1, 0), (2, 0), (1, 1), (3, 0)];
    let mut ops = vec![
        server(1, vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()]),
        server(2, vec![a.addr.clone()]),
        server(3, vec![b.addr.clone()]),
        Op::Counter(NEXT_SERVER_ID, 4),
        Op::PutTable {
            id: TABLE,
            name: "t".into(),
            schema: None,
        },
        Op::Counter(NEXT_TABLE_ID, 2),
        Op::Counter(MAP_VERSION, 1),
    ];
    for (i, (server_id, shard)) in owners.into_iter().enumerate() {
        ops.push(Op::PutTablet {
            table: TABLE,
            index: i as u32,
            tablet: Tablet {
                start_hash: STARTS[i],
                end_hash: STARTS.get(i + 1).map_or(u64::MAX, |s| s - 1),
                server_id,
                shard,
                map_version: 1,
            },
        });
    }
    coord.commit(&guard, ops).await.unwrap();
}

fn tablet(coord: &Coordinator, index: usize) -> Tablet {
    coord.model().tables[&TABLE].tablets[index].clone()
}

/// Table `TABLE` ("t") with two tablets, orphaned under map version 3.
fn table_with_two_orphaned_tablets() -> Vec<Op> {
    let table = [
        Op::PutTable {
            id: TABLE,
            name: "t".into(),
            schema: None,
        },
        Op::Counter(NEXT_TABLE_ID, 2),
        Op::Counter(MAP_VERSION, 3),
    ];
    let tablets = (0..2usize).map(|i| Op::PutTablet {
        table: TABLE,
        index: i as u32,
        tablet: Tablet {
            start_hash: STARTS[2 * i],
            end_hash: if i == 0 { STARTS[2] - 1 } else { u64::MAX },
            server_id: ORPHANED,
            shard: 0,
            map_version: 3,
        },
    });
    table.into_iter().chain(tablets).collect()
}

fn take(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[tokio::test]
async fn recovers_round_robin_falls_back_to_another_shard_and_is_idempotent() {
    let dir = Dir::new("recovery");
    let (a, b) = (fake_shard().await, fake_shard().await);
    let coord = open(&dir);
    setup(&coord, &a, &b).await;
    b.refuse_recover.store(true, Ordering::SeqCst);

    let summary = recover_server(&coord, 1).await.unwrap();
    assert_eq!(summary.tablets, 2);
    assert_eq!(
        (summary.objects, summary.segments, summary.bytes),
        (20, 4, 2000)
    );
    // Tablet 0 went to server 2 (first slot); tablet 2's turn was server 3,
    // which refused, so it went to server 2 as well.
    for index in [0, 2] {
        let t = tablet(&coord, index);
        assert_eq!((t.server_id, t.shard), (2, 0), "tablet {index}");
        assert!(t.map_version > 1);
    }
    assert_eq!(
        take(&b.log),
        vec![
            format!("Recover t1 s{} m1", STARTS[2]),
            format!("Drop t1 s{}", STARTS[2])
        ]
    );
    let (v0, v2) = (tablet(&coord, 0).map_version, tablet(&coord, 2).map_version);
    // Both queues ran in parallel: compare as sets, each tablet's own steps
    // in order.
    let a_log = take(&a.log);
    let position = |line: &str| a_log.iter().position(|l| l == line);
    assert!(
        position(&format!("Recover t1 s{} m1", STARTS[2]))
            < position(&format!("Activate t1 s{} v{v2}", STARTS[2]))
    );
    let mut sorted = a_log.clone();
    sorted.sort();
    let mut expected = vec![
        format!("Recover t1 s{} m1", STARTS[0]),
        format!("Activate t1 s{} v{v0} reads", STARTS[0]),
        format!("Activate t1 s{} v{v0}", STARTS[0]),
        format!("Recover t1 s{} m1", STARTS[2]),
        format!("Activate t1 s{} v{v2} reads", STARTS[2]),
        format!("Activate t1 s{} v{v2}", STARTS[2]),
    ];
    expected.sort();
    assert_eq!(sorted, expected);
    {
        let model = coord.model();
        assert!(model.lost_from.is_empty());
        assert!(
            model.data_lost.is_empty(),
            "replicas held them: nothing lost"
        );
        assert!(
            !model.servers.contains_key(&1),
            "the dead server is forgotten"
        );
        assert!(
            usable_map(&model, TABLE, &coord.recovery_notes())
                .unwrap()
                .is_ok()
        );
        assert_eq!(model.validate(), Ok(()));
    }
    // Again: nothing to do, nothing sent.
    assert_eq!(
        recover_server(&coord, 1).await.unwrap(),
        RecoverySummary::default()
    );
    assert!(take(&a.log).is_empty() && take(&b.log).is_empty());
    coord.close().await;
}

/// A coordinator on `setup`'s metadata whose two live shards refuse every
/// recovery.
async fn refusing_setup() -> (Dir, Fake, Fake, Coordinator) {
    let dir = Dir::new("recovery");
    let (a, b) = (fake_shard().await, fake_shard().await);
    let coord = open(&dir);
    setup(&coord, &a, &b).await;
    a.refuse_recover.store(true, Ordering::SeqCst);
    b.refuse_recover.store(true, Ordering::SeqCst);
    (dir, a, b, coord)
}

#[tokio::test]
async fn lost_tablets_answer_retry_until_recovered_even_across_a_restart() {
    let (dir, a, b, coord) = refusing_setup().await;

    let e = recover_server(&coord, 1).await.unwrap_err().to_string();
    assert!(e.contains("2 tablets left"), "{e}");
    assert!(tablet(&coord, 0).is_orphaned() && tablet(&coord, 2).is_orphaned());
    {
        let model = coord.model();
        assert_eq!(model.lost_from.len(), 2);
        let reject = usable_map(&model, TABLE, &coord.recovery_notes())
            .unwrap()
            .unwrap_err();
        assert_eq!(reject.status, Status::Retry);
        // Why it is still waiting: the shards' refusals of the last attempt.
        assert!(
            reject.message.contains("being recovered")
                && reject.message.contains("the last attempt failed")
                && reject.message.contains("injected"),
            "{}",
            reject.message
        );
        assert!(
            model.orphaned_tablets().is_empty(),
            "never re-created empty by an enlistment"
        );
        assert!(model.servers.contains_key(&1), "kept until recovered");
    }
    coord.close().await;
    drop(coord);

    // A new coordinator on the same metadata finds them still lost.
    let coord = open(&dir);
    assert_eq!(coord.masters_being_recovered(), vec![1]);
    a.refuse_recover.store(false, Ordering::SeqCst);
    b.refuse_recover.store(false, Ordering::SeqCst);
    let summary = recover_server(&coord, 1).await.unwrap();
    assert_eq!(summary.tablets, 2);
    let owners: Vec<u64> = [0, 2].map(|i| tablet(&coord, i).server_id).to_vec();
    assert_eq!(owners, vec![2, 3], "round-robin over the live servers");
    assert!(coord.masters_being_recovered().is_empty());
    assert!(!coord.model().servers.contains_key(&1));
    coord.close().await;
}

#[tokio::test]
async fn with_no_replicas_recovered_tablets_stay_marked_lost_until_acknowledged() {
    let dir = Dir::new("recovery");
    let (a, b) = (fake_shard().await, fake_shard().await);
    let coord = open_with(&dir, 0);
    setup(&coord, &a, &b).await;

    recover_server(&coord, 1).await.unwrap();
    // Each re-created tablet is marked lost (from server 1) before it is
    // activated, with a version floor; floors only rise.
    let mut marked = Vec::new();
    for fake in [&a, &b] {
        let log = take(&fake.log);
        for (i, line) in log.iter().enumerate() {
            if let Some(rest) = line.strip_prefix("Mark ") {
                let activate = format!("Activate {}", rest.trim_end_matches(" f1"));
                assert!(line.ends_with(" f1"), "{line}");
                assert!(
                    log[i + 1..].iter().any(|l| l.starts_with(&activate)),
                    "marked before activated: {log:?}"
                );
                marked.push(rest.to_string());
            }
        }
    }
    marked.sort();
    assert_eq!(
        marked,
        vec![
            format!("t1 s{} f1", STARTS[0]),
            format!("t1 s{} f1", STARTS[2])
        ]
    );
    let mut floors: Vec<u64> = [&a, &b]
        .iter()
        .flat_map(|f| f.floors.lock().unwrap().clone())
        .collect();
    floors.sort_unstable();
    assert_eq!(floors.len(), 2);
    assert!(floors[0] > 1 << 50 && floors[1] > floors[0], "{floors:?}");
    {
        let model = coord.model();
        assert_eq!(model.lost_version_floor, floors[1]);
        let info = model.table_info(TABLE).unwrap();
        let lost: Vec<u64> = info.tablets.iter().map(|t| t.lost_from).collect();
        assert_eq!(lost, vec![1, 0, 1, 0]);
    }
    // Not movable before the loss is acknowledged.
    let e = coord.move_tablet("t".into(), 0, 3).await.unwrap_err();
    assert_eq!(e.status, Status::BadRequest);
    assert!(e.message.contains("ack-loss t"), "{}", e.message);
    coord.close().await;
    drop(coord);

    // Durable: a new coordinator still has the marks and the floor.
    let coord = open_with(&dir, 0);
    assert_eq!(coord.model().data_lost.len(), 2);
    assert_eq!(coord.model().lost_version_floor, floors[1]);
    let reply = coord.ack_loss("t".into()).await.unwrap();
    assert_eq!(reply, Response::LossAcknowledged { tablets: 2 });
    let unmarks: Vec<String> = [&a, &b].iter().flat_map(|f| take(&f.log)).collect();
    assert_eq!(unmarks.len(), 2, "{unmarks:?}");
    assert!(unmarks.iter().all(|l| l.ends_with(" f0")), "{unmarks:?}");
    assert!(coord.model().data_lost.is_empty());
    assert!(
        coord
            .model()
            .table_info(TABLE)
            .unwrap()
            .tablets
            .iter()
            .all(|t| t.lost_from == 0)
    );
    // Idempotent, and an unknown table is named.
    let reply = coord.ack_loss("t".into()).await.unwrap();
    assert_eq!(reply, Response::LossAcknowledged { tablets: 0 });
    let e = coord.ack_loss("nope".into()).await.unwrap_err();
    assert_eq!(e.status, Status::UnknownTable);
    coord.close().await;
}

/// The failure detector runs recoveries in spawned tasks: the future must be `Send`.
#[allow(dead_code)]
fn recover_server_is_send(coord: &'static Coordinator) {
    fn send<T: Send>(_: T) {}
    send(recover_server(coord, 1));
}

#[tokio::test]
async fn an_enlistment_rehomes_orphaned_tablets_empty_and_marked_lost() {
    let dir = Dir::new("recovery");
    let a = fake_shard().await;
    let coord = open(&dir);
    {
        // Two orphaned tablets with no `lost_from` row: what a move leaves
        // when its destination refused activation after its source was
        // retired (`reconcile.rs`), the only way to get here.
        let guard = coord.meta_lock.lock().await;
        let ops = table_with_two_orphaned_tablets();
        coord.commit(&guard, ops).await.unwrap();
    }
    assert_eq!(coord.model().orphaned_tablets().len(), 2);
    let reject = usable_map(&coord.model(), TABLE, &coord.recovery_notes())
        .unwrap()
        .unwrap_err();
    assert!(
        reject.message.contains("no live server yet"),
        "{}",
        reject.message
    );

    // A shard that refuses the take: both stay orphaned, nothing is marked.
    a.refuse_take.store(true, Ordering::SeqCst);
    let enlist =
        |identity: &str| coord.enlist(vec![a.addr.clone()], identity.into(), false, String::new());
    assert!(enlist("one").await.is_ok());
    assert_eq!(coord.model().orphaned_tablets().len(), 2);
    assert!(coord.model().data_lost.is_empty());
    take(&a.log);

    // The next enlistment (the same shard, restarted) takes them: for each,
    // any stale copy dropped first, taken Active, then marked lost with a
    // version floor, before the map names the owner.
    a.refuse_take.store(false, Ordering::SeqCst);
    let Ok(Response::Enlisted { server_id, .. }) = enlist("one").await else {
        panic!("enlist refused");
    };
    let log = take(&a.log);
    for start in [STARTS[0], STARTS[2]] {
        let steps: Vec<usize> = [
            format!("Drop t1 s{start}"),
            format!("Take t1 s{start} Active"),
            format!(
                "Mark t1 s{start} f{}",
                insitu_protocol::LOST_FROM_EARLIER_RUN
            ),
        ]
        .iter()
        .map(|l| {
            log.iter()
                .position(|x| x == l)
                .unwrap_or_else(|| panic!("{l} missing: {log:?}"))
        })
        .collect();
        assert!(steps.windows(2).all(|w| w[0] < w[1]), "{log:?}");
    }
    let floors = a.floors.lock().unwrap().clone();
    assert!(
        floors.len() == 2 && floors[0] == floors[1] && floors[0] > 0,
        "{floors:?}"
    );
    {
        // The model's guard is dropped before the close awaits.
        let model = coord.model();
        assert!(model.orphaned_tablets().is_empty());
        for i in 0..2 {
            let t = &model.tables[&TABLE].tablets[i];
            assert_eq!(t.server_id, server_id, "tablet {i}");
            assert!(t.map_version > 3);
            assert_eq!(
                model.data_lost.get(&(TABLE, i as u32)),
                Some(&insitu_protocol::LOST_FROM_EARLIER_RUN),
                "tablet {i} marked lost"
            );
        }
        assert_eq!(model.lost_version_floor, floors[0]);
        assert!(
            usable_map(&model, TABLE, &coord.recovery_notes())
                .unwrap()
                .is_ok()
        );
        assert_eq!(model.validate(), Ok(()));
    }
    coord.close().await;
}

#[tokio::test]
async fn accept_loss_records_waiting_tablets_as_lost_from_their_master() {
    let dir = Dir::new("recovery");
    let coord = open(&dir);
    {
        // Two orphaned tablets; only tablet 1 waits for recovery from
        // server 7's replicas (`lost_from`).
        let guard = coord.meta_lock.lock().await;
        let mut ops = table_with_two_orphaned_tablets();
        ops.push(Op::PutLostFrom {
            table: TABLE,
            index: 1,
            master: 7,
        });
        coord.commit(&guard, ops).await.unwrap();
    }
    let reply = coord.accept_loss("t".into()).await.unwrap();
    assert_eq!(reply, Response::LossAcknowledged { tablets: 1 });
    // Recorded durably: its next recovery accepts what is missing and the
    // tablet is marked lost from server 7 before it serves.
    coord.close().await;
    drop(coord);
    let coord = open(&dir);
    let lost: Vec<((u64, u32), u64)> = coord
        .model()
        .data_lost
        .iter()
        .map(|(k, v)| (*k, *v))
        .collect();
    assert_eq!(lost, vec![((TABLE, 1), 7)]);
    // Idempotent, and an unknown table is named.
    let reply = coord.accept_loss("t".into()).await.unwrap();
    assert_eq!(reply, Response::LossAcknowledged { tablets: 0 });
    let e = coord.accept_loss("nope".into()).await.unwrap_err();
    assert_eq!(e.status, Status::UnknownTable);
    coord.close().await;
}

/// While no attempt is made (here: no live server is left), the `Retry`
/// says what the recovery waits for, not the cause of an earlier attempt,
/// which no longer holds (a CI run once showed "its server is no longer
/// registered" for a minute, the recovery master having been declared dead).
#[tokio::test]
async fn a_waiting_recovery_says_what_it_waits_for() {
    let (_dir, _a, _b, coord) = refusing_setup().await;
    recover_server(&coord, 1).await.unwrap_err();
    let message = |coord: &Coordinator| {
        usable_map(&coord.model(), TABLE, &coord.recovery_notes())
            .unwrap()
            .unwrap_err()
            .message
    };
    let before = message(&coord);
    assert!(before.contains("the last attempt failed"), "{before}");

    coord.declare_dead(&[1, 2, 3], "test").await.unwrap();
    assert!(!coord.recover_dead_servers().await, "waiting is no failure");
    let after = message(&coord);
    assert!(
        after.contains("being recovered")
            && after.contains("waits for live servers to recover it on (0 live")
            && !after.contains("last attempt"),
        "{after}"
    );
    coord.close().await;
}

#[path = "recovery_finish_tests.rs"]
mod finish_tests;
