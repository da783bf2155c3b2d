//! The client against fake servers that speak the real protocol: routing,
//! point operations, multi-op batching and splitting, per-object statuses,
//! truncated replies, enumeration, administration and the blocking wrapper
//! (faults and retries are in `fake_faults.rs`).

mod common;
mod fake;

use std::collections::HashSet;

use common::*;
use fake::FakeCluster;
use insitu_client::{
    BlockingClient, Client, ClientConfig, ClientError, MAX_ITEMS_PER_REQUEST, Status,
};
use insitu_keyhash::key_hash;
use insitu_protocol::MAX_BODY_BYTES;

#[tokio::test]
async fn each_key_lands_on_the_shard_owning_its_hash() {
    let (cluster, client, t) = setup().await;
    for i in 0..200 {
        let v = client.write(t, key(i), value(i)).await.unwrap();
        assert!(v > 0);
    }
    let mut per_shard = [0usize; 2];
    for i in 0..200 {
        let (tablet, info) = cluster.tablet_of(t, key_hash(t, &key(i)));
        let owner = cluster
            .shards
            .iter()
            .position(|s| s.addr == info.addr)
            .unwrap();
        assert_eq!(
            cluster.holder(t, &key(i)),
            Some(owner),
            "key {i} in tablet {tablet}"
        );
        per_shard[owner] += 1;
        let (got, _) = client.read(t, key(i)).await.unwrap().expect("present");
        assert_eq!(&got[..], &value(i)[..]);
    }
    assert!(
        per_shard[0] > 40 && per_shard[1] > 40,
        "both shards used: {per_shard:?}"
    );
    for s in &cluster.shards {
        assert!(
            s.st().log.iter().all(|l| l.status == Status::Ok),
            "a routed request was refused: {:?}",
            s.st().log
        );
    }
    // Routing used the cached map: one CreateTable, no refreshes.
    assert_eq!(cluster.co().count("TableMap"), 0);
}

#[tokio::test]
async fn point_ops_statuses_and_messages() {
    let (_cluster, client, t) = setup().await;
    assert_eq!(client.read(t, b"missing").await.unwrap(), None);
    let v1 = client.write(t, b"k", b"one").await.unwrap();

    let e = client
        .write_with(t, b"k", b"two", if_exists())
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::ObjectExists), "{e}");
    assert!(
        e.to_string().contains(&format!("version {v1}")),
        "server message kept: {e}"
    );

    let e = client
        .write_with(t, b"k", b"two", unless_version(v1 + 100))
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::Status(Status::WrongVersion, _)),
        "{e}"
    );
    let v2 = client
        .write_with(t, b"k", b"two", unless_version(v1))
        .await
        .unwrap();
    assert!(v2 > v1);
    assert_eq!(
        client.read(t, b"k").await.unwrap(),
        Some((bytes::Bytes::from_static(b"two"), v2))
    );

    assert_eq!(client.remove(t, b"k").await.unwrap(), Some(v2));
    assert_eq!(client.remove(t, b"k").await.unwrap(), None);
    let e = client.remove_with(t, b"k", if_missing()).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::ObjectDoesntExist));

    assert_eq!(client.increment_i64(t, b"n", 5).await.unwrap().0, 5);
    assert_eq!(client.increment_i64(t, b"n", -7).await.unwrap().0, -2);
    assert_eq!(client.increment_f64(t, b"f", 1.5).await.unwrap().0, 1.5);
    client.write(t, b"s", b"abc").await.unwrap();
    let e = client.increment_i64(t, b"s", 1).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::NotANumber));

    // A table id nobody knows: the shards refuse, the coordinator says so.
    let e = client.read(9999, b"k").await.unwrap_err();
    assert_eq!(e.status(), Some(Status::UnknownTable), "{e}");
}

