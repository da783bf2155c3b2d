//! `RecoverTablet` on a real shard, reading from fake backups: TCP servers
//! that answer `BackupList` / `BackupRead` from in-memory replicas made of a
//! real engine's segments. Covers the choice of the newest log, the fence,
//! fallback from a corrupt replica and from a failing holder to another,
//! refusing while a backup does not answer or while a segment the log's
//! digest lists is missing, and the other refusals.

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use insitu_client::rpc::RpcConn;
use insitu_engine::{Engine, EngineConfig, HashRange, RejectRules};
use insitu_protocol::{
    LogDigest, ReplicaInfo, Request, Response, Status, blob, decode_request, encode_error,
    encode_response,
};

const TABLE: u64 = 77;
const MASTER: u64 = 9;

/// One replica a fake backup holds.
#[derive(Clone)]
struct Replica {
    info: ReplicaInfo,
    bytes: Vec<u8>,
    /// Refuse every read of it (a disk error on the backup).
    fail_reads: bool,
}

/// What a fake backup saw: (master, fence) of every `BackupList`.
type Lists = Arc<Mutex<Vec<(u64, bool)>>>;

/// A fake backup holding `replicas` of `MASTER`; returns its address and
/// the list calls it received. Like a real master's backup it keeps, per
/// log, a digest listing nothing on its highest open replica (if it holds
/// one): enough for a recovery to trust its closed replicas.
async fn fake_backup(replicas: Vec<Replica>) -> (String, Lists) {
    let mut carriers: BTreeMap<u64, u64> = BTreeMap::new();
    for r in replicas.iter().filter(|r| !r.info.closed) {
        let c = carriers.entry(r.info.log).or_insert(r.info.segment);
        *c = (*c).max(r.info.segment);
    }
    let digests = carriers
        .into_iter()
        .map(|(log, segment)| LogDigest {
            log,
            segment,
            seq: 1,
            segments: Vec::new(),
        })
        .collect();
    fake_backup_with_digests(replicas, digests).await
}

/// `fake_backup` that also lists `digests` of `MASTER`'s logs.
async fn fake_backup_with_digests(
    replicas: Vec<Replica>,
    digests: Vec<LogDigest>,
) -> (String, Lists) {
    let lists: Lists = Arc::default();
    let seen = lists.clone();
    let addr = insitu_testkit::peer::serve(move |id, body, out| {
        answer(&replicas, &digests, &seen, id, body, out)
    })
    .await
    .unwrap();
    (addr, lists)
}

fn answer(
    replicas: &[Replica],
    digests: &[LogDigest],
    seen: &Lists,
    id: u64,
    body: &[u8],
    out: &mut BytesMut,
) {
    match decode_request(body) {
        Ok(Request::BackupList { master, fence, .. }) => {
            seen.lock().unwrap().push((master, fence));
            let list = replicas
                .iter()
                .filter(|_| master == MASTER)
                .map(|r| r.info.clone())
                .collect();
            let digests = digests
                .iter()
                .filter(|_| master == MASTER)
                .cloned()
                .collect();
            let reply = Response::BackupReplicas {
                replicas: list,
                digests,
            };
            encode_response(out, id, Status::Ok, &reply).unwrap();
        }
        Ok(Request::BackupRead {
            master,
            log,
            segment,
            offset,
            max_bytes,
            ..
        }) => {
            let found = replicas
                .iter()
                .find(|r| master == MASTER && r.info.log == log && r.info.segment == segment);
            match found {
                Some(r) if r.fail_reads => {
                    encode_error(out, id, Status::Internal, "fake backup: read failed")
                }
                Some(r) => {
                    let start = (offset as usize).min(r.bytes.len());
                    let end = (start + max_bytes as usize).min(r.bytes.len());
                    let reply = Response::BackupBytes {
                        bytes: blob(&r.bytes[start..end]),
                        end: end == r.bytes.len(),
                    };
                    encode_response(out, id, Status::Ok, &reply).unwrap();
                }
                None => encode_error(out, id, Status::BadRequest, "fake backup: no such replica"),
            }
        }
        _ => encode_error(
            out,
            id,
            Status::BadRequest,
            "fake backup: unexpected request",
        ),
    }
}

