//! kill -9 of the coordinator in the middle of a tablet move, real
//! processes: the restarted coordinator finishes or undoes the move, so
//! exactly one shard serves the tablet and every acknowledged write is there.

mod common;

use common::rt;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Cluster, insitu_bin};
use insitu_client::{Client, RpcConn};
use insitu_protocol::{Request, Status, blob};

/// Objects in the moved tablet: enough that the copy takes a while.
const OBJECTS: usize = 20_000;

fn key(i: usize) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

#[test]
fn killing_the_coordinator_during_a_move_leaves_one_owner_and_every_write() {
    let mut cluster = Cluster::start(2, 1);
    let rt = rt();
    let table = rt.block_on(async {
        let client = Client::connect(&cluster.addr()).await.unwrap();
        let t = client.create_table("m", 1).await.unwrap();
        let items: Vec<(Vec<u8>, Vec<u8>)> =
            (0..OBJECTS).map(|i| (key(i), vec![b'v'; 100])).collect();
        for chunk in items.chunks(5000) {
            for r in client.multi_write(t.id, chunk).await.unwrap() {
                r.expect("write acknowledged");
            }
        }
        t.id
    });
    // Kill the coordinator at different moments of the move: before,
    // during and after the copy (where it lands varies; every outcome must
    // hold the invariants).
    for (round, kill_after_ms) in [0u64, 10, 40, 150].into_iter().enumerate() {
        let owner = rt.block_on(async {
            let client = Client::connect(&cluster.addr()).await.unwrap();
            client.open_table("m").await.unwrap().tablets[0].server_id
        });
        let servers = rt.block_on(async {
            Client::connect(&cluster.addr())
                .await
                .unwrap()
                .list_servers()
                .await
                .unwrap()
        });
        let dest = servers
            .iter()
            .find(|s| s.id != owner)
            .expect("two servers")
            .id;
        let mover = Command::new(insitu_bin())
            .args(["tablet", "move", "m", "0", &dest.to_string()])
            .env("INSITU_CLUSTER", cluster.addr())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run insitu tablet move");
        std::thread::sleep(Duration::from_millis(kill_after_ms));
        cluster.restart_coordinator(); // kill -9, then start on the same metadata
        let out = mover.wait_with_output().expect("tablet move ends");
        // The operator is told the truth: moved; "outcome unknown" (sent, no
        // reply); or "cannot reach" (killed before the request was sent).
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success()
                || stderr.contains("outcome unknown")
                || stderr.contains("cannot reach"),
            "round {round}: {stderr}"
        );

        rt.block_on(async {
            let client = Client::connect(&cluster.addr()).await.unwrap();
            // Every acknowledged write is readable (the client retries while
            // the restarted coordinator reconciles).
            let keys: Vec<Vec<u8>> = (0..OBJECTS).map(key).collect();
            for chunk in keys.chunks(5000) {
                for (i, r) in client
                    .multi_read(table, chunk)
                    .await
                    .unwrap()
                    .iter()
                    .enumerate()
                {
                    let found = r.as_ref().expect("read after the crash");
                    assert!(
                        found.is_some(),
                        "round {round}: object {i} of a chunk is missing"
                    );
                }
            }
            // Writes are accepted again.
            client
                .write(table, format!("after-{round}").as_bytes(), b"x")
                .await
                .expect("writable after the crash");
            // Exactly one shard serves it: the map's owner; the other answers UnknownTablet.
            let t = client.open_table("m").await.unwrap();
            let servers = client.list_servers().await.unwrap();
            let mut serving = 0;
            for s in &servers {
                let conn = RpcConn::connect(&s.shard_addrs[0]).await.unwrap();
                let reply = conn
                    .call(&Request::Read {
                        table,
                        key: blob(&key(0)),
                    })
                    .await
                    .unwrap();
                if reply.status == Status::Ok {
                    serving += 1;
                    assert_eq!(
                        s.id, t.tablets[0].server_id,
                        "round {round}: a non-owner serves"
                    );
                } else {
                    assert_eq!(reply.status, Status::UnknownTablet, "round {round}");
                }
            }
            assert_eq!(serving, 1, "round {round}: exactly one serving owner");
        });
    }
}
