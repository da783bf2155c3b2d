//! Objects lost with an in-memory-only server (`--replicas 0`) are never lost
//! silently: with real processes, a server is killed (-9) and its tablets
//! come back empty elsewhere, marked lost. A read of a key it held fails with
//! `DataLost` (the key may have existed) instead of "not found", `count`
//! warns, `insitu status` lists the tablets, a key written again gets a
//! version above every version it had, a move of such a tablet is refused,
//! the marks outlive a coordinator restart, and `insitu table ack-loss`
//! clears them. A marked tablet whose new owner dies too waits for a server
//! (an acknowledgement is refused meanwhile); a server restarted before it
//! was found dead, and a whole `insitu up` restarted, say their old objects
//! are lost too.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Cluster;
use insitu_client::{Client, ClientConfig, RejectRules, Status};
use tokio::runtime::Runtime;

const KEYS: usize = 200;

async fn connect(addr: &str) -> Client {
    let config = ClientConfig {
        op_timeout: Duration::from_secs(20),
        ..ClientConfig::default()
    };
    Client::connect_with(addr, config).await.expect("connect")
}

/// Every key's state after the loss: `Some(version)` if it still reads (at
/// that version), `None` if its read answered `DataLost`.
async fn read_all(client: &Client, table: u64) -> BTreeMap<String, Option<u64>> {
    let mut seen = BTreeMap::new();
    for i in 0..KEYS {
        let key = format!("k{i}");
        let state = match client.read(table, &key).await {
            Ok(Some((value, version))) => {
                assert_eq!(&value[..], format!("v{i}").as_bytes(), "{key}");
                Some(version)
            }
            Ok(None) => panic!("{key} read as not found: its loss was silent"),
            Err(e) if e.status() == Some(Status::DataLost) => {
                let text = e.to_string();
                assert!(text.contains("may have existed"), "{text}");
                None
            }
            Err(e) => panic!("{key}: {e}"),
        };
        seen.insert(key, state);
    }
    seen
}

/// `GET path` on the coordinator's metrics port.
fn get(addr: &str, path: &str) -> String {
    let (code, body) = common::rt()
        .block_on(insitu_telemetry::http::get(addr, path))
        .expect("metrics port answers");
    assert_eq!(code, 200, "{body}");
    body
}

/// Poll the metrics port until gauge `name` (any labels) reads `value`
/// (gauges are published every second).
fn metric_until(addr: &str, name: &str, value: f64) {
    let reads = |l: &str| {
        let (head, v) = l.rsplit_once(' ').unwrap_or(("", ""));
        let named = head == name || head.starts_with(&format!("{name}{{"));
        named && v.parse::<f64>() == Ok(value)
    };
    for _ in 0..100 {
        if get(addr, "/metrics").lines().any(reads) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "/metrics never showed {name} = {value}:\n{}",
        get(addr, "/metrics")
    );
}