/// The source: a real engine's tablet after writes, overwrites, removes and
/// cleaning. Returns its segments (log, segment id, bytes, sealed) and the
/// state every key must have after recovery: key -> (value, version).
type Expected = BTreeMap<Vec<u8>, (Vec<u8>, u64)>;
type Segments = Vec<(u64, u64, Vec<u8>, bool)>;

fn source() -> (Segments, Expected) {
    let config = EngineConfig {
        segment_bytes: 16 * 1024,
        memory_budget_bytes: 16 << 20,
        max_value_bytes: 1024,
    };
    let mut e = Engine::with_max_key_bytes(config, 64).unwrap();
    e.create_tablet(TABLE, HashRange::FULL).unwrap();
    let rules = RejectRules::default();
    for round in 0..6u32 {
        for i in 0..500u32 {
            let key = format!("key-{i}");
            let value = vec![(round + i) as u8; 100 + (i as usize % 300)];
            e.write(TABLE, key.as_bytes(), &value, &rules).unwrap();
        }
        for i in (round..500).step_by(7) {
            let _ = e.remove(TABLE, format!("key-{i}").as_bytes(), &rules);
        }
    }
    e.clean();
    let mut segments = Vec::new();
    e.for_each_segment(|v| segments.push((v.log, v.segment, v.bytes.to_vec(), v.sealed)));
    assert!(segments.len() > 3, "several segments: {}", segments.len());
    let mut expected = BTreeMap::new();
    for i in 0..500u32 {
        let key = format!("key-{i}").into_bytes();
        if let Ok(o) = e.read(TABLE, &key) {
            expected.insert(key, (o.value.to_vec(), o.version));
        }
    }
    assert!(!expected.is_empty());
    (segments, expected)
}

fn replica(log: u64, segment: u64, bytes: &[u8], closed: bool) -> Replica {
    Replica {
        info: ReplicaInfo {
            log,
            table: TABLE,
            start_hash: 0,
            segment,
            bytes: bytes.len() as u64,
            closed,
        },
        bytes: bytes.to_vec(),
        fail_reads: false,
    }
}

/// A coordinator and a one-shard server; returns the shard's address.
async fn shard() -> (
    tempfile::TempDir,
    insitu_coordinator::CoordinatorHandle,
    insitu_server::ServerHandle,
    RpcConn,
) {
    shard_with_budget(EngineConfig::default().memory_budget_bytes).await
}

async fn shard_with_budget(
    memory_budget_bytes: usize,
) -> (
    tempfile::TempDir,
    insitu_coordinator::CoordinatorHandle,
    insitu_server::ServerHandle,
    RpcConn,
) {
    let node = common::start(|c| c.engine.memory_budget_bytes = memory_budget_bytes).await;
    let conn = RpcConn::connect(&node.shard(0)).await.unwrap();
    (node.dir, node.coordinator, node.server, conn)
}

fn recover(backups: &[String], map_version: u64) -> Request<'static> {
    Request::RecoverTablet {
        table: TABLE,
        start_hash: 0,
        end_hash: u64::MAX,
        map_version,
        master: MASTER,
        backups: backups.to_vec(),
        accept_missing: false,
    }
}

/// An address nothing listens on.
fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

async fn read(conn: &RpcConn, key: &[u8]) -> (Status, Vec<u8>, u64) {
    let reply = conn
        .call(&Request::Read {
            table: TABLE,
            key: blob(key),
        })
        .await
        .unwrap();
    match reply.decode() {
        Ok(Response::Read { version, value, .. }) => (reply.status, value.to_vec(), version),
        _ => (reply.status, Vec::new(), 0),
    }
}

