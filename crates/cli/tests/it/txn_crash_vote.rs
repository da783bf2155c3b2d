//! A participant's vote counts after a crash only if every record of it
//! survived (separate processes, R = 2, faults injected at named steps). A
//! secondary with parts in two tablets of its server writes every part's
//! record in one step, its vote record (at its anchor) naming the other as
//! its sibling. Each tablet is recovered from its own log, so a crash
//! before the vote left can keep the vote record and lose the sibling. The
//! first test makes that happen for certain: the sibling's record is not
//! written (`INSITU_FAULT_AT=prepare-lose-part-records`) and the server
//! dies once the vote record is durable (`prepare-after-records`). The
//! recovered vote record must not count as a yes vote: the primary, asking
//! it, finds no sibling (`txn_proof`), so the transaction aborts everywhere
//! and every lock goes. With the vote record taken as proof by itself
//! (tried) the primary commits: the keys end `new`, `new`, `old`.
//!
//! The second test is the other end of the commit: the client tells the
//! secondary the commit directly (every vote was yes) and nobody else, and
//! the secondary dies once it has applied it durably, before answering
//! (`decide-after-apply`). The recovered vote tablet has no vote record any
//! more, only the commit record kept beside it: the primary, deciding the
//! orphan, must learn the commit from it and commit everywhere. Without
//! that record the primary hears "never saw it", aborts, and the secondary's
//! keys keep a write the primary's never gets.
//!
//! The third is the same commit with the secondary's vote part lost and its
//! other part applied (`INSITU_FAULT_AT=decide-lose-vote-part` skips the
//! vote part's group): the recovered vote record must be proven
//! `Committed` by the commit record beside its sibling, and the commit
//! reaches every key. With a commit record beside vote parts alone (tried)
//! the sibling looks never written, the vote is no vote, and the primary
//! aborts: `old`, `old`, `new`.

use crate::common;

use std::time::{Duration, Instant};

use common::{Cluster, ok, rt};
use insitu_client::{Client, ClientConfig, RpcConn, Status};
use insitu_protocol::txn::{TxnAnchor, TxnItem, TxnWrite};
use insitu_protocol::{Request, Response, blob};

/// Failure detection, the recovery of two tablets, then the prepared
/// parts' 2 s timeout and their resolution: seconds; this bounds it.
const SETTLE: Duration = Duration::from_secs(90);

/// The transaction the crash is armed for.
const TXN: u64 = 0x0de1_7a11;

fn put<'a>(table: u64, key: &'a str, value: &'a str) -> TxnItem<'a> {
    TxnItem {
        table,
        key: blob(key.as_bytes()),
        read_version: None,
        write: TxnWrite::Put(blob(value.as_bytes())),
    }
}

fn anchor(table: u64, key: &str) -> TxnAnchor<'_> {
    TxnAnchor {
        table,
        key: blob(key.as_bytes()),
    }
}

/// Keys `x` on one server (the primary) and `y1`, `y2` in two tablets of
/// another server (the secondary, two parts: `y1`'s is its vote part),
/// each written "old", and a connection to each of the two servers.
struct Setup {
    cluster: Cluster,
    client: Client,
    t: u64,
    x: String,
    y1: String,
    y2: String,
    primary: RpcConn,
    secondary: RpcConn,
}

async fn setup(cluster: Cluster) -> Setup {
    ok(cluster.cli(&["table", "create", "votes", "--tablets", "6"]));
    let config = ClientConfig {
        op_timeout: SETTLE,
        ..ClientConfig::default()
    };
    let client = Client::connect_with(&cluster.addr(), config).await.unwrap();
    let info = client.open_table("votes").await.unwrap();
    let t = info.id;
    let tablet = |key: &str| common::tablet_of(&info, key);
    let keys: Vec<String> = (0..1000).map(|i| format!("k{i}")).collect();
    let addr = |key: &str| info.tablets[tablet(key)].addr.clone();
    let x = keys[0].clone();
    let (y1, y2) = keys
        .iter()
        .flat_map(|a| keys.iter().map(move |b| (a, b)))
        .find(|(a, b)| addr(a) != addr(&x) && addr(a) == addr(b) && tablet(a) != tablet(b))
        .map(|(a, b)| (a.clone(), b.clone()))
        .expect("two tablets of one server, not the primary's");
    for key in [&x, &y1, &y2] {
        client.write(t, key, "old").await.unwrap();
    }
    // Every server must know the others before the crash, or it keeps
    // its replicas on its own disk (a one-server cluster's rule), which
    // the crash takes with it: the server list is fetched every second.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let primary = RpcConn::connect(&addr(&x)).await.unwrap();
    let secondary = RpcConn::connect(&addr(&y1)).await.unwrap();
    Setup {
        cluster,
        client,
        t,
        x,
        y1,
        y2,
        primary,
        secondary,
    }
}

/// Three servers of one shard each, crashing at `point` for `TXN`, with
/// `fault` (if any) injected for it too.
fn armed(point: &str, fault: Option<&str>) -> Cluster {
    let mut cluster = Cluster::start(0, 1);
    cluster.server_env = vec![("INSITU_CRASH_AT".into(), format!("{point}:{TXN:x}"))];
    if let Some(fault) = fault {
        let armed = format!("{fault}:{TXN:x}");
        cluster.server_env.push(("INSITU_FAULT_AT".into(), armed));
    }
    for _ in 0..3 {
        cluster.add_server(1);
    }
    cluster
}

