//! Mutated requests against a live server: a hostile or broken peer.
//!
//! The decoders have their own fuzz targets; this test goes past them, into
//! the handlers. It builds a valid request of every kind a shard or a backup
//! port takes (naming real tables, tablets, keys and rows, so that a mutant
//! reaches deep), mutates its bytes (bits, bytes, varints set to extremes,
//! cuts, insertions, splices of two requests), and sends each mutant as a
//! well-framed request. What must hold: every frame is answered (any status)
//! or its connection closed, never a stopped server; afterwards every port
//! answers `Ping`, and a table no mutant names keeps every object.
//!
//! Why a mutant may not name the canary table: a valid `DropTablet` or
//! `Remove` of it would remove its data, which is the request's meaning, not
//! a fault. Mutants are decoded here first for that check; the ones that do
//! not decode are sent too (the server must refuse them as malformed).
//!
//! After the first part (data requests only), no key of the attack table may
//! stay locked: every prepare a mutant left is resolved once overdue.
//!
//! `INSITU_MUTANTS` sets how many (default 6,000, about 5 s: at 2,500 no
//! prepare of the first part named a table that does not exist, and the
//! lock check passed without the fix it guards, `txn_gone_table.rs`; at
//! 6,000 and 10,000 it fails without it), `INSITU_MUTANT_SEED` the seed
//! (default: a fixed one, so a failure reproduces; the seed is printed).

use crate::common;

use std::time::Duration;

mod seeds;

use insitu_client::Client;
use insitu_protocol::frame::{HEADER_BYTES, check_header};
use insitu_protocol::query::Scalar;
use insitu_protocol::{Request, decode_request};
use seeds::{Port, Seed, body_of, is_control, receiving, seeds, spares_nothing, tables_named};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one mutant may take to be answered before the test calls it a
/// stall: longer than any wait a valid request may have (a snapshot read
/// waits up to 5 s for lock holders, a recovery's backup calls 5 s each).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// Objects in the canary table, checked at the end.
const CANARY_KEYS: usize = 200;