#[tokio::test]
async fn recovers_the_newest_log_past_a_corrupt_replica_and_a_failing_holder() {
    let (segments, expected) = source();
    let log = segments[0].0;
    // The segment B holds corrupt (closed, so it is tried first) and the one
    // whose reads fail on B.
    let corrupt_seg = segments[1].1;
    let failing_seg = segments[2].1;
    let mut a = Vec::new();
    let mut b = Vec::new();
    for (l, s, bytes, sealed) in &segments {
        assert_eq!(*l, log);
        a.push(replica(*l, *s, bytes, false));
        let mut r = replica(*l, *s, bytes, *sealed);
        if *s == corrupt_seg {
            // A flipped bit inside the first entry's key: its CRC fails.
            r.bytes[40] ^= 0x10;
            r.info.closed = true;
        }
        if *s == failing_seg {
            r.info.closed = true;
            r.fail_reads = true;
        }
        b.push(r);
    }
    // An older instance of the tablet (a lower log id) full of junk: ignored.
    a.push(replica(log - 1, 1, &[0xAB; 300], true));
    let (a_addr, a_lists) = fake_backup(a).await;
    let (b_addr, b_lists) = fake_backup(b).await;
    let (_dir, _coordinator, server, conn) = shard().await;

    // A backup that does not answer may hold the only replica of a segment:
    // the recovery is refused (retryable) rather than run without it.
    let with_dead = vec![dead_addr(), a_addr.clone(), b_addr.clone()];
    let reply = conn.call(&recover(&with_dead, 4)).await.unwrap();
    assert_eq!(reply.status, Status::Retry, "{}", reply.error_message());
    assert!(
        reply.error_message().contains("waits for every backup"),
        "{}",
        reply.error_message()
    );
    let (first_key, _) = expected.iter().next().unwrap();
    assert_eq!(
        read(&conn, first_key).await.0,
        Status::UnknownTablet,
        "nothing was installed"
    );
    a_lists.lock().unwrap().clear();
    b_lists.lock().unwrap().clear();

    let backups = vec![a_addr, b_addr];
    let reply = conn.call(&recover(&backups, 5)).await.unwrap();
    assert_eq!(reply.status, Status::Ok, "{}", reply.error_message());
    let total: u64 = segments.iter().map(|s| s.2.len() as u64).sum();
    match reply.decode().unwrap() {
        Response::Recovered {
            objects,
            segments: n,
            bytes,
        } => {
            assert_eq!(objects, expected.len() as u64);
            assert_eq!(n, segments.len() as u64);
            assert_eq!(bytes, total);
        }
        other => panic!("unexpected reply {other:?}"),
    }
    // Every backup that answered was fenced.
    assert_eq!(*a_lists.lock().unwrap(), vec![(MASTER, true)]);
    assert_eq!(*b_lists.lock().unwrap(), vec![(MASTER, true)]);

    // Receiving until activated: reads get Retry.
    assert_eq!(read(&conn, first_key).await.0, Status::Retry);
    // A second recovery of a tablet held Receiving replaces it (an earlier
    // attempt's leftover), and gives the same result.
    let again = conn.call(&recover(&backups, 6)).await.unwrap();
    assert_eq!(again.status, Status::Ok, "{}", again.error_message());
    let activate = Request::ActivateTablet {
        table: TABLE,
        start_hash: 0,
        map_version: 6,
        writes: true,
    };
    assert_eq!(conn.call(&activate).await.unwrap().status, Status::Ok);
    let mut absent = HashSet::new();
    for i in 0..500u32 {
        let key = format!("key-{i}").into_bytes();
        let (status, value, version) = read(&conn, &key).await;
        match expected.get(&key) {
            Some((v, ver)) => {
                assert_eq!(status, Status::Ok, "key-{i}");
                assert_eq!((&value, version), (v, *ver), "key-{i}");
            }
            None => {
                assert_eq!(status, Status::ObjectDoesntExist, "key-{i}");
                absent.insert(i);
            }
        }
    }
    assert!(!absent.is_empty(), "removed keys stay removed");
    // A new write continues above every recovered version.
    let max_version = expected.values().map(|(_, v)| *v).max().unwrap();
    let w = conn
        .call(&Request::Write {
            expires_at_ms: 0,
            table: TABLE,
            key: blob(b"new"),
            value: blob(b"v"),
            rules: insitu_protocol::RejectRules::default(),
        })
        .await
        .unwrap();
    match w.decode().unwrap() {
        Response::Written { version } => assert!(version > max_version),
        other => panic!("unexpected reply {other:?}"),
    }
    // A tablet that serves here is never recovered over.
    let refused = conn.call(&recover(&backups, 7)).await.unwrap();
    assert_eq!(refused.status, Status::BadRequest);
    assert!(refused.error_message().contains("already serves"));
    server.shutdown();
}