#[test]
fn a_lost_tablet_says_so_until_the_loss_is_acknowledged() {
    let metrics_port = common::free_port().to_string();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut cluster =
        Cluster::start_with(2, 1, &["--replicas", "0", "--metrics-port", &metrics_port]);
    let (code, out, err) = cluster.cli(&["table", "create", "t", "--tablets", "4"]);
    assert_eq!(code, 0, "{out}{err}");
    let rt = Runtime::new().expect("runtime");
    let client = rt.block_on(connect(&cluster.addr()));
    let table = rt.block_on(client.open_table("t")).expect("open").id;

    // Each key written 3 times: versions before the loss, per key.
    let mut before: BTreeMap<String, u64> = BTreeMap::new();
    rt.block_on(async {
        for round in 0..3 {
            for i in 0..KEYS {
                let key = format!("k{i}");
                let value = if round == 2 {
                    format!("v{i}")
                } else {
                    format!("old{round}")
                };
                let version = client.write(table, &key, &value).await.expect("write");
                before.insert(key, version);
            }
        }
    });
    let highest_before = before.values().copied().max().unwrap();

    // The server holding some tablets dies; R = 0 keeps no copy.
    let victim = cluster.server_ids[0];
    cluster.kill_server(victim);
    let out = cluster.status_until("the lost tablets", |o| {
        o.contains("tablets lost their objects") && !o.contains("waiting for recovery")
    });
    assert!(out.contains(&format!("lost with server {victim}")), "{out}");
    assert!(out.contains("insitu table ack-loss TABLE"), "{out}");
    metric_until(&metrics, "insitu_tablets_lost", 2.0);
    let page = get(&metrics, "/");
    assert!(
        page.contains("2 lost their objects (insitu table ack-loss t)"),
        "{page}"
    );

    // Reads: the survivor's keys read as before, the others say "lost".
    let seen = rt.block_on(read_all(&client, table));
    let lost: Vec<&String> = seen
        .iter()
        .filter(|(_, s)| s.is_none())
        .map(|(k, _)| k)
        .collect();
    let kept = seen.len() - lost.len();
    assert!(
        !lost.is_empty() && kept > 0,
        "lost {} kept {kept}",
        lost.len()
    );
    for (key, state) in &seen {
        if let Some(version) = state {
            assert_eq!(*version, before[key], "{key} kept its version");
        }
    }
    let lost_key = lost[0].clone();

    // Every other request that would treat a lost key as never written says
    // so too: a multi-read item, an increment (which would restart the
    // counter at 0) and a remove that requires the object (a plain remove
    // of an absent key removes nothing and says so, lost or not).
    let kept_key = seen
        .iter()
        .find(|(_, s)| s.is_some())
        .map(|(k, _)| k.clone())
        .unwrap();
    let items = rt
        .block_on(client.multi_read(table, &[lost[2].as_str(), kept_key.as_str()]))
        .expect("multi-read");
    let item_status = items[0].as_ref().err().and_then(|e| e.status());
    assert_eq!(item_status, Some(Status::DataLost), "{:?}", items[0]);
    assert!(matches!(&items[1], Ok(Some(_))), "{:?}", items[1]);
    let e = rt
        .block_on(client.increment_i64(table, lost[3].as_str(), 1))
        .expect_err("a lost counter");
    assert_eq!(e.status(), Some(Status::DataLost), "{e}");
    let must_exist = RejectRules {
        doesnt_exist: true,
        ..RejectRules::default()
    };
    let e = rt
        .block_on(client.remove_with(table, lost[4].as_str(), must_exist))
        .expect_err("a lost key");
    assert_eq!(e.status(), Some(Status::DataLost), "{e}");

    // The CLI: a lost key's get fails and says why; count warns.
    let (code, out, err) = cluster.cli(&["get", "t", &lost_key]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("may have existed") && err.contains("ack-loss"),
        "{err}"
    );
    let (code, out, err) = cluster.cli(&["count", "t"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.trim(), kept.to_string(), "{out}{err}");
    assert!(
        err.contains("warning: 2 of the 4 tablets of table \"t\" lost their objects"),
        "{err}"
    );

    // A lost key written again: its version is above every version any key
    // had, so a client holding an old version cannot mistake the new object.
    let again = rt
        .block_on(client.write(table, &lost_key, "reborn"))
        .expect("write again");
    assert!(
        again > highest_before,
        "version {again} after the loss, {highest_before} before"
    );

    // A lost tablet cannot be moved before the loss is acknowledged.
    let info = rt.block_on(client.open_table("t")).expect("open");
    let (index, _) = info
        .tablets
        .iter()
        .enumerate()
        .find(|(_, t)| t.lost_from == victim)
        .expect("a tablet marked lost in the map");
    let survivor = cluster.server_ids[1];
    let (code, out, err) = cluster.cli(&[
        "tablet",
        "move",
        "t",
        &index.to_string(),
        &survivor.to_string(),
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("ack-loss"), "{err}");

    // The marks are durable: a restarted coordinator still reports them and
    // the shards still answer DataLost.
    cluster.restart_coordinator();
    cluster.status_until("the lost tablets after a restart", |o| {
        o.contains("2 tablets lost their objects")
    });
    let err = rt
        .block_on(client.read(table, lost[1].as_str()))
        .expect_err("still lost");
    assert_eq!(err.status(), Some(Status::DataLost), "{err}");

    // Acknowledged: missing keys are simply not found; no more warnings.
    let (code, out, err) = cluster.cli(&["table", "ack-loss", "t"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("acknowledged: 2 tablets of table t"), "{out}");
    let (code, out, err) = cluster.cli(&["get", "t", lost[1]]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(!err.contains("may have existed"), "{err}");
    assert_eq!(
        rt.block_on(client.read(table, lost[1].as_str()))
            .expect("read"),
        None
    );
    let (code, out, err) = cluster.cli(&["count", "t"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.trim(), (kept + 1).to_string(), "{out}{err}");
    assert!(!err.contains("warning"), "{err}");
    let (code, out, _) = cluster.cli(&["status"]);
    assert_eq!(code, 0);
    assert!(!out.contains("lost their objects"), "{out}");
    metric_until(&metrics, "insitu_tablets_lost", 0.0);
    assert!(!get(&metrics, "/").contains("lost their objects"));
    let (code, out, err) = cluster.cli(&["table", "ack-loss", "t"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("has no lost objects"), "{out}");
    let (code, out, err) = cluster.cli(&["table", "ack-loss", "nope"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("unknown table \"nope\""), "{err}");
}

/// Write `k0..` once each; the highest version handed out.
fn write_once(rt: &Runtime, client: &Client, table: u64) -> u64 {
    rt.block_on(async {
        let mut highest = 0;
        for i in 0..KEYS {
            let key = format!("k{i}");
            let version = client.write(table, &key, format!("v{i}")).await;
            highest = highest.max(version.expect("write"));
        }
        highest
    })
}

/// Create table `t` (2 tablets) on the cluster at `addr` and write every
/// key once: a runtime, a client, the table's id and the highest version.
fn two_tablets_written(addr: &str) -> (Runtime, Client, u64, u64) {
    let (code, out, err) = common::cli(addr, &["table", "create", "t", "--tablets", "2"]);
    assert_eq!(code, 0, "{out}{err}");
    let rt = Runtime::new().expect("runtime");
    let client = rt.block_on(connect(addr));
    let table = rt.block_on(client.open_table("t")).expect("open").id;
    let highest = write_once(&rt, &client, table);
    (rt, client, table, highest)
}

/// After a loss: every key says so, a key written again gets a version
/// above every earlier one, and `ack-loss` on the cluster at `cluster`
/// clears the marks of `tablets`.
fn lost_until_acknowledged(
    cluster: &str,
    rt: &Runtime,
    client: &Client,
    table: u64,
    highest_before: u64,
    tablets: usize,
) {
    let seen = rt.block_on(read_all(client, table));
    assert!(seen.values().all(Option::is_none), "{seen:?}");
    let written = rt
        .block_on(client.write(table, "k0", "again"))
        .expect("a write to a lost tablet");
    assert!(
        written > highest_before,
        "version {written} after the loss, {highest_before} before"
    );
    let (code, out, err) = common::cli(cluster, &["table", "ack-loss", "t"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("acknowledged: {tablets} tablets of table t")),
        "{out}"
    );
    assert_eq!(
        rt.block_on(client.read(table, "k1")).expect("read"),
        None,
        "acknowledged: simply not found"
    );
}

/// A tablet marked lost whose new owner dies too waits for a server; an
/// acknowledgement meanwhile is refused (nothing serves the tablet to clear
/// its mark) and leaves every mark in place. The next server takes it over,
/// marked lost again.
#[test]
fn an_acknowledgement_waits_for_a_lost_tablet_to_be_served() {
    let mut cluster = Cluster::start_with(2, 1, &["--replicas", "0"]);
    let (rt, client, table, highest_before) = two_tablets_written(&cluster.addr());
    let (first, second) = (cluster.server_ids[0], cluster.server_ids[1]);
    cluster.kill_server(first);
    cluster.status_until("the first server's tablets marked lost", |o| {
        o.contains("1 tablets lost their objects") && !o.contains("waiting for recovery")
    });
    cluster.kill_server(second);
    cluster.status_until("every tablet waiting for a server", |o| {
        o.contains("2 tablets waiting for recovery")
    });
    let (code, out, err) = cluster.cli(&["table", "ack-loss", "t"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("no live server yet"), "{err}");
    cluster.add_server(1);
    cluster.status_until("both tablets served and marked lost", |o| {
        o.contains("2 tablets lost their objects") && !o.contains("waiting for recovery")
    });
    lost_until_acknowledged(&cluster.addr(), &rt, &client, table, highest_before, 2);
}

/// A server restarted on its directory before it was found dead (`insitu up
/// --replicas 0` stopped and started again does this): its new incarnation
/// retires the old one at once, and the old one's tablets come back on it
/// empty, marked lost with the old incarnation.
#[test]
fn a_server_restarted_before_it_was_found_dead_says_its_objects_are_lost() {
    // Found dead only after 60 s: the restart comes first.
    let mut cluster =
        Cluster::start_with(1, 1, &["--replicas", "0", "--failure-timeout-ms", "60000"]);
    let (rt, client, table, highest_before) = two_tablets_written(&cluster.addr());
    let victim = cluster.server_ids[0];
    cluster.kill_server(victim);
    let restarted = cluster.start_server(0, 1);
    let out = cluster.status_until("the old incarnation's tablets marked lost", |o| {
        o.contains("2 tablets lost their objects")
    });
    assert!(out.contains(&format!("lost with server {victim}")), "{out}");
    lost_until_acknowledged(&cluster.addr(), &rt, &client, table, highest_before, 2);
    drop(restarted);
}

/// `insitu up --replicas 0` killed and started again on its directory: the
/// servers of the first run are found dead, and their tablets come back
/// spread over the new servers, empty, marked lost with the old servers,
/// before any client is sent there.
#[test]
fn an_in_memory_up_restarted_says_its_objects_are_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = common::free_port();
    let data = dir.path().join("data");
    let args = ["--no-auth", "--replicas", "0"];
    let up = common::start_up_with(2, port, &data, &args, "insitu is up");
    let addr = format!("127.0.0.1:{port}");
    let (rt, client, table, highest_before) = two_tablets_written(&addr);
    drop(up); // kill -9
    let _up = common::start_up_with(2, port, &data, &args, "insitu is up");
    let out = common::status_until(&addr, "the old tablets served, marked lost", |o| {
        o.contains("2 tablets lost their objects") && !o.contains("waiting for recovery")
    });
    assert!(out.contains("(lost with server "), "{out}");
    // Spread over both new servers, as a new table would be.
    let info = rt.block_on(client.open_table("t")).expect("open");
    let homes: std::collections::BTreeSet<&str> =
        info.tablets.iter().map(|t| t.addr.as_str()).collect();
    assert_eq!(homes.len(), 2, "{out}");
    lost_until_acknowledged(&addr, &rt, &client, table, highest_before, 2);
}
