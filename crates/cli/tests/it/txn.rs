//! `insitu txn` on a real cluster (separate processes): a script commits as
//! one, reads see its own writes, a failing script writes nothing, and bad
//! scripts are refused naming the line. Then the bank: concurrent transfers
//! keep the total, also across a storage server killed with -9 and
//! recovered from its replicas.

use crate::common;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use common::{Cluster, fails, insitu_command, ok, rt};
use insitu_client::{Client, ClientConfig};

/// Run `insitu txn` with `script` on standard input.
fn txn_stdin(cluster: &Cluster, script: &str) -> (i32, String, String) {
    let mut child = insitu_command(&["txn"])
        .env("INSITU_CLUSTER", cluster.addr())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run insitu txn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write the script");
    let out = child.wait_with_output().expect("insitu txn");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn scripts_commit_as_one_or_not_at_all() {
    let cluster = Cluster::start(2, 2);
    ok(cluster.cli(&["table", "create", "accounts", "--tablets", "8"]));
    let out = ok(txn_stdin(
        &cluster,
        "# open two accounts\nput accounts alice 100\nput accounts bob 50\nget accounts alice\nget accounts carol\n",
    ));
    assert_eq!(out, "100\n(nil)\n", "reads see the script's own writes");
    let script = cluster.dir.path().join("transfer.txn");
    std::fs::write(
        &script,
        "add accounts alice -30\nadd accounts bob 30\nget accounts bob\n",
    )
    .unwrap();
    let out = ok(cluster.cli(&["txn", script.to_str().unwrap()]));
    assert_eq!(out, "80\n");
    assert_eq!(ok(cluster.cli(&["get", "accounts", "alice"])), "70\n");
    // Gets only: read at one snapshot.
    let out = ok(txn_stdin(
        &cluster,
        "get accounts alice\nget accounts bob\nget accounts carol\n",
    ));
    assert_eq!(out, "70\n80\n(nil)\n");

    // A script failing half-way writes nothing: `add` on a value that is not
    // a number comes after a put.
    ok(cluster.cli(&["put", "accounts", "note", "hello"]));
    let e = fails(txn_stdin(
        &cluster,
        "put accounts alice 0\nadd accounts note 1\n",
    ));
    assert!(e.contains("not a decimal integer"), "{e}");
    assert_eq!(
        ok(cluster.cli(&["get", "accounts", "alice"])),
        "70\n",
        "nothing applied"
    );

    // Bad scripts and tables are refused before anything runs.
    let e = fails(txn_stdin(
        &cluster,
        "get accounts alice\nmove accounts a b\n",
    ));
    assert!(
        e.contains("line 2") && e.contains("unknown operation"),
        "{e}"
    );
    let e = fails(txn_stdin(&cluster, "get nosuch alice\n"));
    assert!(e.contains("unknown table"), "{e}");
    let e = fails(txn_stdin(&cluster, "\n"));
    assert!(e.contains("no operations"), "{e}");
    let e = fails(cluster.cli(&["txn", "/nonexistent/script.txn"]));
    assert!(e.contains("cannot read"), "{e}");
}

fn balance(v: Option<(bytes::Bytes, u64)>) -> i64 {
    v.map_or(0, |(b, _)| i64::from_le_bytes(b[..8].try_into().unwrap()))
}

/// Run `rounds` random transfers from each of `movers` concurrent clients.
async fn transfers(client: &Client, t: u64, accounts: u64, movers: u64, rounds: usize, seed: u64) {
    let tasks: Vec<_> = (0..movers)
        .map(|m| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut rng = insitu_testkit::rng(seed * 100 + m);
                for _ in 0..rounds {
                    let (from, to) = (rng.u64(0..accounts), rng.u64(0..accounts));
                    if from == to {
                        continue;
                    }
                    let amount = rng.i64(1..=20);
                    let (from, to) = (&format!("a{from}"), &format!("a{to}"));
                    client
                        .transaction(|mut tx| async move {
                            let a = i64::from_le_bytes(
                                tx.read(t, from).await?.unwrap()[..8].try_into().unwrap(),
                            );
                            let b = i64::from_le_bytes(
                                tx.read(t, to).await?.unwrap()[..8].try_into().unwrap(),
                            );
                            tx.write(t, from, (a - amount).to_le_bytes());
                            tx.write(t, to, (b + amount).to_le_bytes());
                            Ok((tx, ()))
                        })
                        .await
                        .expect("a transfer commits");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

async fn total(client: &Client, t: u64, accounts: u64) -> i64 {
    let mut sum = 0;
    for a in 0..accounts {
        sum += balance(client.read(t, format!("a{a}")).await.unwrap());
    }
    sum
}

#[test]
fn bank_total_holds_across_a_killed_server() {
    let mut cluster = Cluster::start(3, 1);
    ok(cluster.cli(&["table", "create", "bank", "--tablets", "6"]));
    let rt = rt();
    rt.block_on(async {
        let config = ClientConfig {
            op_timeout: Duration::from_secs(60),
            ..ClientConfig::default()
        };
        let client = Client::connect_with(&cluster.addr(), config).await.unwrap();
        let t = client.table_id("bank").await.unwrap();
        const ACCOUNTS: u64 = 30;
        for a in 0..ACCOUNTS {
            client
                .write(t, format!("a{a}"), 1000i64.to_le_bytes())
                .await
                .unwrap();
        }
        transfers(&client, t, ACCOUNTS, 4, 30, 1).await;
        assert_eq!(total(&client, t, ACCOUNTS).await, 30_000);

        // kill -9 a server between transactions: its tablets are recovered
        // from replicas on the others, and transfers go on there.
        cluster.servers[1].kill();
        transfers(&client, t, ACCOUNTS, 4, 30, 2).await;
        assert_eq!(total(&client, t, ACCOUNTS).await, 30_000);
    });
}
