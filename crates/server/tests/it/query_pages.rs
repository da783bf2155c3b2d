//! Typed-query answers larger than one reply page, on a real server: the
//! pages of one walk are held by the shard and are one instant of the
//! tablet, however the tablet changes while they are fetched; gone pages
//! are refused with `CursorExpired`; and when the memory budget cannot hold
//! them the answer is paged in key-hash order instead, still with every row
//! exactly once.

use crate::common;

use std::collections::HashMap;

use insitu_client::Client;
use insitu_client::rpc::RpcConn;
use insitu_protocol::query::{QueryData, QueryOutput, QueryPlan, QueryResult, QueryResume, Scalar};
use insitu_protocol::schema::Schema;
use insitu_protocol::{Request, Response, Status, TableInfo};

/// Rows of ~500 bytes: 12 000 of them are ~6 MB of Arrow, several 1 MiB pages.
const N: i64 = 12_000;

fn pad(i: i64, round: u32) -> String {
    format!("{round}:{i:0>500}")
}

struct Cluster {
    client: Client,
    info: TableInfo,
    schema: Schema,
    _node: common::Node,
}

/// One server, one shard, a one-tablet typed table holding rows 0..N
/// (round 0), with `memory_mb` of engine budget (None: the default).
async fn cluster(memory_mb: Option<usize>) -> Cluster {
    let node = common::start(|c| {
        if let Some(mb) = memory_mb {
            c.engine.memory_budget_bytes = mb << 20;
        }
    })
    .await;
    let client = Client::connect(&node.addr()).await.unwrap();
    let schema = insitu_rows::text::parse_schema("id int64, pad utf8", "id").unwrap();
    let info = client
        .create_table_with("wide", 1, Some(schema.clone()))
        .await
        .unwrap();
    put_round(&client, info.id, 0).await;
    Cluster {
        client,
        info,
        schema,
        _node: node,
    }
}

async fn put_round(client: &Client, table: u64, round: u32) {
    for start in (0..N).step_by(1000) {
        let rows: Vec<Vec<Scalar>> = (start..start + 1000)
            .map(|i| vec![Scalar::Int(i), Scalar::Str(pad(i, round))])
            .collect();
        for r in client.put_rows(table, &rows).await.unwrap() {
            r.unwrap();
        }
    }
}

fn all_rows() -> QueryPlan {
    QueryPlan {
        filter: Vec::new(),
        output: QueryOutput::Rows {
            columns: vec![0, 1],
            order_by: Vec::new(),
            limit: None,
        },
    }
}

/// One raw `Query` request for the table's only tablet.
async fn page(
    c: &Cluster,
    conn: &RpcConn,
    resume: Option<QueryResume>,
) -> (Status, Option<QueryResult>) {
    let t = &c.info.tablets[0];
    let reply = conn
        .call(&Request::Query {
            table: c.info.id,
            start_hash: t.start_hash,
            end_hash: t.end_hash,
            map_version: t.map_version,
            schema: c.schema.clone(),
            plan: all_rows(),
            resume,
            index: None,
            snapshot_ts: 0,
        })
        .await
        .unwrap();
    if reply.status != Status::Ok {
        return (reply.status, None);
    }
    match reply.decode().unwrap() {
        Response::Query(r) => (Status::Ok, Some(r)),
        other => panic!("unexpected reply {other:?}"),
    }
}

/// id -> pad of every row of a page, asserting none was seen before.
fn collect(seen: &mut HashMap<i64, String>, r: &QueryResult) {
    let QueryData::Rows(bytes) = &r.data else {
        panic!("rows expected")
    };
    for b in insitu_rows::arrow::from_ipc(bytes).unwrap() {
        let ids = b
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        let pads = b
            .column(1)
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .unwrap();
        for i in 0..b.num_rows() {
            let old = seen.insert(ids.value(i), pads.value(i).to_string());
            assert!(old.is_none(), "row {} returned twice", ids.value(i));
        }
    }
}

