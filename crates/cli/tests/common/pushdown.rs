//! What the pushdown tests share: numbered objects with fields at fixed
//! offsets, bulk loading, and a cluster with a client and one table.

use insitu_client::Client;
use insitu_protocol::plan::{Field, Op, ScanPlan, UpdateAction, int_key};
use insitu_protocol::{Request, TabletInfo};

use super::{Cluster, rt};

/// Object i: i64@0 = i, f64@8 = i / 2, i32@16 = i % 7.
pub fn value(i: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(20);
    v.extend_from_slice(&(i as i64).to_le_bytes());
    v.extend_from_slice(&(i as f64 / 2.0).to_le_bytes());
    v.extend_from_slice(&((i % 7) as i32).to_le_bytes());
    v
}

pub async fn load(client: &Client, table: u64, n: u64, make: impl Fn(u64) -> Vec<u8>) {
    let mut i = 0;
    while i < n {
        let end = (i + 1000).min(n);
        let items: Vec<([u8; 8], Vec<u8>)> = (i..end).map(|i| (int_key(i), make(i))).collect();
        for r in client.multi_write(table, &items).await.unwrap() {
            r.unwrap();
        }
        i = end;
    }
}

/// A cluster of `servers` servers of `shards` shards, a runtime, a client
/// and the id of a new table `name` of `tablets` tablets.
pub fn with_table(
    servers: usize,
    shards: usize,
    name: &str,
    tablets: u32,
) -> (Cluster, tokio::runtime::Runtime, Client, u64) {
    let cluster = Cluster::start(servers, shards);
    let rt = rt();
    let client = rt.block_on(Client::connect(&cluster.addr())).unwrap();
    let t = rt.block_on(client.create_table(name, tablets)).unwrap().id;
    (cluster, rt, client, t)
}

/// A client of `addr` on its own single-threaded runtime, for a helper thread.
pub fn thread_client(addr: &str) -> (tokio::runtime::Runtime, Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let c = rt.block_on(Client::connect(addr)).unwrap();
    (rt, c)
}

/// A scan request applying `action` to `field` of every object of `tablet`,
/// as operation `op_id`, sent straight to the tablet's shard.
pub fn update_request(
    table: u64,
    tablet: &TabletInfo,
    field: Field,
    action: UpdateAction,
    op_id: u64,
    budget_ms: u32,
) -> Request<'static> {
    Request::Scan {
        table,
        start_hash: tablet.start_hash,
        end_hash: tablet.end_hash,
        map_version: tablet.map_version,
        plan: ScanPlan::new(Op::Update { field, action }),
        op_id,
        budget_ms,
        snapshot_ts: 0,
    }
}
