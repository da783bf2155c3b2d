//! A commit told to every participant at once (`TxnDecide { direct }`): a
//! participant applies the client's own commit without the primary having
//! decided; a primary deciding the orphan adopts the commit a participant
//! took, at its timestamp, instead of deciding again; and a participant the
//! primary has asked refuses the client's direct commit and takes the
//! primary's answer instead (ARCHITECTURE.md, "Transactions").

use crate::common;

use common::txn::{participants, prepare, retrying_client};

use std::time::{Duration, Instant};

use insitu_client::{Client, RpcConn, Status};
use insitu_protocol::txn::{TxnAnchor, TxnPhase};
use insitu_protocol::{Request, Response, blob};

/// Send `txn`'s decision; the status, and the decision that stands with
/// its timestamp when the status is Ok.
async fn decide(
    conn: &RpcConn,
    txn: u64,
    (commit, commit_ts): (bool, u64),
    direct: bool,
) -> (Status, Option<(bool, u64)>) {
    let r = conn
        .call(&Request::TxnDecide {
            txn,
            commit,
            commit_ts,
            direct,
        })
        .await
        .unwrap();
    if r.status != Status::Ok {
        return (r.status, None);
    }
    match r.decode().unwrap() {
        Response::TxnDecided {
            committed,
            commit_ts,
        } => (r.status, Some((committed, commit_ts))),
        other => panic!("{other:?} to TxnDecide"),
    }
}

/// Where the participant anchored at `key` stands on `txn`.
async fn inquire(conn: &RpcConn, txn: u64, table: u64, key: &str) -> TxnPhase {
    ask(conn, txn, table, key, false).await.unwrap()
}

/// `TxnInquire` about the participant (or with `part`, the part recorded)
/// at `key`: its answer, or the refusal's status.
async fn ask(
    conn: &RpcConn,
    txn: u64,
    table: u64,
    key: &str,
    part: bool,
) -> Result<TxnPhase, Status> {
    let r = conn
        .call(&Request::TxnInquire {
            txn,
            anchor: TxnAnchor {
                table,
                key: blob(key.as_bytes()),
            },
            part,
        })
        .await
        .unwrap();
    if r.status != Status::Ok {
        return Err(r.status);
    }
    match r.decode().unwrap() {
        Response::TxnPhase(p) => Ok(p),
        other => panic!("{other:?} to TxnInquire"),
    }
}

async fn read(client: &Client, table: u64, key: &str) -> Option<String> {
    client
        .read(table, key)
        .await
        .unwrap()
        .map(|(v, _)| String::from_utf8_lossy(&v).into_owned())
}

/// Prepare `txn` on both participants (k1's shard the primary): both yes.
async fn prepare_both(t: u64, (k1, s1): (&str, &RpcConn), (k2, s2): (&str, &RpcConn), txn: u64) {
    for (conn, request) in [
        (s1, prepare(txn, None, &[k2], t, k1, "v1")),
        (s2, prepare(txn, Some(k1), &[], t, k2, "v2")),
    ] {
        let r = conn.call(&request).await.unwrap();
        assert_eq!(r.status, Status::Ok, "{}", r.error_message());
        assert!(matches!(r.decode().unwrap(), Response::TxnPrepared { .. }));
    }
}