#[tokio::test]
async fn multi_read_keeps_order_and_missing_keys_are_none() {
    let (cluster, client, t) = setup().await;
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..300)
        .filter(|i| i % 3 != 0)
        .map(|i| (key(i), value(i)))
        .collect();
    for r in client.multi_write(t, &items).await.unwrap() {
        r.unwrap();
    }
    // One MultiWrite per shard.
    assert_eq!(cluster.counts("MultiWrite"), vec![1, 1]);

    let keys: Vec<Vec<u8>> = (0..300).rev().map(key).collect();
    let got = client.multi_read(t, &keys).await.unwrap();
    assert_eq!(got.len(), 300);
    for (k, r) in keys.iter().zip(&got) {
        let i = key_index(k);
        let r = r.as_ref().unwrap();
        if i.is_multiple_of(3) {
            assert!(r.is_none(), "key {i} was never written");
        } else {
            assert_eq!(
                &r.as_ref().expect("written").0[..],
                &value(i)[..],
                "key {i}"
            );
        }
    }
    assert_eq!(cluster.counts("MultiRead"), vec![1, 1]);

    let removed = client.multi_remove(t, &keys[..30]).await.unwrap();
    for (k, r) in keys[..30].iter().zip(removed) {
        let i = key_index(k);
        assert_eq!(r.unwrap().is_some(), !i.is_multiple_of(3), "key {i}");
    }
    assert!(
        client
            .multi_read(t, &keys[..30])
            .await
            .unwrap()
            .iter()
            .all(|r| matches!(r, Ok(None)))
    );
    assert!(
        client
            .multi_read::<Vec<u8>>(t, &[])
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn multi_write_larger_than_a_frame_is_split() {
    let (cluster, client, t) = setup().await;
    // 24 values of 512 KiB: 12 MiB in all, about 6 MiB per shard.
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..24)
        .map(|i| (key(i), vec![i as u8; 512 * 1024]))
        .collect();
    let results = client.multi_write(t, &items).await.unwrap();
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    let mut total_items = 0;
    for s in &cluster.shards {
        let st = s.st();
        let writes: Vec<_> = st.log.iter().filter(|l| l.op == "MultiWrite").collect();
        assert!(
            writes.len() >= 2,
            "a shard's ~6 MiB went in several requests: {writes:?}"
        );
        for w in &writes {
            assert!(w.body_len <= MAX_BODY_BYTES, "{w:?}");
        }
        total_items += writes.iter().map(|w| w.items).sum::<usize>();
    }
    assert_eq!(total_items, 24, "each item sent exactly once");
    for (k, v) in &items {
        let holder = cluster.holder(t, k).expect("landed");
        assert_eq!(&cluster.shards[holder].st().data[&(t, k.clone())].value, v);
    }

    // Many small items: split at the item limit.
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..25_000).map(|i| (key(i), b"x".to_vec())).collect();
    let before: Vec<usize> = cluster.counts("MultiWrite");
    let results = client.multi_write(t, &items).await.unwrap();
    assert!(results.iter().all(|r| r.is_ok()));
    let mut sent = 0;
    for (s, b) in cluster.shards.iter().zip(before) {
        let st = s.st();
        let writes: Vec<_> = st
            .log
            .iter()
            .filter(|l| l.op == "MultiWrite")
            .skip(b)
            .collect();
        assert!(
            writes.len() >= 2,
            "~12,500 items per shard need 2 requests: {writes:?}"
        );
        assert!(
            writes.iter().all(|w| w.items <= MAX_ITEMS_PER_REQUEST),
            "{writes:?}"
        );
        sent += writes.iter().map(|w| w.items).sum::<usize>();
    }
    assert_eq!(sent, 25_000);
    let keys: Vec<Vec<u8>> = (0..25_000).map(key).collect();
    let got = client.multi_read(t, &keys).await.unwrap();
    assert!(
        got.iter()
            .all(|r| matches!(r, Ok(Some((v, _))) if &v[..] == b"x"))
    );
}

#[tokio::test]
async fn truncated_keys_are_asked_again() {
    let (cluster, client, t) = setup().await;
    write_numbered(&client, t, 200).await;
    for s in &cluster.shards {
        s.st().truncate_half = true;
    }
    let keys: Vec<Vec<u8>> = (0..200).map(key).collect();
    let got = client.multi_read(t, &keys).await.unwrap();
    assert_numbered(&got);
    for s in &cluster.shards {
        let st = s.st();
        let asked: Vec<usize> = st
            .log
            .iter()
            .filter(|l| l.op == "MultiRead")
            .map(|l| l.items)
            .collect();
        assert!(asked.len() > 2, "several rounds: {asked:?}");
        for w in asked.windows(2) {
            assert_eq!(
                w[1],
                w[0] / 2,
                "only the truncated half is asked again: {asked:?}"
            );
        }
        assert_eq!(*asked.last().unwrap(), 1);
    }
}

#[tokio::test]
async fn enumerate_walks_every_tablet_in_batches() {
    let config = ClientConfig {
        enumerate_batch_bytes: 64,
        ..ClientConfig::default()
    };
    let (cluster, client, t) = setup_with(config).await;
    write_numbered(&client, t, 500).await;
    for s in &cluster.shards {
        s.st().enumerate_max_objects = 37;
    }
    let mut cursor = client.enumerate(t);
    let mut seen = HashSet::new();
    let mut last_hash = None;
    let mut batches = 0;
    while let Some(batch) = cursor.next_batch().await.unwrap() {
        batches += 1;
        assert!(!batch.is_empty());
        if batches == 1 {
            // Tablet 1 (not walked yet) moves under the cursor.
            cluster.move_tablet(t, 1, 1);
        }
        for (k, v, version) in batch {
            let h = key_hash(t, &k);
            assert!(last_hash < Some(h), "hash order");
            last_hash = Some(h);
            let i = key_index(&k);
            assert_eq!(&v[..], &value(i)[..]);
            assert!(version > 0);
            assert!(seen.insert(k), "no duplicates");
        }
    }
    assert!(cursor.is_done());
    assert_eq!(seen.len(), 500);
    assert!(batches >= 500 / 37, "{batches} batches");

    let e = client.cursor(9999).await.err().expect("unknown table");
    assert_eq!(e.status(), Some(Status::UnknownTable), "{e}");
    let mut c = client.cursor(t).await.unwrap();
    assert!(c.next_batch().await.unwrap().is_some());

    assert_eq!(client.scan(t, 10).await.unwrap().len(), 10);
    assert_eq!(client.scan(t, 10_000).await.unwrap().len(), 500);
}

