//! Fakes for the replication tests: backups that record what they apply
//! (or refuse, or stay silent, or fence), a coordinator that enlists the
//! server and lists servers, and a recovery from what the backups hold.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use insitu_client::rpc::RpcConn;
use insitu_engine::{Engine, EngineConfig, HashRange};
use insitu_protocol::frame::{HEADER_BYTES, MAX_BODY_BYTES, check_header};
use insitu_protocol::{
    BackupOp, Request, Response, ServerInfo, ServerState, Status, TabletState, decode_request,
    encode_error, encode_response,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub const TABLE: u64 = 1;
pub const CLUSTER: u64 = 77;
pub const SERVER_ID: u64 = 1;

/// What a fake backup does with the next frame.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Apply the ops, answer `Done`.
    Done,
    /// Answer `NoSpace` without applying.
    NoSpace,
    /// Do not answer (until the mode changes).
    Hold,
    /// Answer `Fenced`.
    Fenced,
}

/// One op a backup applied, in the order of all backups' events.
#[derive(Clone, Debug)]
pub enum Applied {
    Append {
        log: u64,
        segment: u64,
        offset: u64,
        bytes: Vec<u8>,
    },
    Free {
        log: u64,
        segment: u64,
    },
    /// A log digest kept with the replica of `segment`.
    Digest {
        log: u64,
        segment: u64,
        seq: u64,
        segments: Vec<u64>,
    },
}

/// Everything the test observes, under one lock so events and client acks
/// share one order.
#[derive(Default)]
pub struct World {
    /// (backup index, op), in the order the backups applied them.
    pub events: Vec<(usize, Applied)>,
    /// Frames each backup received (applied or not).
    pub frames: Vec<usize>,
}

pub type Shared = Arc<Mutex<World>>;

pub struct FakeBackup {
    pub addr: String,
    pub mode: watch::Sender<Mode>,
}