#[tokio::test]
async fn a_primary_adopts_the_commit_a_participant_took_from_the_client() {
    let (node, client) = retrying_client(2).await;
    let info = client.create_table("direct", 4).await.unwrap();
    let t = info.id;
    let ((k1, s1), (k2, s2)) = participants(&info).await;
    let txn = 0xd1ec7;
    prepare_both(t, (&k1, &s1), (&k2, &s2), txn).await;
    // The client tells the secondary alone (it died before the primary):
    // the secondary applies the commit at the client's timestamp.
    let ts = 4242;
    assert_eq!(
        decide(&s2, txn, (true, ts), true).await,
        (Status::Ok, Some((true, ts)))
    );
    assert_eq!(read(&client, t, &k2).await.as_deref(), Some("v2"));
    assert_eq!(
        inquire(&s2, txn, t, &k2).await,
        TxnPhase::Committed { commit_ts: ts }
    );
    // The primary, left prepared, resolves after its 2 s timeout: it asks
    // the secondary, hears the commit, and commits at the same timestamp
    // (not one of its own from the oracle).
    let deadline = Instant::now() + Duration::from_secs(15);
    while read(&client, t, &k1).await.as_deref() != Some("v1") {
        assert!(Instant::now() < deadline, "the primary never committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        decide(&s1, txn, (false, 0), false).await,
        (Status::Ok, Some((true, ts))),
        "the primary's decision stands: the commit, at the participant's timestamp"
    );
    drop(node);
}

#[tokio::test]
async fn a_participant_the_primary_asked_takes_the_primarys_decision() {
    let (node, client) = retrying_client(2).await;
    let info = client.create_table("asked", 4).await.unwrap();
    let t = info.id;
    let ((k1, s1), (k2, s2)) = participants(&info).await;
    let txn = 0xa5ced;
    prepare_both(t, (&k1, &s1), (&k2, &s2), txn).await;
    // A primary deciding the orphan asked the secondary where it stands.
    assert_eq!(inquire(&s2, txn, t, &k2).await, TxnPhase::Prepared);
    // From then on the client's direct commit is refused there: the primary
    // may be committing at a timestamp of its own.
    let (status, _) = decide(&s2, txn, (true, 7), true).await;
    assert_eq!(status, Status::Retry);
    assert_eq!(read(&client, t, &k2).await, None, "nothing applied");
    // The primary takes the direct commit (it decides), and the secondary
    // takes the primary's answer relayed.
    let standing = decide(&s1, txn, (true, 7), true).await;
    assert_eq!(standing, (Status::Ok, Some((true, 7))));
    assert_eq!(
        decide(&s2, txn, (true, 7), false).await,
        (Status::Ok, Some((true, 7)))
    );
    assert_eq!(read(&client, t, &k1).await.as_deref(), Some("v1"));
    assert_eq!(read(&client, t, &k2).await.as_deref(), Some("v2"));
    // A direct commit resent after the decision is answered with it.
    assert_eq!(
        decide(&s2, txn, (true, 7), true).await,
        (Status::Ok, Some((true, 7)))
    );
    drop(node);
}

#[tokio::test]
async fn a_client_commits_with_every_participant_told_at_once() {
    // The client's own path: every vote yes, the decision to all at once;
    // the writes are visible on every shard when `commit` returns.
    let (node, client) = retrying_client(2).await;
    let info = client.create_table("at_once", 4).await.unwrap();
    let t = info.id;
    let ((k1, _), (k2, _)) = participants(&info).await;
    for round in 0..20 {
        let value = format!("r{round}");
        let mut tx = client.begin();
        tx.write(t, &k1, &value);
        tx.write(t, &k2, &value);
        tx.commit().await.unwrap();
        assert_eq!(read(&client, t, &k1).await, Some(value.clone()));
        assert_eq!(read(&client, t, &k2).await, Some(value));
    }
    drop(node);
}

#[tokio::test]
async fn a_part_question_answers_for_the_record_held_and_records_nothing() {
    // What a shard proving a recovered vote asks a sibling's owner: is the
    // record written at this key held here, or the transaction committed?
    let (node, client) = retrying_client(2).await;
    let info = client.create_table("parts", 4).await.unwrap();
    let t = info.id;
    let ((k1, s1), (k2, s2)) = participants(&info).await;
    let txn = 0x9a27;
    // Never seen: aborted, and nothing recorded (its prepare still counts).
    assert_eq!(ask(&s2, txn, t, &k2, true).await, Ok(TxnPhase::Aborted));
    prepare_both(t, (&k1, &s1), (&k2, &s2), txn).await;
    assert_eq!(ask(&s2, txn, t, &k2, true).await, Ok(TxnPhase::Prepared));
    // A key of a tablet the shard does not own: the asker refreshes its map.
    assert_eq!(
        ask(&s2, txn, t, &k1, true).await,
        Err(Status::UnknownTablet)
    );
    assert_eq!(
        decide(&s2, txn, (true, 99), true).await,
        (Status::Ok, Some((true, 99)))
    );
    assert_eq!(
        ask(&s2, txn, t, &k2, true).await,
        Ok(TxnPhase::Committed { commit_ts: 99 })
    );
    assert_eq!(
        decide(&s1, txn, (true, 99), true).await,
        (Status::Ok, Some((true, 99)))
    );
    drop(node);
}
