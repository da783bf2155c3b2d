//! A committed part with no log room held for it (as a part a recovery
//! took back on a shard without room has none) is not applied into a full
//! budget, where its writes would be refused and lost while the transaction
//! counts as committed: it stays prepared, its keys locked, and is applied
//! once room is made (`txn_room::room_for_commit`, the sweep).
//!
//! Alone in its test binary: the fault is armed by an environment variable
//! the server reads once per process (`faults.rs`).

mod common;

use common::txn::{decide, fill, participants, prepare, side_records, small_budget};
use common::{key_in, tablet_of};

use std::time::{Duration, Instant};

use insitu_client::Status;
use insitu_protocol::txn::{TxnItem, TxnWrite};
use insitu_protocol::{Request, blob};

/// The transaction the fault is armed for.
const TXN: u64 = 0xf012;

#[tokio::test]
async fn a_commit_without_room_waits_for_room_instead_of_losing_its_writes() {
    // SAFETY: set before any server thread starts (the first thing the
    // only test of this binary does).
    unsafe { std::env::set_var("INSITU_FAULT_AT", format!("prepare-no-promise:{TXN:x}")) };
    common::trace_to_test_output();
    let (node, client) = small_budget().await;
    let info = client.create_table("noroom", 4).await.unwrap();
    let t = info.id;
    let ((k1, s1), (k2, s2)) = participants(&info).await;
    // The first participant also writes a key of its shard's other tablet:
    // two parts there, its vote part and one whose commit record is removed
    // once durable (which needs the parts' records still listed when the
    // commit is finally applied).
    let addr_of = |key: &str| info.tablets[tablet_of(&info, key)].addr.clone();
    let (a1, a2) = (addr_of(&k1), addr_of(&k2));
    let other = (0..info.tablets.len())
        .find(|&i| info.tablets[i].addr == a1 && i != tablet_of(&info, &k1))
        .expect("two tablets on the first participant's shard");
    let k1b = key_in(&info, other, "b");
    let (v1, v2) = ("1".repeat(3000), "2".repeat(3000));
    let mut first = prepare(TXN, None, &[&k2], t, &k1, &v1);
    let Request::TxnPrepare { items, .. } = &mut first else {
        unreachable!("a prepare")
    };
    items.push(TxnItem {
        table: t,
        key: blob(k1b.as_bytes()),
        read_version: None,
        write: TxnWrite::Put(blob(v1.as_bytes())),
    });
    for (conn, request) in [
        (&s1, first),
        (&s2, prepare(TXN, Some(&k1), &[], t, &k2, &v2)),
    ] {
        let r = conn.call(&request).await.unwrap();
        assert_eq!(r.status, Status::Ok, "{}", r.error_message());
    }
    // The prepares hold no room (the fault); the budget fills.
    let filler = fill(&client, t, "fill", &[4000, 1000]).await;
    assert!(filler.len() > 100, "only {} keys", filler.len());
    let late = client.write(t, "late00000000", &v1).await.unwrap_err();
    assert_eq!(late.status(), Some(Status::OutOfMemory), "{late}");
    // The commit is decided (it stands), but not applied into no room.
    assert!(decide(&s1, TXN, true).await);
    assert!(decide(&s2, TXN, true).await);
    for key in [&k1, &k1b, &k2] {
        assert_eq!(
            client.read(t, key).await.unwrap(),
            None,
            "{key}: not applied yet"
        );
    }
    // Room is made; the sweep applies the commit (its first try comes
    // PREPARED_TIMEOUT, 2 s, after the prepare).
    for key in &filler[..filler.len() / 2] {
        client.remove(t, key).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for (key, want) in [(&k1, &v1), (&k1b, &v1), (&k2, &v2)] {
        loop {
            let got = client.read(t, key).await.unwrap().map(|(v, _)| v);
            if got.as_deref() == Some(want.as_bytes()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{key}: the committed write was not applied once room was made (reads {:?})",
                got.map(|v| v.len())
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Each participant keeps one commit record (beside its vote part); the
    // first one's other part's record goes once durable. Had the commit's
    // first try, refused for room, forgotten where the parts' records were,
    // the later one would have written no commit records: both prepared
    // records would stay on the first shard for good.
    loop {
        let (on_1, on_2) = (
            side_records(&client, &a1, t).await,
            side_records(&client, &a2, t).await,
        );
        if (on_1, on_2) == (1, 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "side records after the commit: {on_1} on the shard of two parts, {on_2} on the \
             other; want 1 each"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The locks went with the application: the keys take plain writes.
    client.write(t, &k1, b"after").await.unwrap();
    client.write(t, &k1b, b"after").await.unwrap();
    drop(node);
}
