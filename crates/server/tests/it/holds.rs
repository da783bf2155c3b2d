//! A long scan or update under concurrent writes is exact, and a point read on
//! another connection of the same shard is answered while it runs, also after
//! the scan had to restart (the hold mode of `hold.rs`).
//!
//! Ordering, not time, is asserted: once a write to the tablet is refused with
//! `Retry` the tablet is held; a read then answered, followed by another write
//! still refused, proves the read was served while the scan held the tablet.

use crate::common;

use insitu_client::rpc::RpcConn;
use insitu_client::{Client, Selection};
use insitu_protocol::plan::{Field, Op, Partial, ScanPlan, Source, UpdateAction, int_key};
use insitu_protocol::{Number, RejectRules, Request, Response, Status, blob};

const N: u64 = 200_000;

fn value(i: u64) -> Vec<u8> {
    let mut v = i.to_le_bytes().to_vec();
    v.extend_from_slice(&[7u8; 24]);
    v
}

struct Cluster {
    node: common::Node,
    client: Client,
    table: u64,
    shard: String,
}

async fn cluster() -> Cluster {
    let node = common::start(|_| {}).await;
    let client = Client::connect(&node.addr()).await.unwrap();
    let info = client.create_table("held", 1).await.unwrap();
    let shard = info.tablets[0].addr.clone();
    let items: Vec<([u8; 8], Vec<u8>)> = (0..N).map(|i| (int_key(i), value(i))).collect();
    for chunk in items.chunks(10_000) {
        for r in client.multi_write(info.id, chunk).await.unwrap() {
            r.unwrap();
        }
    }
    Cluster {
        node,
        client,
        table: info.id,
        shard,
    }
}

/// Write key `i` with the value of `i + offset`.
async fn raw_write(conn: &RpcConn, table: u64, i: u64, offset: u64) -> Status {
    let (k, v) = (int_key(i), value(i + offset));
    let reply = conn
        .call(&Request::Write {
            expires_at_ms: 0,
            table,
            key: blob(&k),
            value: blob(&v),
            rules: RejectRules::default(),
        })
        .await
        .unwrap();
    reply.status
}

async fn raw_read(conn: &RpcConn, table: u64, i: u64) -> Vec<u8> {
    let k = int_key(i);
    let reply = conn
        .call(&Request::Read {
            table,
            key: blob(&k),
        })
        .await
        .unwrap();
    assert_eq!(reply.status, Status::Ok, "{}", reply.error_message());
    match reply.decode().unwrap() {
        Response::Read { value, .. } => value.to_vec(),
        other => panic!("{other:?}"),
    }
}

/// While `op` runs: write key i with the value of `i + offset` (what the
/// objects hold already) until the tablet is held, then read on a third
/// connection, then check the tablet is still held. Returns whether that whole
/// sequence fitted inside the operation, how many writes landed, and what the
/// read saw as (key, value).
async fn probe_during(
    c: &Cluster,
    offset: u64,
    op: impl std::future::Future<Output = ()>,
) -> (bool, u64, Option<(u64, Vec<u8>)>) {
    let writer = RpcConn::connect(&c.shard).await.unwrap();
    let reader = RpcConn::connect(&c.shard).await.unwrap();
    let op_done = std::cell::Cell::new(false);
    let op = async {
        op.await;
        op_done.set(true);
    };
    let probe = async {
        let mut landed = 0u64;
        let mut i = 0u64;
        // Bounded: the operation ends, or the tablet is seen held.
        while !op_done.get() {
            i = (i + 7919) % N;
            match raw_write(&writer, c.table, i, offset).await {
                Status::Ok => landed += 1,
                Status::Retry => {
                    // Held. A read on another connection is answered...
                    let seen = raw_read(&reader, c.table, i).await;
                    // ...while the tablet is still held, i.e. before the op ended.
                    let still = raw_write(&writer, c.table, i, offset).await == Status::Retry;
                    return (still && !op_done.get(), landed, Some((i, seen)));
                }
                other => panic!("write refused with {other}"),
            }
        }
        (false, landed, None)
    };
    let ((), out) = tokio::join!(op, probe);
    out
}

#[tokio::test(flavor = "current_thread")]
async fn a_restarted_scan_stays_exact_and_reads_go_on() {
    let c = cluster().await;
    let want_sum: i128 = (0..N as i128).sum();
    let mut proved = false;
    for _ in 0..5 {
        // Long (mostly missing integer keys) but cheap to load: 4M lookups.
        let plan = ScanPlan {
            source: Source::IntKeys {
                from: 0,
                to: 20 * N,
            },
            ..ScanPlan::new(Op::Aggregate {
                field: Field::I64(0),
            })
        };
        let mut restarts = 0;
        let scan = async {
            let out = c.client.execute_plan(c.table, &plan).await.unwrap();
            match out.partial {
                Partial::Aggregate(a) => assert_eq!((a.count, a.sum_int), (N, want_sum)),
                other => panic!("{other:?}"),
            }
            restarts = out.restarts;
        };
        let (held_read, landed, seen) = probe_during(&c, 0, scan).await;
        if let Some((i, v)) = seen {
            assert_eq!(v, value(i));
        }
        // Writes landed during the first attempt, so it restarted and held.
        if held_read {
            assert!(
                landed > 0 && restarts > 0,
                "{landed} writes, {restarts} restarts"
            );
            proved = true;
            break;
        }
    }
    assert!(
        proved,
        "never saw a read answered while a scan held its tablet"
    );
    // Once the scan is done, writes go through again.
    let writer = RpcConn::connect(&c.shard).await.unwrap();
    assert_eq!(raw_write(&writer, c.table, 1, 0).await, Status::Ok);
    c.node.server.shutdown();
    c.node.coordinator.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn an_update_is_exact_and_reads_go_on_while_it_applies() {
    let c = cluster().await;
    let mut proved = false;
    let mut rounds = 0u64;
    for _ in 0..5 {
        let update = async {
            let n = c
                .client
                .update(
                    c.table,
                    Field::I64(0),
                    UpdateAction::Add(Number::I64(1)),
                    &Selection::all(),
                )
                .await
                .unwrap();
            assert_eq!(n, N);
        };
        // The writer writes what the objects hold after `rounds` updates, so a
        // write landing before this update started changes nothing.
        let (held_read, _, seen) = probe_during(&c, rounds, update).await;
        rounds += 1;
        if let Some((i, v)) = seen {
            // Mid-update: this object holds its old or its new value.
            assert!(
                v == value(i + rounds - 1) || v == value(i + rounds),
                "key {i}"
            );
        }
        if held_read {
            proved = true;
            break;
        }
    }
    assert!(
        proved,
        "never saw a read answered while an update held its tablet"
    );
    let want_sum: i128 = (0..N as i128).sum::<i128>() + (rounds * N) as i128;
    let agg = c
        .client
        .aggregate(c.table, Field::I64(0), &Selection::all())
        .await
        .unwrap();
    // Every object updated exactly once per round, none lost or doubled.
    assert_eq!(
        (agg.count, agg.sum_int),
        (N, want_sum),
        "after {rounds} rounds"
    );
    c.node.server.shutdown();
    c.node.coordinator.shutdown().await;
}