/// One to four mutations of `body` (with `other`, another seed, to splice).
/// Mostly one, and mostly in place: postcard refuses a body with a byte too
/// many or too few, so a mutant that keeps its length is the one likeliest
/// to decode into a strange request and reach a handler.
fn mutate(rng: &mut insitu_testkit::Rng, body: &[u8], other: &[u8]) -> Vec<u8> {
    let mut b = body.to_vec();
    let mutations = match rng.u8(0..10) {
        0..=6 => 1,
        7..=8 => 2,
        _ => rng.usize(3..=4),
    };
    for _ in 0..mutations {
        let at = if b.is_empty() {
            0
        } else {
            rng.usize(0..b.len())
        };
        match rng.u8(0..10) {
            // A bit flipped.
            0..=2 if !b.is_empty() => b[at] ^= 1 << rng.u8(0..8),
            // A byte set to a value decoders treat specially.
            3..=5 if !b.is_empty() => {
                let any = rng.u8(..);
                b[at] = [0u8, 1, 0x7F, 0x80, 0xFF, any][rng.usize(0..6)]
            }
            // A varint made as large as it can be (u64::MAX), or u32-ish.
            6 => {
                let max: &[u8] = if rng.bool() {
                    &[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]
                } else {
                    &[0xFF, 0xFF, 0xFF, 0xFF, 0x0F]
                };
                let end = (at + rng.usize(1..=3)).min(b.len());
                b.splice(at..end, max.iter().copied());
            }
            // Cut short.
            7 => b.truncate(at),
            // Bytes inserted.
            8 => {
                let n = rng.usize(1..=8);
                let extra: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
                b.splice(at..at, extra);
            }
            // A run removed.
            9 if !b.is_empty() && rng.bool() => {
                let end = (at + rng.usize(1..=6)).min(b.len());
                b.drain(at..end);
            }
            // The tail of another request spliced on.
            _ if !other.is_empty() => {
                let from = rng.usize(0..other.len());
                b.truncate(at);
                b.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    b
}

/// Half the transaction mutants are pointed at live transactions and free
/// keys: a prepare gets a fresh transaction id and its items other keys of
/// the attack table (the seeds' fixed ids and keys would make most prepares
/// conflict with the first, leaving few transactions to resolve); a
/// decision, resolution or inquiry gets one of the last 16 prepared ids.
/// Other mutants pass as they are.
fn retarget_txn(rng: &mut insitu_testkit::Rng, body: Vec<u8>, recent: &mut Vec<u64>) -> Vec<u8> {
    let Ok(mut request) = decode_request(&body) else {
        return body;
    };
    if rng.bool() {
        return body;
    }
    let keys: Vec<String> = (0..4).map(|_| format!("a{}", rng.usize(0..100))).collect();
    match &mut request {
        Request::TxnPrepare { txn, items, .. } => {
            *txn = rng.u64(..);
            if recent.len() == 16 {
                recent.remove(0);
            }
            recent.push(*txn);
            for (item, key) in items.iter_mut().zip(&keys) {
                item.key = insitu_protocol::blob(key.as_bytes());
            }
        }
        Request::TxnDecide { txn, .. }
        | Request::TxnResolve { txn, .. }
        | Request::TxnInquire { txn, .. }
            if !recent.is_empty() =>
        {
            *txn = recent[rng.usize(0..recent.len())];
        }
        _ => return body,
    }
    body_of(&request)
}

/// Which of `shards` owns the first item of a decoded `TxnPrepare` of the
/// attack table, if it is one.
fn owner_shard(
    body: &[u8],
    attack: &insitu_protocol::TableInfo,
    shards: &[String],
) -> Option<usize> {
    let Ok(Request::TxnPrepare { items, .. }) = decode_request(body) else {
        return None;
    };
    let item = items.first().filter(|i| i.table == attack.id)?;
    let hash = insitu_keyhash::key_hash(attack.id, &item.key[..]);
    let tablet = attack
        .tablets
        .iter()
        .find(|t| t.start_hash <= hash && hash <= t.end_hash)?;
    shards.iter().position(|a| *a == tablet.addr)
}

/// A connection to one port, reconnected after the server closes it (which
/// it may do after a malformed frame).
struct Conn {
    addr: String,
    stream: Option<TcpStream>,
}

/// What became of one mutant.
#[derive(Debug, PartialEq)]
enum Outcome {
    Answered(insitu_protocol::Status),
    Closed,
}

impl Conn {
    fn new(addr: String) -> Conn {
        Conn { addr, stream: None }
    }

    /// Send `body` as one request frame; its answer, or `Closed` if the
    /// server closed the connection instead. Panics if neither comes within
    /// `ANSWER_TIMEOUT` (a stalled shard), naming `what`.
    async fn send(&mut self, body: &[u8], what: &str) -> Outcome {
        if self.stream.is_none() {
            self.stream = Some(TcpStream::connect(&self.addr).await.unwrap());
        }
        let stream = self.stream.as_mut().unwrap();
        let mut frame = insitu_testkit::raw::request_header(body.len());
        frame.extend_from_slice(body);
        let exchange = async {
            stream.write_all(&frame).await?;
            let mut header = [0u8; HEADER_BYTES];
            stream.read_exact(&mut header).await?;
            let (h, len) = check_header(&header, insitu_protocol::MAX_BODY_BYTES)
                .expect("the server's reply has a valid header")
                .expect("a whole header");
            let mut body = vec![0u8; len];
            stream.read_exact(&mut body).await?;
            Ok::<_, std::io::Error>(h.status)
        };
        match tokio::time::timeout(ANSWER_TIMEOUT, exchange).await {
            Ok(Ok(status)) => Outcome::Answered(status),
            Ok(Err(_)) => {
                self.stream = None;
                Outcome::Closed
            }
            Err(_) => panic!(
                "{what}: no answer within {ANSWER_TIMEOUT:?} from {}",
                self.addr
            ),
        }
    }
}

/// After the first part (data requests only, the tablets as set up), no
/// key of the attack table stays locked: every prepare a mutant left behind
/// is resolved once overdue (2 s), whatever its anchors name. Checked by a
/// plain write of every key the seeds or the setup name, through a client
/// that retries a locked key (`Retry`) for up to 15 s.
async fn no_lock_left(node: &common::Node, table: u64) {
    let client = common::txn::client_with_op_timeout(node, Duration::from_secs(15)).await;
    let started = std::time::Instant::now();
    let keys = (0..100)
        .map(|i| format!("a{i}"))
        .chain(["b1", "n", "zz"].map(String::from));
    for key in keys {
        if let Err(e) = client.write(table, key.as_bytes(), b"after").await {
            panic!("key {key:?} of the attack table after the first part: {e}");
        }
    }
    eprintln!(
        "mutated requests: every attack key writable again {:?} after the first part",
        started.elapsed()
    );
}

/// Every port answers a `Ping` on a fresh connection.
async fn all_answer(ports: &[String], after: &str) {
    let ping = body_of(&Request::Ping);
    for addr in ports {
        let outcome = Conn::new(addr.clone())
            .send(&ping, &format!("Ping after {after}"))
            .await;
        assert_eq!(
            outcome,
            Outcome::Answered(insitu_protocol::Status::Ok),
            "{addr} after {after}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_requests_leave_the_server_up_and_other_data_intact() {
    common::trace_to_test_output();
    let node = common::start(|c| c.shards = 2).await;
    let client = Client::connect(&node.addr()).await.unwrap();
    let canary = client.create_table("canary", 2).await.unwrap();
    let attack = client.create_table("attack", 4).await.unwrap();
    let schema =
        insitu_rows::text::parse_schema("id int64, name utf8, score float64", "id").unwrap();
    let typed = client
        .create_table_with("rows", 1, Some(schema.clone()))
        .await
        .unwrap();
    for i in 0..CANARY_KEYS {
        client
            .write(
                canary.id,
                format!("c{i}").as_bytes(),
                format!("v{i}").as_bytes(),
            )
            .await
            .unwrap();
    }
    for i in 0..100 {
        let key = format!("a{i}");
        client
            .write(attack.id, key.as_bytes(), &(i as i64).to_le_bytes())
            .await
            .unwrap();
    }
    let rows: Vec<Vec<Scalar>> = (0..100)
        .map(|i| {
            vec![
                Scalar::Int(i),
                Scalar::Str(format!("g{}", i % 7)),
                Scalar::Float(i as f64 / 100.0),
            ]
        })
        .collect();
    for r in client.put_rows(typed.id, &rows).await.unwrap() {
        r.unwrap();
    }

    let backup_addr = node.server.backup_addr.to_string();
    let seeds = seeds(
        &attack,
        &typed,
        &schema,
        node.server.cluster_id,
        &backup_addr,
        node.server.server_id,
    );
    let shard_addrs: Vec<String> = (0..2).map(|i| node.shard(i)).collect();
    let shard0 = insitu_client::RpcConn::connect(&shard_addrs[0])
        .await
        .unwrap();
    let taken = shard0.call(&receiving(attack.id)).await.unwrap();
    assert_eq!(
        taken.status,
        insitu_protocol::Status::Ok,
        "{}",
        taken.error_message()
    );
    let mut ports: Vec<String> = shard_addrs.clone();
    ports.push(backup_addr.clone());
    // What an `Enlist` mutant may not claim: the real server's addresses.
    let real_addrs = ports.clone();
    ports.push(node.addr());

    let count: usize = insitu_testkit::env_or("INSITU_MUTANTS", 6_000);
    let seed: u64 = insitu_testkit::env_or("INSITU_MUTANT_SEED", 0x0005_EED0_FBAD);
    eprintln!("mutated requests: {count} mutants, seed {seed} (INSITU_MUTANT_SEED)");
    let mut rng = insitu_testkit::rng(seed);
    let mut shard_conns: Vec<Conn> = shard_addrs.iter().cloned().map(Conn::new).collect();
    let mut backup_conn = Conn::new(backup_addr.clone());
    let mut coordinator_conn = Conn::new(node.addr());
    let (mut answered, mut closed, mut undecodable, mut skipped) = (0, 0, 0, 0);
    // Per decoded kind: (answered Ok, answered with an error), to see how
    // deep the mutants went.
    let mut by_kind: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    let data_seeds: Vec<&Seed> = seeds.iter().filter(|s| !s.control).collect();
    let all_seeds: Vec<&Seed> = seeds.iter().collect();
    let first_part = count * 3 / 5;
    let mut recent_txns: Vec<u64> = Vec::new();
    for n in 0..count {
        if n == first_part {
            no_lock_left(&node, attack.id).await;
        }
        let pool = if n < first_part {
            &data_seeds
        } else {
            &all_seeds
        };
        let base = pool[rng.usize(0..pool.len())];
        let other = pool[rng.usize(0..pool.len())];
        let body = mutate(&mut rng, &base.body, &other.body);
        let body = retarget_txn(&mut rng, body, &mut recent_txns);
        let decoded = decode_request(&body).ok().map(|r| r.name());
        let port = match decode_request(&body) {
            Ok(request) => {
                if tables_named(&request).contains(&canary.id)
                    || spares_nothing(&request, "canary", node.server.server_id, &real_addrs)
                    || (n < first_part && is_control(&request))
                {
                    skipped += 1;
                    continue;
                }
                Port::of(&request)
            }
            Err(_) => {
                undecodable += 1;
                base.port
            }
        };
        let what = format!("mutant {n} (seed {seed}): {body:?}");
        let conn = match port {
            Port::Shard => {
                // Mostly to the shard that owns the request's first named
                // key (when the test knows it), so that it is served rather
                // than refused as not here.
                let i = match owner_shard(&body, &attack, &shard_addrs) {
                    Some(i) if rng.u8(0..4) != 0 => i,
                    _ => rng.usize(0..shard_conns.len()),
                };
                &mut shard_conns[i]
            }
            Port::Backup => &mut backup_conn,
            Port::Coordinator => &mut coordinator_conn,
        };
        let started = std::time::Instant::now();
        let outcome = conn.send(&body, &what).await;
        let took = started.elapsed();
        if took > Duration::from_millis(500) {
            eprintln!(
                "slow mutant {n}: {} took {took:?}: {outcome:?}",
                decoded.unwrap_or("(undecodable)")
            );
        }
        match outcome {
            Outcome::Answered(status) => {
                answered += 1;
                if let Some(name) = decoded {
                    let tally = by_kind.entry(name).or_default();
                    if status == insitu_protocol::Status::Ok {
                        tally.0 += 1;
                    } else {
                        tally.1 += 1;
                    }
                }
            }
            Outcome::Closed => closed += 1,
        }
        if n % 250 == 249 {
            all_answer(&ports, &what).await;
        }
    }
    eprintln!(
        "mutated requests: {answered} answered, {closed} closed the connection, \
         {undecodable} did not decode, {skipped} not sent (naming the canary table, or control requests in the first part)"
    );
    eprintln!("decoded mutants by kind (answered Ok / refused): {by_kind:?}");
    all_answer(&ports, "the last mutant").await;
    assert!(
        answered > count / 4,
        "most mutants should reach a handler and be answered: {answered} of {count}"
    );

    let started = std::time::Instant::now();
    // The canary table, which no mutant named, holds every object, through
    // a fresh client (a fresh table map).
    let fresh = Client::connect(&node.addr()).await.unwrap();
    let canary = fresh.open_table("canary").await.unwrap();
    for i in 0..CANARY_KEYS {
        let got = fresh
            .read(canary.id, format!("c{i}").as_bytes())
            .await
            .unwrap();
        assert_eq!(
            got.map(|(v, _)| v.to_vec()),
            Some(format!("v{i}").into_bytes()),
            "canary key c{i}"
        );
    }
    eprintln!(
        "mutated requests: the canary read back in {:?}",
        started.elapsed()
    );
}
