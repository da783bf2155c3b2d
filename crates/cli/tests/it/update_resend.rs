//! A pushdown update whose reply was lost is resent with the same operation
//! id. Its server may have died since: the tablet's new owner, recovered
//! from the replicas of the dead server's log, must answer the resend with
//! the first result, not apply the update a second time. A tablet keeps
//! the records of its newest 64 updates only: an older one resent after
//! the crash is not recognised. Real processes.

use crate::common;

use std::time::Duration;

use common::pushdown::update_request;
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

/// Update records a tablet keeps (`update_log::KEPT_PER_TABLET`).
const KEPT_PER_TABLET: u64 = 64;

/// `add 1` to the i64 at offset 0 of every object of `tablet`, as operation `op`.
fn add_one(table: u64, tablet: &TabletInfo, op: u64) -> Request<'static> {
    let action = UpdateAction::Add(Number::I64(1));
    update_request(table, tablet, Field::I64(0), action, op, 0)
}

/// Send `add_one` as `op` to the tablet's current owner until it answers
/// (the owner may be dead, or recovering, for a while).
async fn send_until_answered(client: &Client, table: u64, op: u64) -> ScanResult {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no owner answered the update"
        );
        let info = client.open_table("u").await.unwrap();
        let tablet = &info.tablets[0];
        if let Ok(conn) = RpcConn::connect(&tablet.addr).await
            && let Ok(reply) = conn.call(&add_one(table, tablet, op)).await
        {
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
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn an_update_resent_after_its_server_died_is_answered_not_applied_twice() {
    let mut cluster = Cluster::start(3, 1);
    ok(cluster.cli(&["table", "create", "u", "--tablets", "1"]));
    let rt = rt();
    let (victim, owner) = rt.block_on(async {
        let (client, table, victim, owner) = fill(&cluster).await;
        let first = send_until_answered(&client, table, OP).await;
        assert_eq!(
            first.partial,
            Partial::Update {
                updated: OBJECTS as u64
            }
        );
        (victim, owner)
    });

    // The reply is "lost", and the server that applied the update dies.
    cluster.servers[victim].kill();

    rt.block_on(async {
        let (client, table) = connect(&cluster).await;
        let again = send_until_answered(&client, table, OP).await;
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
        assert_eq!(the_value(&client, table).await, 11, "added once, not twice");
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

/// Three servers, table "u" of one tablet holding `OBJECTS` objects of 10;
/// the client, the table id, and the index and address of the tablet's
/// owner.
async fn fill(cluster: &Cluster) -> (Client, u64, usize, String) {
    let (client, table) = connect(cluster).await;
    // Servers learn of each other from the coordinator's list, fetched
    // every second; until then each keeps its replicas on its own disk.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..OBJECTS)
        .map(|i| (key(i), 10i64.to_le_bytes().to_vec()))
        .collect();
    for r in client.multi_write(table, &items).await.unwrap() {
        r.expect("write acknowledged");
    }
    let owner = client.open_table("u").await.unwrap().tablets[0]
        .addr
        .clone();
    let mut servers = client.list_servers().await.unwrap();
    servers.sort_by_key(|s| s.id);
    let victim = servers
        .iter()
        .position(|s| s.shard_addrs.contains(&owner))
        .expect("the owner is a listed server");
    (client, table, victim, owner)
}

/// A client whose calls outlast a recovery (seconds), and table "u"'s id.
async fn connect(cluster: &Cluster) -> (Client, u64) {
    let config = ClientConfig {
        op_timeout: Duration::from_secs(60),
        ..ClientConfig::default()
    };
    let client = Client::connect_with(&cluster.addr(), config).await.unwrap();
    let table = client.table_id("u").await.unwrap();
    (client, table)
}

/// Every object's value, which must be the same for all.
async fn the_value(client: &Client, table: u64) -> i64 {
    let keys: Vec<Vec<u8>> = (0..OBJECTS).map(key).collect();
    let values: Vec<i64> = client
        .multi_read(table, &keys)
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            let (v, _) = r.expect("read").expect("present");
            i64::from_le_bytes(v[..8].try_into().unwrap())
        })
        .collect();
    assert!(values.iter().all(|v| *v == values[0]), "{values:?}");
    values[0]
}

#[test]
fn a_tablet_remembers_its_newest_64_updates_across_a_crash() {
    let mut cluster = Cluster::start(3, 1);
    ok(cluster.cli(&["table", "create", "u", "--tablets", "1"]));
    let rt = rt();
    let updates = KEPT_PER_TABLET + 6;
    let first_op = 0x0de1_0000;
    let victim = rt.block_on(async {
        let (client, table, victim, _) = fill(&cluster).await;
        for op in first_op..first_op + updates {
            let r = send_until_answered(&client, table, op).await;
            assert_eq!(
                r.partial,
                Partial::Update {
                    updated: OBJECTS as u64
                }
            );
        }
        assert_eq!(the_value(&client, table).await, 10 + updates as i64);
        victim
    });
    cluster.servers[victim].kill();
    rt.block_on(async {
        let (client, table) = connect(&cluster).await;
        let all = 10 + updates as i64;
        // The oldest kept: answered, not applied again.
        let kept = first_op + updates - KEPT_PER_TABLET;
        let again = send_until_answered(&client, table, kept).await;
        assert_eq!(
            again.partial,
            Partial::Update {
                updated: OBJECTS as u64
            }
        );
        assert_eq!(
            the_value(&client, table).await,
            all,
            "op {kept:#x} is remembered"
        );
        // The newest dropped: no record is left of it, so it is applied
        // again (the documented bound, not a wish).
        send_until_answered(&client, table, kept - 1).await;
        assert_eq!(
            the_value(&client, table).await,
            all + 1,
            "only the newest {KEPT_PER_TABLET} are kept"
        );
    });
}