#[tokio::test]
async fn refuses_when_a_segment_has_no_good_holder() {
    let (segments, _) = source();
    let only_corrupt = segments[1].1;
    let only_failing = segments[2].1;
    let mut corrupt = Vec::new();
    let mut failing = Vec::new();
    for (l, s, bytes, sealed) in &segments {
        let mut r = replica(*l, *s, bytes, *sealed);
        if *s == only_corrupt {
            r.bytes[40] ^= 0x10;
        }
        corrupt.push(r.clone());
        r = replica(*l, *s, bytes, *sealed);
        r.fail_reads = *s == only_failing;
        failing.push(r);
    }
    let (corrupt_addr, _) = fake_backup(corrupt).await;
    let (failing_addr, _) = fake_backup(failing).await;
    let (_dir, _coordinator, server, conn) = shard().await;

    let reply = conn.call(&recover(&[corrupt_addr], 3)).await.unwrap();
    assert_eq!(reply.status, Status::DataLost);
    let message = reply.error_message();
    assert!(
        message.contains(&format!("segment {only_corrupt} ")),
        "{message}"
    );
    let reply = conn.call(&recover(&[failing_addr], 3)).await.unwrap();
    assert_eq!(reply.status, Status::Internal);
    let message = reply.error_message();
    assert!(
        message.contains(&format!("segment {only_failing} ")) && message.contains("read failed"),
        "{message}"
    );
    // Nothing was left behind: the tablet is unknown here.
    assert_eq!(read(&conn, b"key-1").await.0, Status::UnknownTablet);
    // No backup holds anything: the tablet comes back empty (R = 0, or a
    // tablet never written).
    let (empty_addr, _) = fake_backup(Vec::new()).await;
    let reply = conn.call(&recover(&[empty_addr], 3)).await.unwrap();
    assert_eq!(reply.status, Status::Ok);
    assert!(matches!(
        reply.decode().unwrap(),
        Response::Recovered {
            objects: 0,
            segments: 0,
            bytes: 0
        }
    ));
    server.shutdown();
}

#[tokio::test]
async fn refuses_while_a_segment_the_newest_digest_lists_is_missing() {
    let (segments, expected) = source();
    let log = segments[0].0;
    let ids: Vec<u64> = segments.iter().map(|s| s.1).collect();
    let lost = *ids.last().unwrap() + 1; // its replicas sat on removed backups
    // Digests are kept with the open head: each backup listing one holds it.
    let (_, head, head_bytes, _) = segments.iter().find(|s| !s.3).expect("an open head");
    let head_replica = replica(log, *head, head_bytes, false);
    let digest = |seq: u64, segments: Vec<u64>| LogDigest {
        log,
        segment: *head,
        seq,
        segments,
    };
    let held: Vec<Replica> = segments
        .iter()
        .map(|(l, s, bytes, sealed)| replica(*l, *s, bytes, *sealed))
        .collect();
    // The newest digest (7) lists the lost segment; an older one (3) and a
    // digest of another log do not, and must not be trusted instead.
    let with_lost = [ids.clone(), vec![lost]].concat();
    let (a, _) = fake_backup_with_digests(
        held.clone(),
        vec![
            digest(3, ids.clone()),
            LogDigest {
                log: log + 1,
                segment: 1,
                seq: 9,
                segments: vec![1],
            },
        ],
    )
    .await;
    let (b, _) =
        fake_backup_with_digests(vec![head_replica.clone()], vec![digest(7, with_lost)]).await;
    let (_dir, _coordinator, server, conn) = shard().await;
    let reply = conn.call(&recover(&[a.clone(), b], 3)).await.unwrap();
    assert_eq!(reply.status, Status::DataLost, "{}", reply.error_message());
    let message = reply.error_message();
    assert!(
        message.contains(&format!("[{lost}]")) && message.contains("digest 7"),
        "{message}"
    );
    let (first_key, _) = expected.iter().next().unwrap();
    assert_eq!(read(&conn, first_key).await.0, Status::UnknownTablet);
    // Once the digest's segments are all found, the recovery goes on.
    let (c, _) = fake_backup_with_digests(vec![head_replica], vec![digest(8, ids)]).await;
    let reply = conn.call(&recover(&[a, c], 4)).await.unwrap();
    assert_eq!(reply.status, Status::Ok, "{}", reply.error_message());
    server.shutdown();
}

