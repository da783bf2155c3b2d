//! A pushdown update whose reply was lost is resent with the same operation
//! id. Its server may have died since: the tablet's new owner, recovered
//! from the replicas of the dead server's log, must answer the resend with
//! the first result, not apply the update a second time. Real processes.

mod common;

use std::time::Duration;

use common::{Cluster, ok, rt};
use insitu_client::{Client, ClientConfig, RpcConn};
use insitu_protocol::plan::{Field, Op, Partial, ScanPlan, ScanResult, UpdateAction};
use insitu_protocol::{Number, Request, Response, Status, TabletInfo};

/// Objects in the updated tablet.
const OBJECTS: usize = 300;
/// The update's operation id, as a client would have drawn it.
const OP: u64 = 0x5eed_0001;

fn key(i: usize) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

/// `add 1` to the i64 at offset 0 of every object of `tablet`, as operation `OP`.
fn add_one(table: u64, tablet: &TabletInfo) -> Request<'static> {
    Request::Scan {
        table,
        start_hash: tablet.start_hash,
        end_hash: tablet.end_hash,
        map_version: tablet.map_version,
        plan: ScanPlan::new(Op::Update {
            field: Field::I64(0),
            action: UpdateAction::Add(Number::I64(1)),
        }),
        op_id: OP,
        budget_ms: 0,
    }
}

/// Send `add_one` to the tablet's current owner until it answers (the
/// owner may be dead, or recovering, for a while).
async fn send_until_answered(client: &Client, table: u64) -> ScanResult {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no owner answered the update"
        );
        let info = client.open_table("u").await.unwrap();
        let tablet = &info.tablets[0];
        if let Ok(conn) = RpcConn::connect(&tablet.addr).await {
            if let Ok(reply) = conn.call(&add_one(table, tablet)).await {
                match reply.status {
                    Status::Ok => match reply.decode().unwrap() {
                        Response::Scan(r) => return r,
                        other => panic!("expected a scan result, got {other:?}"),
                    },
                    Status::Retry | Status::UnknownTablet | Status::StaleMap => {}
                    other => panic!(
                        "the update was refused: {other:?} {}",
                        reply.error_message()
                    ),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn an_update_resent_after_its_server_died_is_answered_not_applied_twice() {
    let mut cluster = Cluster::start(3, 1);
    ok(cluster.cli(&["table", "create", "u", "--tablets", "1"]));
    let rt = rt();
    let (victim, owner) = rt.block_on(async {
        let config = ClientConfig {
            op_timeout: Duration::from_secs(30),
            ..ClientConfig::default()
        };
        let client = Client::connect_with(&cluster.addr(), config).await.unwrap();
        let table = client.table_id("u").await.unwrap();
        // Servers learn of each other from the coordinator's list, fetched
        // every second; until then each keeps its replicas on its own disk,
        // which a kill -9 takes with it.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let items: Vec<(Vec<u8>, Vec<u8>)> = (0..OBJECTS)
            .map(|i| (key(i), 10i64.to_le_bytes().to_vec()))
            .collect();
        for r in client.multi_write(table, &items).await.unwrap() {
            r.expect("write acknowledged");
        }
        let first = send_until_answered(&client, table).await;
        assert_eq!(
            first.partial,
            Partial::Update {
                updated: OBJECTS as u64
            }
        );
        let owner = client.open_table("u").await.unwrap().tablets[0]
            .addr
            .clone();
        let mut servers = client.list_servers().await.unwrap();
        // Servers enlist in the order the harness starts them.
        servers.sort_by_key(|s| s.id);
        let victim = servers
            .iter()
            .position(|s| s.shard_addrs.contains(&owner))
            .expect("the owner is a listed server");
        (victim, owner)
    });

    // The reply is "lost", and the server that applied the update dies.
    cluster.servers[victim].kill();

    rt.block_on(async {
        let config = ClientConfig {
            op_timeout: Duration::from_secs(60),
            ..ClientConfig::default()
        };
        let client = Client::connect_with(&cluster.addr(), config).await.unwrap();
        let table = client.table_id("u").await.unwrap();
        let again = send_until_answered(&client, table).await;
        let now = client.open_table("u").await.unwrap().tablets[0]
            .addr
            .clone();
        assert_ne!(now, owner, "a survivor answered");
        assert_eq!(
            again.partial,
            Partial::Update {
                updated: OBJECTS as u64
            },
            "the resend is answered with the first result"
        );
        let keys: Vec<Vec<u8>> = (0..OBJECTS).map(key).collect();
        for (i, r) in client
            .multi_read(table, &keys)
            .await
            .unwrap()
            .into_iter()
            .enumerate()
        {
            let (value, _) = r.expect("read").expect("the object survived the crash");
            assert_eq!(
                i64::from_le_bytes(value[..8].try_into().unwrap()),
                11,
                "object {i}: added once, not twice"
            );
        }
        // A new operation id is a new update: it applies.
        let plan = ScanPlan::new(Op::Update {
            field: Field::I64(0),
            action: UpdateAction::Add(Number::I64(1)),
        });
        let fresh = client
            .execute_plan(table, &plan)
            .await
            .expect("a new update");
        assert_eq!(
            fresh.partial,
            Partial::Update {
                updated: OBJECTS as u64
            }
        );
    });
}
