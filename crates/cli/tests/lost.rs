//! Objects lost with an in-memory-only server (`--replicas 0`) are never lost
//! silently: with real processes, a server is killed (-9) and its tablets
//! come back empty elsewhere, marked lost. A read of a key it held fails with
//! `DataLost` (the key may have existed) instead of "not found", `count`
//! warns, `insitu status` lists the tablets, a key written again gets a
//! version above every version it had, a move of such a tablet is refused,
//! the marks outlive a coordinator restart, and `insitu table ack-loss`
//! clears them.

mod common;

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