#[tokio::test]
async fn refuses_segments_that_do_not_fit_in_memory_before_reading_them() {
    // Listed as 64 MiB; never read, since the charge is refused first.
    // Open: the head, which keeps the log's digest.
    let mut big = replica(3, 1, b"never read", false);
    big.info.bytes = 64 << 20;
    big.fail_reads = true;
    let (addr, lists) = fake_backup(vec![big]).await;
    let (_dir, _coordinator, server, conn) = shard_with_budget(16 << 20).await;
    let reply = conn.call(&recover(&[addr], 3)).await.unwrap();
    assert_eq!(reply.status, Status::OutOfMemory);
    assert!(
        reply.error_message().contains("67108864 bytes"),
        "{}",
        reply.error_message()
    );
    assert_eq!(lists.lock().unwrap().len(), 1);
    assert_eq!(read(&conn, b"key-1").await.0, Status::UnknownTablet);
    server.shutdown();
}

/// A tablet of `objects` small objects, written once: its segments.
fn many_objects(objects: u32) -> Segments {
    let config = EngineConfig {
        segment_bytes: 64 * 1024,
        memory_budget_bytes: 64 << 20,
        max_value_bytes: 1024,
    };
    let mut e = Engine::with_max_key_bytes(config, 64).unwrap();
    e.create_tablet(TABLE, HashRange::FULL).unwrap();
    for i in 0..objects {
        let value = i.to_le_bytes();
        e.write(
            TABLE,
            format!("key-{i}").as_bytes(),
            &value,
            &RejectRules::default(),
        )
        .unwrap();
    }
    let mut segments = Vec::new();
    e.for_each_segment(|v| segments.push((v.log, v.segment, v.bytes.to_vec(), v.sealed)));
    segments
}

/// The replay runs in steps with the shard's other requests between them:
/// while a recovery is under way, a second connection's `ShardStats` is
/// answered with the tablet's segments already charged but the tablet not
/// yet added, which a replay in one synchronous call never lets anyone see.
#[tokio::test]
async fn the_shard_answers_other_requests_while_it_replays() {
    let objects = 100_000;
    let segments = many_objects(objects);
    let replicas = segments
        .iter()
        .map(|(l, s, bytes, sealed)| replica(*l, *s, bytes, *sealed))
        .collect();
    let (addr, _) = fake_backup(replicas).await;
    let node = common::start(|_| {}).await;
    let conn = RpcConn::connect(&node.shard(0)).await.unwrap();
    let probe = RpcConn::connect(&node.shard(0)).await.unwrap();
    let request = recover(&[addr], 3);
    let recovery = conn.call(&request);
    tokio::pin!(recovery);
    let (mut probes, mut mid_build) = (0u32, 0u32);
    let reply = loop {
        tokio::select! {
            reply = &mut recovery => break reply.unwrap(),
            stats = probe.call(&Request::ShardStats { reset_longest_call: false }) => {
                let stats = stats.unwrap();
                let Ok(Response::ShardStats(stats)) = stats.decode() else {
                    panic!("not stats: {:?}", stats.status);
                };
                probes += 1;
                if stats.segment_bytes > 0 && !stats.tablets.iter().any(|t| t.table == TABLE) {
                    mid_build += 1;
                }
            }
        }
    };
    assert!(reply.status.is_ok(), "{}", reply.error_message());
    assert!(
        mid_build > 0,
        "no probe of {probes} saw the tablet being built"
    );
    assert_eq!(
        read(&conn, b"key-0").await.0,
        Status::Retry,
        "held Receiving"
    );
    node.server.shutdown();
}