/// The primary's prepare of `x` (a yes vote).
async fn prepare_primary(s: &Setup) {
    let r = s
        .primary
        .call(&Request::TxnPrepare {
            txn: TXN,
            primary: None,
            others: vec![anchor(s.t, &s.y1)],
            items: vec![put(s.t, &s.x, "new")],
            writes: true,
        })
        .await
        .unwrap();
    assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    assert!(matches!(r.decode().unwrap(), Response::TxnPrepared { .. }));
}

/// The secondary's prepare of `y1` and `y2`.
async fn prepare_secondary(s: &Setup) -> Result<insitu_client::Reply, insitu_client::RpcError> {
    s.secondary
        .call(&Request::TxnPrepare {
            txn: TXN,
            primary: Some(anchor(s.t, &s.x)),
            others: vec![],
            items: vec![put(s.t, &s.y1, "new"), put(s.t, &s.y2, "new")],
            writes: true,
        })
        .await
}

/// Once no lock is left, read the three keys in one transaction (it
/// commits only then, and reads them at one point).
async fn read_all(s: &Setup) -> (Option<String>, Option<String>, Option<String>) {
    let (t, x, y1, y2) = (s.t, s.x.clone(), s.y1.clone(), s.y2.clone());
    let started = Instant::now();
    let values = s
        .client
        .transaction(|mut tx| {
            let (x, y1, y2) = (x.clone(), y1.clone(), y2.clone());
            async move {
                let read =
                    |v: Option<bytes::Bytes>| v.map(|b| String::from_utf8_lossy(&b).into_owned());
                let vx = read(tx.read(t, &x).await?);
                let v1 = read(tx.read(t, &y1).await?);
                let v2 = read(tx.read(t, &y2).await?);
                tx.write(t, "audit", "done");
                Ok((tx, (vx, v1, v2)))
            }
        })
        .await
        .unwrap();
    eprintln!("resolved in {:?}", started.elapsed());
    values
}

/// Every key ends `want` once the transaction is resolved, and no lock is
/// left on them: plain writes go through.
async fn every_key_ends(s: &Setup, want: &str, why: &str) {
    let want = Some(want.to_string());
    assert_eq!(
        read_all(s).await,
        (want.clone(), want.clone(), want),
        "{why}"
    );
    for key in [&s.x, &s.y1, &s.y2] {
        s.client.write(s.t, key, "after").await.unwrap();
    }
}

/// Both participants vote yes; the client tells the secondary alone the
/// commit directly (every vote was yes) and dies before telling the
/// primary; the secondary, armed to crash in its decision, never answers.
async fn told_the_secondary_alone(s: &Setup) {
    prepare_primary(s).await;
    let vote = prepare_secondary(s).await.unwrap();
    assert_eq!(vote.status, Status::Ok, "{}", vote.error_message());
    let told = s
        .secondary
        .call(&Request::TxnDecide {
            txn: TXN,
            commit: true,
            commit_ts: 0,
            direct: true,
        })
        .await;
    assert!(
        !matches!(&told, Ok(r) if r.status == Status::Ok),
        "the secondary answered although it was armed to crash first"
    );
}

#[test]
fn a_secondary_whose_vote_lost_a_sibling_record_aborts_everywhere() {
    let cluster = armed("prepare-after-records", Some("prepare-lose-part-records"));
    rt().block_on(async {
        let s = setup(cluster).await;
        prepare_primary(&s).await;
        // The secondary dies at the armed point: no vote comes back.
        let vote = prepare_secondary(&s).await;
        assert!(
            !matches!(&vote, Ok(r) if r.status == Status::Ok),
            "the secondary voted although it was armed to crash first"
        );
        // The client is gone too: nobody decides. The primary's part and
        // the recovered secondary part resolve on their own.
        let why = "the secondary's vote was not whole: the transaction must abort on every key";
        every_key_ends(&s, "old", why).await;
        drop(s.cluster);
    });
}

#[test]
fn a_secondary_dead_after_keeping_a_direct_commit_commits_everywhere() {
    let cluster = armed("decide-after-apply", None);
    rt().block_on(async {
        let s = setup(cluster).await;
        // The secondary applies the commit, keeping it beside its vote
        // record, and dies before answering.
        told_the_secondary_alone(&s).await;
        let why = "a participant applied the commit: it must commit on every key";
        every_key_ends(&s, "new", why).await;
        drop(s.cluster);
    });
}

#[test]
fn a_secondary_dead_with_only_its_other_part_applied_commits_everywhere() {
    let cluster = armed("decide-after-apply", Some("decide-lose-vote-part"));
    rt().block_on(async {
        let s = setup(cluster).await;
        // The secondary applies y2's part and not y1's (its vote part, as
        // if that group were lost), then dies. Its recovered vote record is
        // proven by y2's commit record: the transaction committed.
        told_the_secondary_alone(&s).await;
        let why = "a part of the commit was applied: it must commit on every key";
        every_key_ends(&s, "new", why).await;
        drop(s.cluster);
    });
}
