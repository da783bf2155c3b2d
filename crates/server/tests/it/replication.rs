//! Replication from a shard to backups, against fake backups and a fake
//! coordinator run inside the test: a write is answered only once R backups
//! hold it and a digest held by R backups lists its segment, the bytes they got replay to every acknowledged object (after
//! overwrites, removes and cleaning, also at the moment of every free), a
//! failing or silent backup is replaced, `ServerDown` re-replicates,
//! `Fenced` stops the server, so does a server list that shows it dead, and
//! R = 0 sends nothing; a read waits only for
//! the replication of what it shows.
//!
//! Orders are asserted, never durations.

use crate::common;
use crate::replication_fakes;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use insitu_client::rpc::RpcConn;
use insitu_engine::EngineConfig;
use insitu_protocol::{RejectRules, Request, Response, ServerInfo, ServerState, Status, blob};
use insitu_server::{ServerConfig, ServerHandle};
use replication_fakes::*;

struct Setup {
    _dir: tempfile::TempDir,
    world: Shared,
    backups: Vec<FakeBackup>,
    /// The coordinator's server list (backup i is server 100 + i).
    servers: Arc<Mutex<Vec<ServerInfo>>>,
    server: ServerHandle,
    shard: String,
}

/// A one-shard server replicating to `listed` of `n` fake backups with R.
async fn setup(
    replicas: u32,
    n: usize,
    listed: usize,
    tune: impl FnOnce(&mut ServerConfig),
) -> Setup {
    common::trace_to_test_output();
    let world: Shared = Arc::default();
    let mut backups = Vec::new();
    for i in 0..n {
        backups.push(start_backup(&world, i).await);
    }
    let servers = Arc::new(Mutex::new(
        backups[..listed]
            .iter()
            .enumerate()
            .map(|(i, b)| info(100 + i as u64, b))
            .collect::<Vec<_>>(),
    ));
    let coordinator = fake_coordinator(replicas, servers.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(coordinator, dir.path());
    config.shards = 1;
    // Small segments and budget, so overwrites make the cleaner free segments.
    config.engine = EngineConfig {
        segment_bytes: 128 * 1024,
        memory_budget_bytes: 8 << 20,
        max_value_bytes: 4096,
    };
    config.replication.exit_on_fence = false;
    // Only the fake backups: the tests count exactly where replicas go.
    config.replication.own_backup = false;
    config.replication.retry_min = Duration::from_millis(5);
    config.replication.retry_max = Duration::from_millis(50);
    tune(&mut config);
    // Enlisting includes a TakeTablet from the coordinator (see `fake_coordinator`).
    let server = tokio::time::timeout(Duration::from_secs(30), insitu_server::start(config))
        .await
        .expect("enlisting finishes")
        .unwrap();
    let shard = server.shard_addrs[0].to_string();
    Setup {
        _dir: dir,
        world,
        backups,
        servers,
        server,
        shard,
    }
}

/// Write key `k` with `value`; the version.
async fn write(conn: &RpcConn, k: u32, value: &[u8]) -> u64 {
    let key = k.to_le_bytes();
    let reply = conn
        .call(&Request::Write {
            expires_at_ms: 0,
            table: TABLE,
            key: blob(&key),
            value: blob(value),
            rules: RejectRules::default(),
        })
        .await
        .unwrap();
    match reply.decode().unwrap() {
        Response::Written { version } => version,
        other => panic!("write: {other:?}"),
    }
}

async fn remove(conn: &RpcConn, k: u32) {
    let key = k.to_le_bytes();
    let reply = conn
        .call(&Request::Remove {
            table: TABLE,
            key: blob(&key),
            rules: RejectRules::default(),
        })
        .await
        .unwrap();
    assert!(reply.status.is_ok(), "{:?}", reply.error_message());
}

/// Up to 5 s (1,000 polls, 5 ms apart) until `f` holds.
async fn eventually(what: &str, f: impl FnMut() -> bool) {
    assert!(
        insitu_testkit::poll_until(1000, f).await,
        "never happened: {what}"
    );
}

#[tokio::test]
async fn a_write_is_answered_only_once_r_backups_hold_it() {
    let s = setup(2, 2, 2, |_| {}).await;
    let conn = RpcConn::connect(&s.shard).await.unwrap();
    assert_eq!(take_tablet(&conn).await.unwrap(), Status::Ok);
    write(&conn, 1, &value(1)).await;
    // Backup 0 now holds its replies back.
    s.backups[0].mode.send_replace(Mode::Hold);
    let frames_before = s.world.lock().unwrap().frames.clone();
    let writer = {
        let conn = conn.clone();
        tokio::spawn(async move { write(&conn, 2, &value(2)).await })
    };
    let world = s.world.clone();
    eventually("both backups got the write's round", || {
        let f = &world.lock().unwrap().frames;
        f[0] > frames_before[0] && f[1] > frames_before[1]
    })
    .await;
    // Backup 1 applied and answered; backup 0 did not answer: no reply yet.
    // (A reply cannot come while backup 0 holds, whatever the timing.)
    tokio::task::yield_now().await;
    assert!(
        !writer.is_finished(),
        "answered before R backups held the write"
    );
    s.backups[0].mode.send_replace(Mode::Done);
    writer.await.unwrap();
    // Each backup alone holds both writes.
    let w = s.world.lock().unwrap();
    let held = replicas(&w.events, w.events.len());
    for b in 0..2 {
        let got = recover(&held, &[b]);
        assert_eq!(got.get(1u32.to_le_bytes().as_slice()), Some(&value(1)));
        assert_eq!(got.get(2u32.to_le_bytes().as_slice()), Some(&value(2)));
    }
    drop(w);
    s.server.shutdown();
}

/// Read key `k`: its value, or None if absent.
async fn read(conn: &RpcConn, k: u32) -> Option<Vec<u8>> {
    let key = k.to_le_bytes();
    let reply = conn
        .call(&Request::Read {
            table: TABLE,
            key: blob(&key),
        })
        .await
        .unwrap();
    if reply.status == Status::ObjectDoesntExist {
        return None;
    }
    match reply.decode().unwrap() {
        Response::Read { value, .. } => Some(value.to_vec()),
        other => panic!("read: {other:?}"),
    }
}

#[tokio::test]
async fn a_read_waits_only_for_the_replication_of_what_it_shows() {
    let s = setup(2, 2, 2, |_| {}).await;
    let conn = RpcConn::connect(&s.shard).await.unwrap();
    assert_eq!(take_tablet(&conn).await.unwrap(), Status::Ok);
    // Key 1 in the first segment, then enough to seal it (128 KiB segments).
    write(&conn, 1, &value(1)).await;
    for k in 100..140 {
        write(&conn, k, &[k as u8; 4000]).await;
    }
    // Backup 0 holds its replies: nothing written from now on is durable.
    s.backups[0].mode.send_replace(Mode::Hold);
    let writer = {
        let conn = conn.clone();
        tokio::spawn(async move { write(&conn, 2, &value(2)).await })
    };
    let world = s.world.clone();
    let frames_before = world.lock().unwrap().frames.clone();
    eventually("backup 1 got the write's round", || {
        world.lock().unwrap().frames[1] > frames_before[1]
    })
    .await;
    // Key 1 sits in a sealed segment the backups held before the hold: its
    // read is answered while the write waits (before, every reply waited
    // for every change the shard had made).
    let reader = RpcConn::connect(&s.shard).await.unwrap();
    let old = tokio::time::timeout(Duration::from_secs(10), read(&reader, 1)).await;
    assert_eq!(
        old.expect("a read of a replicated object is answered while a write waits"),
        Some(value(1))
    );
    assert!(!writer.is_finished(), "answered before R backups held it");
    // What is not yet held waits: the new object, and an absence (it may
    // come of a removal not yet replicated).
    let shows_new = {
        let c = RpcConn::connect(&s.shard).await.unwrap();
        tokio::spawn(async move { read(&c, 2).await })
    };
    let absent = {
        let c = RpcConn::connect(&s.shard).await.unwrap();
        tokio::spawn(async move { read(&c, 3).await })
    };
    // A later read of key 1 on another connection is answered at once too.
    assert_eq!(read(&reader, 1).await, Some(value(1)));
    tokio::task::yield_now().await;
    assert!(
        !shows_new.is_finished(),
        "showed a write no backup quorum held"
    );
    assert!(
        !absent.is_finished(),
        "an absence answered before every change was held"
    );
    s.backups[0].mode.send_replace(Mode::Done);
    writer.await.unwrap();
    assert_eq!(shows_new.await.unwrap(), Some(value(2)));
    assert_eq!(absent.await.unwrap(), None);
    s.server.shutdown();
}

/// Per key, the states after each op (None: removed), and per key the
/// index of the last acknowledged op with the event count at its ack.
#[derive(Default)]
struct History {
    states: HashMap<Vec<u8>, Vec<Option<Vec<u8>>>>,
    /// (events applied when the ack arrived, key, op index)
    acks: Vec<(usize, Vec<u8>, usize)>,
    /// Events applied when each read that showed a value was answered.
    reads: Vec<usize>,
}

/// Random writes and removes from `tasks` connections, each owning a share
/// of the keys and running its ops one at a time, so each key's history is
/// in order. Records each ack against the backups' event count. Beside them
/// a reader reads random keys: a value a read showed counts as acknowledged
/// from its reply on (a reply must never show what a crash could take back).
async fn workload(s: &Setup, history: &Arc<Mutex<History>>, ops: u64, tasks: u32, seed: u64) {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let conn = RpcConn::connect(&s.shard).await.unwrap();
        let (world, history, done) = (s.world.clone(), history.clone(), done.clone());
        tokio::spawn(async move {
            let mut rng = insitu_testkit::rng(seed ^ 0x5EAD);
            let mut shown = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let k = rng.u32(0..KEYS);
                let Some(v) = read(&conn, k).await else {
                    continue;
                };
                let seen = world.lock().unwrap().events.len();
                let key = k.to_le_bytes().to_vec();
                let mut h = history.lock().unwrap();
                // Values are unique per op: the one state this read showed.
                let index = h.states[&key]
                    .iter()
                    .position(|state| state.as_ref() == Some(&v))
                    .expect("a read shows a value that was written");
                h.acks.push((seen, key, index));
                h.reads.push(seen);
                shown += 1;
            }
            shown
        })
    };
    let mut handles = Vec::new();
    for t in 0..tasks {
        let conn = RpcConn::connect(&s.shard).await.unwrap();
        let (world, history) = (s.world.clone(), history.clone());
        handles.push(tokio::spawn(async move {
            let mut rng = insitu_testkit::rng(seed + t as u64);
            for i in 0..ops / tasks as u64 {
                let k = rng.u32(0..KEYS / tasks) * tasks + t;
                let key = k.to_le_bytes().to_vec();
                let op = (seed << 32) | (t as u64) << 24 | i;
                let state = if rng.u32(0..5) == 0 {
                    None
                } else {
                    Some(value(op))
                };
                let index = {
                    let mut h = history.lock().unwrap();
                    let states = h.states.entry(key.clone()).or_default();
                    states.push(state.clone());
                    states.len() - 1
                };
                match &state {
                    Some(v) => {
                        write(&conn, k, v).await;
                    }
                    None => remove(&conn, k).await,
                }
                let seen = world.lock().unwrap().events.len();
                history.lock().unwrap().acks.push((seen, key, index));
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.await.unwrap() > 0, "the reader saw values");
}

/// A recovery from `backups` after the first `upto` events gives, for every
/// key acknowledged before, its acknowledged state or a later one.
fn check_recovery(world: &World, history: &History, upto: usize, backups: &[usize]) {
    let (seq, missing) = digest_gaps(&world.events, upto);
    assert!(
        missing.is_empty(),
        "after {upto} events the newest digest ({seq:?}) lists segments no backup holds: {missing:?}"
    );
    let held = replicas(&world.events, upto);
    let got = recover(&held, backups);
    let mut last_ack: HashMap<&Vec<u8>, usize> = HashMap::new();
    for (seen, key, index) in &history.acks {
        if *seen <= upto {
            let e = last_ack.entry(key).or_insert(*index);
            *e = (*e).max(*index);
        }
    }
    for (key, index) in last_ack {
        let allowed = &history.states[key][index..];
        let now = got.get(key).cloned();
        assert!(
            allowed.contains(&now),
            "after {upto} events key {key:?} recovers as {:?}, acknowledged state was {:?}",
            now.map(|v| v[..8].to_vec()),
            allowed[0].as_ref().map(|v| v[..8].to_vec())
        );
    }
}

#[tokio::test]
async fn replicas_replay_to_every_acknowledged_object_even_at_each_free() {
    let s = setup(2, 3, 3, |_| {}).await;
    let conn = RpcConn::connect(&s.shard).await.unwrap();
    assert_eq!(take_tablet(&conn).await.unwrap(), Status::Ok);
    let history = Arc::new(Mutex::new(History::default()));
    workload(&s, &history, 8000, 4, 1).await;
    let world = s.world.lock().unwrap();
    let history = history.lock().unwrap();
    let frees: Vec<usize> = world
        .events
        .iter()
        .enumerate()
        .filter(|(_, (_, op))| matches!(op, Applied::Free { .. }))
        .map(|(i, _)| i + 1)
        .collect();
    assert!(!frees.is_empty(), "the cleaner freed segments");
    // Right after every free, the backups still recover every acknowledged state.
    for &upto in &frees {
        check_recovery(&world, &history, upto, &[0, 1, 2]);
    }
    check_recovery(&world, &history, world.events.len(), &[0, 1, 2]);
    // Right after reads (up to 200 of them, spread over the run), the
    // backups recover what each read showed.
    let step = history.reads.len().div_ceil(200).max(1);
    for &upto in history.reads.iter().step_by(step) {
        check_recovery(&world, &history, upto, &[0, 1, 2]);
    }
    // Every acknowledged write sits in a segment that a digest held by all
    // R backups of its carrier listed before the ack was answered: a
    // recovery that finds only older digests then refuses instead of
    // missing the write (the publish gate, `Book::digests_settled`).
    let listed = listed_from(&world.events, 2);
    let homes = value_homes(&world.events);
    let (mut checked, mut unlisted) = (0, Vec::new());
    for (seen, key, index) in &history.acks {
        let Some(v) = &history.states[key][*index] else {
            continue;
        };
        let op = u64::from_le_bytes(v[..8].try_into().unwrap());
        let at = homes
            .get(&op)
            .unwrap_or_else(|| panic!("acknowledged write {op:#x} is in no segment"));
        if !at
            .iter()
            .any(|s| listed.get(s).is_some_and(|&from| from <= *seen))
        {
            unlisted.push((op, *seen, at.clone()));
        }
        checked += 1;
    }
    assert!(
        unlisted.is_empty(),
        "{} of {checked} writes were acknowledged before a digest held by R backups \
         listed their segments; the first (op, events seen at the ack, segments): {:x?}",
        unlisted.len(),
        &unlisted[..unlisted.len().min(5)]
    );
    assert!(checked > 1000, "{checked} acknowledged writes checked");
    let digests = world
        .events
        .iter()
        .filter(|(_, op)| matches!(op, Applied::Digest { .. }))
        .count();
    assert!(digests > 0, "the log's segments were listed in digests");
    // Every replica held at the end is a full copy on R = 2 backups.
    let held = replicas(&world.events, world.events.len());
    let mut copies: BTreeMap<(u64, u64), Vec<usize>> = BTreeMap::new();
    for (b, segs) in &held {
        for (k, bytes) in segs {
            copies.entry(*k).or_default().push(bytes.len());
            let _ = b;
        }
    }
    for (k, lens) in copies {
        assert_eq!(lens.len(), 2, "segment {k:?} on {} backups", lens.len());
        assert_eq!(lens[0], lens[1], "segment {k:?} copies differ in length");
    }
    drop((world, history));
    s.server.shutdown();
}

/// Backup 0 fails (`failing` sets how); writes go on to backups 1 and 2,
/// which then recover everything, and got the affected segments from 0.
async fn a_failing_backup_is_replaced(failing: Mode, tune: impl FnOnce(&mut ServerConfig)) {
    // Backups 0 and 1 at first; 2 joins the list later.
    let s = setup(2, 3, 2, tune).await;
    let conn = RpcConn::connect(&s.shard).await.unwrap();
    assert_eq!(take_tablet(&conn).await.unwrap(), Status::Ok);
    let history = Arc::new(Mutex::new(History::default()));
    workload(&s, &history, 500, 2, 2).await;
    let before = s.world.lock().unwrap().events.len();
    s.servers.lock().unwrap().push(info(102, &s.backups[2]));
    s.backups[0].mode.send_replace(failing);
    workload(&s, &history, 1500, 2, 3).await;
    let world = s.world.lock().unwrap();
    let history = history.lock().unwrap();
    check_recovery(&world, &history, world.events.len(), &[1, 2]);
    let resent = world.events[before..].iter().any(|(b, op)| {
        *b == 2
            && matches!(op, Applied::Append { offset: 0, segment, .. }
            if world.events[..before].iter().any(|(b0, o)| *b0 == 0
                && matches!(o, Applied::Append { segment: s0, .. } if s0 == segment)))
    });
    assert!(
        resent,
        "a segment backup 0 held was resent to backup 2 from offset 0"
    );
    drop((world, history));
    s.server.shutdown();
}

#[tokio::test]
async fn a_backup_without_space_is_replaced_and_replies_still_come() {
    a_failing_backup_is_replaced(Mode::NoSpace, |_| {}).await;
}

#[tokio::test]
async fn a_silent_backup_is_replaced_after_its_timeout() {
    a_failing_backup_is_replaced(Mode::Hold, |c| {
        c.replication.call_timeout = Duration::from_millis(300);
    })
    .await;
}

#[tokio::test]
async fn server_down_is_answered_at_once_and_moves_every_replica_it_held() {
    let s = setup(2, 3, 2, |c| {
        // Only `ServerDown` may end a call to the silent backup here.
        c.replication.call_timeout = Duration::from_secs(600);
    })
    .await;
    let conn = RpcConn::connect(&s.shard).await.unwrap();
    assert_eq!(take_tablet(&conn).await.unwrap(), Status::Ok);
    let history = Arc::new(Mutex::new(History::default()));
    workload(&s, &history, 2000, 2, 4).await;
    // Backup 0 goes silent: a write waits.
    s.backups[0].mode.send_replace(Mode::Hold);
    let writer = {
        let conn = conn.clone();
        tokio::spawn(async move { write(&conn, KEYS + 1, &value(u64::MAX)).await })
    };
    s.servers.lock().unwrap()[0].state = ServerState::Dead;
    // The coordinator's ServerDown is answered at once although backup 0
    // still holds the round's call: it shows no data, so it does not wait
    // for replication.
    let admin = RpcConn::connect(&s.shard).await.unwrap();
    let reply = tokio::time::timeout(
        Duration::from_secs(20),
        admin.call(&Request::ServerDown { server_id: 100 }),
    )
    .await
    .expect("ServerDown answered without waiting for replication")
    .unwrap();
    assert_eq!(reply.status, Status::Ok);
    // With one backup left the write is held by it alone (R is met as far
    // as backups exist) ...
    writer.await.unwrap();
    // ... and a new server gets a copy of everything backup 0 held.
    s.servers.lock().unwrap().push(info(102, &s.backups[2]));
    let world = s.world.clone();
    eventually(
        "backup 2 holds a copy of every segment backup 1 holds",
        || {
            let w = world.lock().unwrap();
            let held = replicas(&w.events, w.events.len());
            let (Some(b1), Some(b2)) = (held.get(&1), held.get(&2)) else {
                return false;
            };
            !b1.is_empty()
                && b1
                    .iter()
                    .all(|(k, bytes)| b2.get(k).is_some_and(|c| c.len() == bytes.len()))
        },
    )
    .await;
    let world = s.world.lock().unwrap();
    check_recovery(
        &world,
        &history.lock().unwrap(),
        world.events.len(),
        &[1, 2],
    );
    drop(world);
    s.server.shutdown();
}

#[tokio::test]
async fn fenced_stops_the_server() {
    let s = setup(1, 1, 1, |_| {}).await;
    s.backups[0].mode.send_replace(Mode::Fenced);
    // The tablet taken while enlisting made a change: its round is fenced,
    // so a write is never answered (its connection closes), or the shard
    // has already stopped listening.
    let refused = match RpcConn::connect(&s.shard).await {
        Err(_) => true,
        Ok(conn) => conn
            .call(&Request::Write {
                expires_at_ms: 0,
                table: TABLE,
                key: blob(b"k"),
                value: blob(b"v"),
                rules: RejectRules::default(),
            })
            .await
            .is_err(),
    };
    assert!(refused, "a fenced server answered");
    assert!(s.server.fenced());
    // And it serves no one any more (once its event loop saw the fence).
    assert!(
        stops_answering(&s.shard).await,
        "a fenced shard still answers"
    );
    s.server.shutdown();
}

/// Poll the shard until it answers no ping (up to 1 s); whether it stopped.
async fn stops_answering(shard: &str) -> bool {
    for _ in 0..100 {
        let stopped = match RpcConn::connect(shard).await {
            Err(_) => true,
            Ok(c) => c.call(&Request::Ping).await.is_err(),
        };
        if stopped {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// A server the coordinator lists as dead stops serving at its next list
/// refresh, though it writes nothing (no backup can refuse it).
#[tokio::test]
async fn a_server_listed_dead_stops_serving_without_a_write() {
    let s = setup(1, 1, 1, |c| {
        c.replication.refresh_interval = Duration::from_millis(20);
    })
    .await;
    let conn = RpcConn::connect(&s.shard).await.unwrap();
    assert!(conn.call(&Request::Ping).await.unwrap().status.is_ok());
    s.servers.lock().unwrap().push(ServerInfo {
        id: SERVER_ID,
        shard_addrs: vec![s.shard.clone()],
        backup_addr: String::new(),
        state: ServerState::Dead,
    });
    eventually("the server sees itself listed dead", || s.server.fenced()).await;
    assert!(
        stops_answering(&s.shard).await,
        "a server listed dead still answers"
    );
    s.server.shutdown();
}

#[tokio::test]
async fn r_zero_sends_nothing() {
    let s = setup(0, 1, 1, |_| {}).await;
    let conn = RpcConn::connect(&s.shard).await.unwrap();
    assert_eq!(take_tablet(&conn).await.unwrap(), Status::Ok);
    for i in 0..100 {
        write(&conn, i, &value(i as u64)).await;
    }
    assert_eq!(s.world.lock().unwrap().frames, vec![0]);
    s.server.shutdown();
}
