//! Key expiry on real servers: an expired object is absent at once to
//! reads, counts and walks; the shard's sweep removes it (the tablet's
//! object count drops); deadlines go with a tablet that moves; the Redis
//! port's TTLs hold across servers, in MULTI/EXEC and through RENAME.

use crate::common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::resp::{Line, cluster};
use insitu_client::{Client, Selection};
use insitu_protocol::RejectRules;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A `TTL` reply of a key set to expire in `set_secs`: at most that, and
/// less only by the seconds a loaded machine may take between the `SET` and
/// the `TTL` (Redis rounds the remaining time, so 999 after half a second).
fn assert_ttl(reply: &str, set_secs: i64, key: &str) {
    let secs: Option<i64> = reply
        .strip_prefix(':')
        .and_then(|r| r.trim_end().parse().ok());
    assert!(
        secs.is_some_and(|s| (set_secs - 10..=set_secs).contains(&s)),
        "TTL {key}: {reply:?}, set to {set_secs} s"
    );
}

/// Objects the shard at `shard` holds in `table`'s tablets (expired ones
/// included until the sweep removes them).
async fn held_objects(client: &Client, shard: &str, table: u64) -> u64 {
    common::tablet_sum(client, shard, table, |t| t.objects).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_objects_are_absent_at_once_and_the_sweep_removes_them() {
    let node = common::start(|_| {}).await;
    let shard = node.shard(0);
    let client = Client::connect(&node.addr()).await.unwrap();
    let info = client.create_table("ttl", 1).await.unwrap();
    let t = info.id;
    let rules = RejectRules::default();
    // Deadline far enough ahead that the writes (concurrent) finish first.
    let started = unix_ms();
    let deadline = started + 3_000;
    let writes = (0..500).map(|i| {
        let client = &client;
        async move {
            client
                .write_expiring(t, format!("short{i}"), b"v", deadline, rules)
                .await
        }
    });
    for r in futures::future::join_all(writes).await {
        r.unwrap();
    }
    for i in 0..50 {
        client.write(t, format!("kept{i}"), b"v").await.unwrap();
    }
    let later = unix_ms() + 3_600_000;
    client
        .write_expiring(t, b"later", b"v", later, rules)
        .await
        .unwrap();
    // A deadline already passed: written, and absent at once.
    client
        .write_expiring(t, b"past", b"v", 1, rules)
        .await
        .unwrap();
    assert!(client.read(t, b"past").await.unwrap().is_none());
    assert!(
        unix_ms() < deadline - 500,
        "the writes took {} ms: too slow to check before the deadline",
        unix_ms() - started
    );
    let (value, _, d) = client.read_expiring(t, b"short7").await.unwrap().unwrap();
    assert_eq!((&value[..], d), (&b"v"[..], deadline));
    assert_eq!(client.count(t, &Selection::all()).await.unwrap(), 551);

    tokio::time::sleep(Duration::from_millis(deadline + 50 - unix_ms())).await;
    assert!(client.read(t, b"short7").await.unwrap().is_none());
    assert_eq!(client.count(t, &Selection::all()).await.unwrap(), 51);
    let mut walked = 0;
    let mut walk = client.enumerate(t);
    while let Some(batch) = walk.next_batch().await.unwrap() {
        assert!(batch.iter().all(|(k, _, _)| !k.starts_with(b"short")));
        walked += batch.len();
    }
    assert_eq!(walked, 51);
    // Absent to a conditional write too: "must not exist" succeeds.
    let must_not_exist = RejectRules {
        exists: true,
        ..RejectRules::default()
    };
    client
        .write_with(t, b"short0", b"again", must_not_exist)
        .await
        .unwrap();

    // The sweep removes the 500 (and "past"): the tablet holds 52 objects
    // (kept, later, short0 again) within a few sweeps.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let held = held_objects(&client, &shard, t).await;
        if held == 52 {
            break;
        }
        assert!(Instant::now() < until, "the sweep left {held} objects");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, _, d) = client.read_expiring(t, b"later").await.unwrap().unwrap();
    assert_eq!(d, later, "a key not yet due is untouched");
    node.server.shutdown();
    node.coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_ttls_hold_across_servers_and_through_a_move() {
    let c = cluster(|_| {}).await;
    let (a, b) = (c.resp(), c.resp_of_second());
    let keys: Vec<String> = (0..40).map(|i| format!("key{i}")).collect();
    let setup = keys.clone();
    tokio::task::spawn_blocking(move || {
        // Through server A: about half the keys are A's, half forwarded to B.
        let mut la = Line::open(a);
        for k in &setup {
            assert_eq!(la.call(&format!("SET {k} v EX 1000")), "+OK\r\n");
        }
        assert_eq!(la.call("SET soon v PX 300"), "+OK\r\n");
        assert_eq!(la.call("EXPIREAT fixed 1"), ":0\r\n");
        assert_eq!(la.call("SET fixed v"), "+OK\r\n");
        assert_eq!(la.call("EXPIREAT fixed 4000000000"), ":1\r\n");
        // Read back through server B: every key's TTL, wherever it lives.
        let mut lb = Line::open(b);
        for k in &setup {
            assert_ttl(&lb.call(&format!("TTL {k}")), 1000, k);
        }
        assert_eq!(lb.call("EXPIRETIME fixed"), ":4000000000\r\n");
        // INCR keeps a TTL, SET clears it, PERSIST removes it.
        assert_eq!(lb.call("SET n 5 EX 1000"), "+OK\r\n");
        assert_eq!(lb.call("INCR n"), ":6\r\n");
        assert_ttl(&lb.call("TTL n"), 1000, "n");
        assert_eq!(lb.call("PERSIST n"), ":1\r\n");
        assert_eq!(lb.call("TTL n"), ":-1\r\n");
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(la.call("GET soon"), "$-1\r\n");
        assert_eq!(lb.call("EXISTS soon"), ":0\r\n");
        assert_eq!(lb.call("TTL soon"), ":-2\r\n");
        assert_eq!(lb.call("SET soon again NX"), "+OK\r\n");
        assert_eq!(lb.call("TTL soon"), ":-1\r\n");
        // Inside MULTI (an insitu transaction) deadlines are set and kept too.
        assert_eq!(la.call("SET m 1 EX 1000"), "+OK\r\n");
        assert_eq!(la.call("MULTI"), "+OK\r\n");
        assert_eq!(la.call("SET tx v EX 100"), "+QUEUED\r\n");
        assert_eq!(la.call("TTL tx"), "+QUEUED\r\n");
        assert_eq!(la.call("INCR m"), "+QUEUED\r\n");
        assert_eq!(la.call("RENAME m m2"), "+QUEUED\r\n");
        assert_eq!(la.call("SET plain v"), "+QUEUED\r\n");
        assert_eq!(la.call("EXEC"), "*5\r\n+OK\r\n:100\r\n:2\r\n+OK\r\n+OK\r\n");
        assert_ttl(&lb.call("TTL tx"), 100, "tx");
        assert_eq!(lb.call("GET m2"), "$1\r\n2\r\n");
        assert_ttl(&lb.call("TTL m2"), 1000, "m2");
        assert_eq!(lb.call("TTL plain"), ":-1\r\n");
        // RENAME keeps a TTL between keys of any two servers.
        for i in 0..8 {
            assert_eq!(la.call(&format!("SET r{i} v EX 1000")), "+OK\r\n");
            assert_eq!(la.call(&format!("RENAME r{i} s{i}")), "+OK\r\n");
            assert_ttl(&lb.call(&format!("TTL s{i}")), 1000, &format!("s{i}"));
            assert_eq!(lb.call(&format!("EXISTS r{i}")), ":0\r\n");
        }
    })
    .await
    .unwrap();

    // Move every tablet of the RESP table to the other server; the TTLs go along.
    let client = Client::connect(&c.node.addr()).await.unwrap();
    let table = client.open_table("redis").await.unwrap();
    for (i, tablet) in table.tablets.iter().enumerate() {
        let to = if tablet.server_id == c.node.server.server_id {
            c.second.server_id
        } else {
            c.node.server.server_id
        };
        client.move_tablet("redis", i as u32, to).await.unwrap();
    }
    let moved = client.open_table("redis").await.unwrap();
    for (before, after) in table.tablets.iter().zip(&moved.tablets) {
        assert_ne!(before.server_id, after.server_id, "the tablet moved");
    }
    tokio::task::spawn_blocking(move || {
        let mut la = Line::open(a);
        for k in &keys {
            // A second or so passed in the moves: the TTL only ran down.
            assert_ttl(&la.call(&format!("TTL {k}")), 1000, k);
        }
        assert_eq!(la.call("EXPIRETIME fixed"), ":4000000000\r\n");
        assert_eq!(la.call("TTL n"), ":-1\r\n");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushdown_update_keeps_each_objects_deadline() {
    use insitu_protocol::Number;
    use insitu_protocol::plan::{Field, UpdateAction};
    let node = common::start(|_| {}).await;
    let client = Client::connect(&node.addr()).await.unwrap();
    let t = client.create_table("ttl_update", 1).await.unwrap().id;
    let rules = RejectRules::default();
    let later = unix_ms() + 3_600_000;
    client
        .write_expiring(t, b"due", 5i64.to_le_bytes(), later, rules)
        .await
        .unwrap();
    client.write(t, b"kept", 7i64.to_le_bytes()).await.unwrap();
    let add = UpdateAction::Add(Number::I64(1));
    let n = client
        .update(t, Field::I64(0), add, &Selection::all())
        .await
        .unwrap();
    assert_eq!(n, 2);
    let (value, _, d) = client.read_expiring(t, b"due").await.unwrap().unwrap();
    assert_eq!((&value[..], d), (&6i64.to_le_bytes()[..], later));
    let (value, _, d) = client.read_expiring(t, b"kept").await.unwrap().unwrap();
    assert_eq!((&value[..], d), (&8i64.to_le_bytes()[..], 0));
    node.server.shutdown();
    node.coordinator.shutdown().await;
}
