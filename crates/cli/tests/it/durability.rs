//! Nothing acknowledged is lost: real processes on loopback, killed with
//! SIGKILL. Each test records every write the cluster acknowledged and, after
//! the crash and the recovery, reads every key back: an acknowledged value
//! (or a later write whose outcome was unknown) must be there, and a read
//! must never return a value that was not written.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Cluster, rt};
use insitu_client::{Client, ClientConfig};

/// What a key may hold: the last acknowledged value (if any) and the values
/// of later writes whose outcome is unknown (sent, no reply).
#[derive(Default, Clone, Debug)]
struct Expect {
    acked: Option<Vec<u8>>,
    unknown: Vec<Vec<u8>>,
}

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

fn value(i: usize, round: usize) -> Vec<u8> {
    // Big enough that a few thousand objects fill several segments.
    let mut v = format!("value-{i}-{round}-").into_bytes();
    v.resize(200, b'x');
    v
}

/// Write keys `0..keys` `rounds` times (round-robin), recording outcomes;
/// `during(n)` runs after the n-th write (a crash is injected from there).
async fn write_load(
    client: &Client,
    table: u64,
    keys: usize,
    rounds: usize,
    expect: &mut BTreeMap<Vec<u8>, Expect>,
    mut during: impl FnMut(usize),
) -> (usize, usize) {
    let (mut acked, mut failed) = (0, 0);
    for n in 0..keys * rounds {
        let (i, round) = (n % keys, n / keys);
        let (k, v) = (key(i), value(i, round));
        let e = expect.entry(k.clone()).or_default();
        match client.write(table, &k, &v).await {
            Ok(_) => {
                e.acked = Some(v);
                e.unknown.clear();
                acked += 1;
            }
            Err(_) => {
                e.unknown.push(v);
                failed += 1;
            }
        }
        during(n);
    }
    (acked, failed)
}