pub async fn read_frame(stream: &mut TcpStream, buf: &mut BytesMut) -> Option<(u64, Vec<u8>)> {
    loop {
        if let Ok(Some((header, len))) = check_header(buf, MAX_BODY_BYTES)
            && buf.len() >= HEADER_BYTES + len
        {
            let frame = buf.split_to(HEADER_BYTES + len);
            return Some((header.request_id, frame[HEADER_BYTES..].to_vec()));
        }
        if stream.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

pub async fn start_backup(world: &Shared, index: usize) -> FakeBackup {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (mode, mode_rx) = watch::channel(Mode::Done);
    world.lock().unwrap().frames.push(0);
    let world = world.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (world, mut mode_rx) = (world.clone(), mode_rx.clone());
            tokio::spawn(async move {
                let mut stream = stream;
                let mut buf = BytesMut::new();
                while let Some((id, body)) = read_frame(&mut stream, &mut buf).await {
                    world.lock().unwrap().frames[index] += 1;
                    let mode = *mode_rx.wait_for(|m| *m != Mode::Hold).await.unwrap();
                    let mut out = BytesMut::new();
                    match mode {
                        Mode::Done => {
                            apply(&world, index, &body);
                            encode_response(&mut out, id, Status::Ok, &Response::Done).unwrap();
                        }
                        Mode::NoSpace => encode_error(&mut out, id, Status::NoSpace, "disk full"),
                        Mode::Fenced => encode_error(&mut out, id, Status::Fenced, "fenced"),
                        Mode::Hold => unreachable!(),
                    }
                    if stream.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    FakeBackup { addr, mode }
}

pub fn apply(world: &Shared, index: usize, body: &[u8]) {
    let Ok(Request::BackupWrite {
        cluster,
        master,
        ops,
    }) = decode_request(body)
    else {
        panic!("a backup got something else than a BackupWrite");
    };
    assert_eq!((cluster, master), (CLUSTER, SERVER_ID));
    let mut w = world.lock().unwrap();
    for op in ops {
        let applied = match op {
            BackupOp::Append {
                log,
                table,
                segment,
                offset,
                bytes,
                ..
            } => {
                assert_eq!(table, TABLE);
                Applied::Append {
                    log,
                    segment,
                    offset,
                    bytes: bytes.to_vec(),
                }
            }
            BackupOp::Free { log, segment } => Applied::Free { log, segment },
            BackupOp::FreeLog { .. } => panic!("no tablet is dropped here"),
            BackupOp::Digest {
                log,
                segment,
                seq,
                segments,
            } => Applied::Digest {
                log,
                segment,
                seq,
                segments,
            },
        };
        w.events.push((index, applied));
    }
}

/// Each backup's replicas after the first `upto` events: (log, segment) -> bytes.
pub fn replicas(
    events: &[(usize, Applied)],
    upto: usize,
) -> HashMap<usize, BTreeMap<(u64, u64), Vec<u8>>> {
    let mut held: HashMap<usize, BTreeMap<(u64, u64), Vec<u8>>> = HashMap::new();
    for (b, op) in &events[..upto] {
        let mine = held.entry(*b).or_default();
        match op {
            Applied::Append {
                log,
                segment,
                offset,
                bytes,
            } => {
                let have = mine.entry((*log, *segment)).or_default();
                assert!(*offset as usize <= have.len(), "a gap in an append");
                let skip = have.len() - *offset as usize;
                have.extend_from_slice(bytes.get(skip..).unwrap_or(&[]));
            }
            Applied::Free { log, segment } => {
                mine.remove(&(*log, *segment));
            }
            Applied::Digest { .. } => {}
        }
    }
    held
}

/// The newest digest the backups hold after the first `upto` events (a
/// digest goes with its carrier's free), and the segments it lists that no
/// backup holds: what a recovery would refuse for.
pub fn digest_gaps(events: &[(usize, Applied)], upto: usize) -> (Option<u64>, Vec<u64>) {
    let held = replicas(events, upto);
    // (backup, log, carrier) -> (seq, segments)
    let mut digests: BTreeMap<(usize, u64, u64), (u64, Vec<u64>)> = BTreeMap::new();
    for (b, op) in &events[..upto] {
        match op {
            Applied::Digest {
                log,
                segment,
                seq,
                segments,
            } => {
                let e = digests.entry((*b, *log, *segment)).or_default();
                if *seq > e.0 {
                    *e = (*seq, segments.clone());
                }
            }
            Applied::Free { log, segment } => {
                digests.remove(&(*b, *log, *segment));
            }
            Applied::Append { .. } => {}
        }
    }
    let Some((seq, listed)) = digests.into_values().max_by_key(|d| d.0) else {
        return (None, Vec::new());
    };
    let missing = listed
        .into_iter()
        .filter(|s| !held.values().any(|m| m.keys().any(|k| k.1 == *s)))
        .collect();
    (Some(seq), missing)
}

/// The value the tests write for op number `op`: its 8 bytes, then its low
/// byte repeated to 200 bytes, so `value_homes` can find it in a segment.
pub fn value(op: u64) -> Vec<u8> {
    let mut v = op.to_le_bytes().to_vec();
    v.resize(VALUE_BYTES, op as u8);
    v
}

const VALUE_BYTES: usize = 200;

/// For each (log, segment), the event count from which some digest listing
/// it was held by `r` backups (all of its carrier's backups).
pub fn listed_from(events: &[(usize, Applied)], r: usize) -> HashMap<(u64, u64), usize> {
    // (log, seq) -> the backups that hold it
    let mut holders: HashMap<(u64, u64), std::collections::HashSet<usize>> = HashMap::new();
    let mut out = HashMap::new();
    for (i, (b, op)) in events.iter().enumerate() {
        let Applied::Digest {
            log, seq, segments, ..
        } = op
        else {
            continue;
        };
        let held = holders.entry((*log, *seq)).or_default();
        held.insert(*b);
        if held.len() == r {
            for s in segments {
                out.entry((*log, *s)).or_insert(i + 1);
            }
        }
    }
    out
}

/// Op number -> every (log, segment) whose bytes (all ever appended, frees
/// ignored) hold that op's `value`.
pub fn value_homes(events: &[(usize, Applied)]) -> HashMap<u64, Vec<(u64, u64)>> {
    let mut longest: BTreeMap<(u64, u64), Vec<u8>> = BTreeMap::new();
    for copy in replicas_ignoring_frees(events).into_values() {
        for (k, bytes) in copy {
            let e = longest.entry(k).or_default();
            if bytes.len() > e.len() {
                *e = bytes;
            }
        }
    }
    let mut homes: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    for (k, b) in &longest {
        let mut i = 0;
        while i + VALUE_BYTES <= b.len() {
            let fill = b[i];
            if b[i + 8] == fill && b[i + VALUE_BYTES - 1] == fill {
                let op = u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
                // No skip past a match: a value of mostly zero bytes also
                // matches a few bytes before itself, as another op's value.
                if b[i..i + VALUE_BYTES] == value(op)[..] {
                    homes.entry(op).or_default().push(*k);
                }
            }
            i += 1;
        }
    }
    homes
}

/// Each backup's replicas as if nothing were freed: every byte appended.
fn replicas_ignoring_frees(
    events: &[(usize, Applied)],
) -> HashMap<usize, BTreeMap<(u64, u64), Vec<u8>>> {
    let appends: Vec<(usize, Applied)> = events
        .iter()
        .filter(|(_, op)| matches!(op, Applied::Append { .. }))
        .cloned()
        .collect();
    replicas(&appends, appends.len())
}

/// What a recovery from `backups` would give: per segment the longest copy,
/// replayed. key -> value.
pub fn recover(
    held: &HashMap<usize, BTreeMap<(u64, u64), Vec<u8>>>,
    backups: &[usize],
) -> HashMap<Vec<u8>, Vec<u8>> {
    let mut longest: BTreeMap<(u64, u64), &Vec<u8>> = BTreeMap::new();
    for b in backups {
        for (k, bytes) in held.get(b).into_iter().flatten() {
            let e = longest.entry(*k).or_insert(bytes);
            if bytes.len() > e.len() {
                *e = bytes;
            }
        }
    }
    let logs: std::collections::BTreeSet<u64> = longest.keys().map(|k| k.0).collect();
    assert!(logs.len() <= 1, "one tablet, one log: {logs:?}");
    let mut engine = Engine::new(EngineConfig::default()).unwrap();
    engine
        .replay(TABLE, HashRange::FULL, longest.values().map(|b| &b[..]))
        .expect("the replicas replay");
    let mut out = HashMap::new();
    let snapshot = engine.tablets();
    assert!(snapshot.len() <= 1);
    for key in all_keys() {
        if let Ok(obj) = engine.read(TABLE, &key) {
            out.insert(key, obj.value.to_vec());
        }
    }
    out
}

pub const KEYS: u32 = 200;

pub fn all_keys() -> Vec<Vec<u8>> {
    (0..KEYS).map(|k| k.to_le_bytes().to_vec()).collect()
}

/// A coordinator that enlists the server with `replicas` and lists `servers`.
pub async fn fake_coordinator(replicas: u32, servers: Arc<Mutex<Vec<ServerInfo>>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let servers = servers.clone();
            tokio::spawn(async move {
                let mut buf = BytesMut::new();
                while let Some((id, body)) = read_frame(&mut stream, &mut buf).await {
                    let response = match decode_request(&body) {
                        Ok(Request::Enlist { shard_addrs, .. }) => {
                            // As a real coordinator re-homing orphaned
                            // tablets: the new server takes one before it
                            // learns that it enlisted.
                            let shard = RpcConn::connect(&shard_addrs[0]).await.unwrap();
                            let taken =
                                tokio::time::timeout(Duration::from_secs(20), take_tablet(&shard))
                                    .await;
                            assert!(
                                matches!(taken, Ok(Ok(Status::Ok))),
                                "TakeTablet while enlisting: {taken:?}"
                            );
                            Response::Enlisted {
                                server_id: SERVER_ID,
                                cluster_id: CLUSTER,
                                replicas,
                            }
                        }
                        Ok(Request::ListServers) => {
                            Response::Servers(servers.lock().unwrap().clone())
                        }
                        _ => Response::Done,
                    };
                    let mut out = BytesMut::new();
                    encode_response(&mut out, id, Status::Ok, &response).unwrap();
                    if stream.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

pub fn info(id: u64, backup: &FakeBackup) -> ServerInfo {
    ServerInfo {
        id,
        shard_addrs: vec![],
        backup_addr: backup.addr.clone(),
        state: ServerState::Up,
    }
}

pub async fn take_tablet(conn: &RpcConn) -> Result<Status, insitu_client::rpc::RpcError> {
    let reply = conn
        .call(&Request::TakeTablet {
            table: TABLE,
            start_hash: 0,
            end_hash: u64::MAX,
            map_version: 1,
            state: TabletState::Active,
            migration: 0,
        })
        .await?;
    Ok(reply.status)
}