#[tokio::test]
async fn table_and_server_management() {
    let cluster = FakeCluster::start(2).await;
    let client = Client::connect(&cluster.coord_addr).await.unwrap();
    let a = client.create_table("a", 4).await.unwrap();
    let e = client.create_table("a", 4).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::TableExists), "{e}");
    client.create_table("b", 1).await.unwrap();
    let names: Vec<String> = client
        .list_tables()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, vec!["a", "b"]);

    // Another client finds the table by name.
    let other = Client::connect(&cluster.coord_addr).await.unwrap();
    assert_eq!(other.open_table("a").await.unwrap(), a);
    assert_eq!(other.table_id("a").await.unwrap(), a.id);
    let e = other.open_table("nope").await.unwrap_err();
    assert!(
        matches!(&e, ClientError::Status(Status::UnknownTable, m) if m.contains("nope")),
        "{e}"
    );

    let servers = client.list_servers().await.unwrap();
    assert_eq!(servers.len(), 2);
    for i in 0..40 {
        client.write(a.id, key(i), value(i)).await.unwrap();
    }
    client.move_tablet("a", 0, 2).await.unwrap();
    client.move_tablet("a", 2, 2).await.unwrap();
    for i in 0..40 {
        assert_eq!(
            &other.read(a.id, key(i)).await.unwrap().unwrap().0[..],
            &value(i)[..]
        );
        assert_eq!(
            &client.read(a.id, key(i)).await.unwrap().unwrap().0[..],
            &value(i)[..]
        );
    }
    let stats = client.shard_stats(&cluster.shards[1].addr).await.unwrap();
    let on_shard1: u64 = stats
        .tablets
        .iter()
        .filter(|s| s.table == a.id)
        .map(|s| s.objects)
        .sum();
    assert_eq!(
        stats.tablets.iter().filter(|s| s.table == a.id).count(),
        4,
        "all four tablets of a on shard 1"
    );
    assert_eq!(on_shard1, 40);

    client.drop_table("a").await.unwrap();
    let e = other.read(a.id, key(1)).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::UnknownTable), "{e}");
    let e = client.drop_table("a").await.unwrap_err();
    assert_eq!(e.status(), Some(Status::UnknownTable), "{e}");
}

#[test]
fn blocking_client_works_without_a_runtime() {
    // The fake servers run on their own runtime in another thread.
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let servers = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let cluster = FakeCluster::start(2).await;
            tx.send(cluster.coord_addr.clone()).unwrap();
            let _ = stop_rx.await;
            drop(cluster);
        });
    });
    let addr = rx.recv().unwrap();
    let client = BlockingClient::connect(&addr).unwrap();
    let t = client.create_table("t", 2).unwrap().id;
    assert_eq!(client.table_id("t").unwrap(), t);
    let v = client.write(t, b"a", b"1").unwrap();
    assert_eq!(
        client.read(t, b"a").unwrap(),
        Some((bytes::Bytes::from_static(b"1"), v))
    );
    assert_eq!(client.read(t, b"zz").unwrap(), None);
    assert_eq!(client.increment_i64(t, b"n", 3).unwrap().0, 3);
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..100).map(|i| (key(i), value(i))).collect();
    assert!(
        client
            .multi_write(t, &items)
            .unwrap()
            .iter()
            .all(|r| r.is_ok())
    );
    let keys: Vec<Vec<u8>> = (0..100).map(key).collect();
    assert!(
        client
            .multi_read(t, &keys)
            .unwrap()
            .iter()
            .all(|r| matches!(r, Ok(Some(_))))
    );
    let mut cursor = client.cursor(t).unwrap();
    let mut n = 0;
    while let Some(batch) = cursor.next_batch().unwrap() {
        n += batch.len();
    }
    assert_eq!(n, 102);
    assert_eq!(client.scan(t, 5).unwrap().len(), 5);
    assert_eq!(
        client
            .multi_remove(t, &keys)
            .unwrap()
            .iter()
            .filter(|r| matches!(r, Ok(Some(_))))
            .count(),
        100
    );
    assert_eq!(client.remove(t, b"a").unwrap(), Some(v));
    let clone = client.clone();
    std::thread::spawn(move || clone.read(t, b"n").unwrap())
        .join()
        .unwrap()
        .expect("n exists");
    drop(client);
    stop_tx.send(()).unwrap();
    servers.join().unwrap();
}