#[tokio::test]
async fn held_pages_are_one_instant_of_the_tablet_while_it_changes() {
    let c = cluster(None).await;
    let conn = RpcConn::connect(&c.info.tablets[0].addr).await.unwrap();
    let (status, first) = page(&c, &conn, None).await;
    assert_eq!(status, Status::Ok);
    let first = first.unwrap();
    let Some(QueryResume::Held { cursor, page: 1 }) = first.resume else {
        panic!("a held answer expected, got {:?}", first.resume)
    };
    assert_eq!(first.visited, N as u64, "one walk visited the whole tablet");
    let mut seen = HashMap::new();
    collect(&mut seen, &first);

    // Every row is overwritten and a thousand more are added before the
    // other pages are fetched; the cleaner runs too.
    put_round(&c.client, c.info.id, 1).await;
    let extra: Vec<Vec<Scalar>> = (N..N + 1000)
        .map(|i| vec![Scalar::Int(i), Scalar::Str(pad(i, 1))])
        .collect();
    for r in c.client.put_rows(c.info.id, &extra).await.unwrap() {
        r.unwrap();
    }

    let mut resume = first.resume;
    let mut pages = 1;
    while let Some(next) = resume {
        let (status, r) = page(&c, &conn, Some(next)).await;
        assert_eq!(status, Status::Ok, "page {next:?}");
        let r = r.unwrap();
        collect(&mut seen, &r);
        // A resent request for the same page gets it again.
        if pages == 1 {
            let (status, again) = page(&c, &conn, Some(next)).await;
            assert_eq!(status, Status::Ok);
            assert_eq!(again.unwrap().data, r.data);
        }
        resume = r.resume;
        pages += 1;
    }
    assert!(pages > 4, "{pages} pages");
    assert_eq!(seen.len() as i64, N, "the rows of the instant the walk ran");
    for (id, p) in &seen {
        assert_eq!(
            p,
            &pad(*id, 0),
            "row {id} has a value written after the walk"
        );
    }
    // The answer is freed with its last page: asking again is refused, and
    // so is a cursor this shard never handed out.
    let (status, _) = page(&c, &conn, Some(QueryResume::Held { cursor, page: 2 })).await;
    assert_eq!(status, Status::CursorExpired);
    let (status, _) = page(
        &c,
        &conn,
        Some(QueryResume::Held {
            cursor: 9999,
            page: 1,
        }),
    )
    .await;
    assert_eq!(status, Status::CursorExpired);
}

#[tokio::test]
async fn the_client_reads_every_row_once_through_held_pages() {
    let c = cluster(None).await;
    let out = c.client.query(c.info.id, &all_rows()).await.unwrap();
    assert!(out.pages > 4, "{} pages", out.pages);
    assert_eq!(out.matched, N as u64);
    let insitu_client::QueryAnswer::Rows(batches) = out.answer else {
        panic!("rows expected")
    };
    assert_eq!(
        batches.iter().map(|b| b.num_rows()).sum::<usize>(),
        N as usize
    );
}

#[tokio::test]
async fn without_room_to_hold_pages_the_answer_pages_in_hash_order() {
    // ~6 MB of rows in 2 MiB segments (~8 MiB) fit a 14 MiB budget; ~6 MB
    // of held Arrow pages beside them do not.
    let c = cluster(Some(14)).await;
    let conn = RpcConn::connect(&c.info.tablets[0].addr).await.unwrap();
    let mut seen = HashMap::new();
    let mut resume = None;
    let mut pages = 0;
    loop {
        let (status, r) = page(&c, &conn, resume).await;
        assert_eq!(status, Status::Ok);
        let r = r.unwrap();
        if pages == 0 {
            assert!(
                matches!(r.resume, Some(QueryResume::Hash(_))),
                "hash-order paging expected, got {:?}",
                r.resume
            );
        }
        collect(&mut seen, &r);
        pages += 1;
        resume = r.resume;
        if resume.is_none() {
            break;
        }
    }
    assert!(pages > 4, "{pages} pages");
    assert_eq!(seen.len() as i64, N);
    // The client reads the same answer through the same fallback.
    let out = c.client.query(c.info.id, &all_rows()).await.unwrap();
    assert_eq!(out.matched, N as u64);
    // At a snapshot the answer must fit the held pages (the hash-order
    // paging reads only the newest rows): refused, saying so. Fresh
    // timestamps until the shard keeps versions.
    let mut tries = 0;
    let e = loop {
        let ts = c.client.timestamp().await.unwrap();
        match c.client.query_at(c.info.id, &all_rows(), None, ts).await {
            Err(e) if e.status() == Some(Status::SnapshotTooOld) && tries < 50 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => break other.expect_err("an answer at a snapshot over the held pages"),
        }
    };
    assert_eq!(e.status(), Some(Status::BadRequest), "{e}");
    assert!(
        e.to_string().contains("more than one tablet may hold"),
        "{e}"
    );
}