/// Read every key back (retrying while its tablet is being recovered) and
/// check it against what was acknowledged. Returns the number of lost keys.
async fn check_all(client: &Client, table: u64, expect: &BTreeMap<Vec<u8>, Expect>) -> usize {
    let mut lost = Vec::new();
    // One deadline for the whole check: a recovery that never finishes
    // fails the test in bounded time instead of once per key.
    let deadline = Instant::now() + Duration::from_secs(90);
    for (k, e) in expect {
        let found = loop {
            match client.read(table, k).await {
                Ok(found) => break found.map(|(v, _version)| v.to_vec()),
                Err(err) if Instant::now() < deadline => {
                    eprintln!("read {:?}: {err} (retrying)", String::from_utf8_lossy(k));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(err) => panic!("read {:?} kept failing: {err}", String::from_utf8_lossy(k)),
            }
        };
        match (&found, &e.acked) {
            (Some(v), _) if e.unknown.contains(v) || e.acked.as_ref() == Some(v) => {}
            (None, None) => {}
            (Some(v), _) => panic!(
                "{:?} holds {:?}, a value never written (expected {:?} or one of {} unknown)",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(v),
                e.acked
                    .as_ref()
                    .map(|a| String::from_utf8_lossy(a).into_owned()),
                e.unknown.len()
            ),
            (None, Some(_)) => lost.push(String::from_utf8_lossy(k).into_owned()),
        }
    }
    assert!(
        lost.is_empty(),
        "{} acknowledged keys lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    lost.len()
}

fn client_config() -> ClientConfig {
    ClientConfig {
        // Longer than detection + recovery, so a write to a dead server's
        // tablet waits for the recovery instead of failing.
        op_timeout: Duration::from_secs(30),
        ..ClientConfig::default()
    }
}

/// A cluster of `servers` server processes (one shard each) with a table
/// "t" of `tablets` tablets, the runtime the test drives its client on, and
/// a client whose operations outlast a detection and a recovery.
fn cluster_with_table(servers: usize, tablets: u32) -> (Cluster, tokio::runtime::Runtime) {
    let cluster = Cluster::start(servers, 1);
    let tablets = tablets.to_string();
    let (code, out, err) = cluster.cli(&["table", "create", "t", "--tablets", &tablets]);
    assert_eq!(code, 0, "{out}{err}");
    (cluster, rt())
}

async fn connect(cluster: &Cluster) -> (Client, u64) {
    let client = Client::connect_with(&cluster.addr(), client_config())
        .await
        .unwrap();
    let table = client.table_id("t").await.unwrap();
    (client, table)
}

#[test]
fn killing_one_of_three_servers_during_writes_loses_no_acknowledged_write() {
    let (mut cluster, rt) = cluster_with_table(3, 6);
    let mut expect = BTreeMap::new();
    rt.block_on(async {
        let (client, table) = connect(&cluster).await;
        // Deadlines are in the log entries: a recovery brings them back too.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let (later, brief) = (now_ms + 3_600_000, now_ms + 2_000);
        for i in 0..60 {
            for (name, deadline) in [("later", later), ("brief", brief)] {
                client
                    .write_expiring(
                        table,
                        format!("{name}-{i}"),
                        b"v",
                        deadline,
                        Default::default(),
                    )
                    .await
                    .unwrap();
            }
        }
        let victim = &mut cluster.servers[1];
        // One write per key: the keys written before the kill live only on
        // the dead server and its backups — the recovery must bring them back.
        let (acked, failed) = write_load(&client, table, 3000, 1, &mut expect, |n| {
            if n == 1500 {
                victim.kill();
            }
        })
        .await;
        eprintln!("{acked} writes acknowledged, {failed} failed");
        assert!(
            acked > 2000,
            "the load went on after the kill: {acked} acknowledged"
        );
        check_all(&client, table, &expect).await;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        tokio::time::sleep(Duration::from_millis((brief + 50).saturating_sub(now_ms))).await;
        for i in 0..60 {
            let found = client
                .read_expiring(table, format!("later-{i}"))
                .await
                .unwrap();
            assert_eq!(found.map(|(_, _, d)| d), Some(later), "later-{i}");
            let found = client
                .read_expiring(table, format!("brief-{i}"))
                .await
                .unwrap();
            assert!(found.is_none(), "brief-{i} outlived its deadline");
        }
    });
    // The dead server is reported (or already forgotten after its recovery).
    let (code, out, err) = cluster.cli(&["status"]);
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn killing_every_process_and_restarting_them_keeps_every_acknowledged_write() {
    let (mut cluster, rt) = cluster_with_table(3, 4);
    let mut expect = BTreeMap::new();
    rt.block_on(async {
        let (client, table) = connect(&cluster).await;
        let (acked, failed) = write_load(&client, table, 800, 2, &mut expect, |_| {}).await;
        assert_eq!((acked, failed), (1600, 0));
    });
    // kill -9 everything, then start it all again on the same directories.
    cluster.coordinator.kill();
    for s in &mut cluster.servers {
        s.kill();
    }
    cluster.restart_coordinator();
    let restarted: Vec<_> = (0..3).map(|i| cluster.start_server(i, 1)).collect();
    cluster.servers = restarted;
    rt.block_on(async {
        let (client, table) = connect(&cluster).await;
        check_all(&client, table, &expect).await;
    });
}

/// A one-server cluster keeps its only replica on its own backup, which its
/// shards reach in-process (not through the backup port): after kill -9 of
/// both processes, every acknowledged write is read back from that replica.
#[test]
fn a_lone_server_killed_and_restarted_keeps_every_acknowledged_write() {
    let (mut cluster, rt) = cluster_with_table(1, 2);
    let mut expect = BTreeMap::new();
    rt.block_on(async {
        let (client, table) = connect(&cluster).await;
        let (acked, failed) = write_load(&client, table, 500, 2, &mut expect, |_| {}).await;
        assert_eq!((acked, failed), (1000, 0));
    });
    cluster.coordinator.kill();
    cluster.servers[0].kill();
    cluster.restart_coordinator();
    cluster.servers = vec![cluster.start_server(0, 1)];
    rt.block_on(async {
        let (client, table) = connect(&cluster).await;
        check_all(&client, table, &expect).await;
    });
}

#[test]
fn bench_recovery_smoke_reports_every_key_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("recovery.json");
    let out = std::process::Command::new(common::insitu_bin())
        .args([
            "bench",
            "recovery",
            "--mb",
            "2",
            "--servers",
            "2",
            "--tablets",
            "2",
        ])
        .arg("--json")
        .arg(&json)
        .env("INSITU_LOG", "warn")
        .output()
        .expect("run insitu bench recovery");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("json");
    for k in [
        "detect_ms",
        "recover_ms",
        "recovery_seconds_per_gb",
        "objects_lost",
        "owners_ms",
        "writable_ms",
        "probe_ping_ms_max",
        "backup_ping_ms_max",
    ] {
        assert!(v.get(k).is_some(), "missing {k} in {v}");
    }
    // The probe reached the survivors' backup ports (a ping takes time).
    assert!(v["backup_ping_ms_max"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["objects_lost"], 0);
    assert!(v["objects"].as_u64().unwrap() > 1000);
}
