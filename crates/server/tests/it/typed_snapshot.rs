//! Typed queries at a snapshot on a real server with two shards: rows,
//! aggregates and index probes read as of the snapshot's timestamp while
//! transactions overwrite, remove and insert rows after it; a timestamp the
//! shards keep nothing for is refused, not answered from today's rows.

use crate::common;

use std::time::Duration;

use insitu_client::{Client, ClientConfig, QueryAnswer, Status};
use insitu_protocol::query::{IndexProbe, Pred, QueryOutput, QueryPlan, Scalar};
use insitu_protocol::schema::Schema;
use insitu_rows::arrow::batch_row;
use insitu_rows::{RowLayout, encode_key, encode_row};

fn schema() -> Schema {
    insitu_rows::text::parse_schema("id int64, grp int64, v int64", "id").unwrap()
}

fn row(id: i64, grp: i64, v: i64) -> Vec<Scalar> {
    vec![Scalar::Int(id), Scalar::Int(grp), Scalar::Int(v)]
}

/// Every row (id, grp, v) `plan` returns at `ts` (0: now), sorted by id.
async fn rows_at(
    client: &Client,
    table: u64,
    (filter, probe): (Vec<Pred>, Option<&IndexProbe>),
    ts: u64,
) -> Result<Vec<(i64, i64, i64)>, Status> {
    let plan = QueryPlan {
        filter,
        output: QueryOutput::Rows {
            columns: vec![0, 1, 2],
            order_by: Vec::new(),
            limit: None,
        },
    };
    let out = client
        .query_at(table, &plan, probe, ts)
        .await
        .map_err(|e| e.status().unwrap_or(Status::Internal))?;
    let QueryAnswer::Rows(batches) = out.answer else {
        panic!("rows expected");
    };
    let mut rows: Vec<(i64, i64, i64)> = batches
        .iter()
        .flat_map(|b| (0..b.num_rows()).map(move |i| batch_row(b, i).unwrap()))
        .map(|r| match r.as_slice() {
            [Scalar::Int(a), Scalar::Int(b), Scalar::Int(c)] => (*a, *b, *c),
            other => panic!("{other:?}"),
        })
        .collect();
    rows.sort();
    Ok(rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_queries_at_a_snapshot_read_the_rows_as_of_its_timestamp() {
    let node = common::start(|c| c.shards = 2).await;
    let config = ClientConfig {
        op_timeout: Duration::from_secs(30),
        ..ClientConfig::default()
    };
    let client = Client::connect_with(&node.addr(), config).await.unwrap();
    let schema = schema();
    let t = client
        .create_table_with("snaprows", 4, Some(schema.clone()))
        .await
        .unwrap()
        .id;
    client.set_index("snaprows", "grp", true).await.unwrap();
    // 300 rows: id, grp = id % 5, v = id.
    let initial: Vec<Vec<Scalar>> = (0..300).map(|i| row(i, i % 5, i)).collect();
    for r in client.put_rows(t, &initial).await.unwrap() {
        r.unwrap();
    }
    let then: Vec<(i64, i64, i64)> = (0..300).map(|i| (i, i % 5, i)).collect();

    // Before any snapshot read the shards keep no versions: a timestamp
    // from then is refused, not answered from today's rows.
    let early = client.timestamp().await.unwrap();
    assert_eq!(
        rows_at(&client, t, (vec![], None), early).await,
        Err(Status::SnapshotTooOld)
    );
    // Fresh timestamps until every shard keeps versions.
    let mut tries = 0;
    let before = loop {
        let ts = client.timestamp().await.unwrap();
        match rows_at(&client, t, (vec![], None), ts).await {
            Ok(rows) => {
                assert_eq!(rows, then);
                break ts;
            }
            Err(Status::SnapshotTooOld) if tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };

    // After the snapshot, transactions: rows 0..40 move to grp 9 with a new
    // v, rows 40..50 go, rows 300..310 come (grp 1).
    let layout = RowLayout::new(&schema);
    let enc = |r: &[Scalar]| {
        (
            encode_key(&schema, r).unwrap(),
            encode_row(&schema, &layout, r).unwrap(),
        )
    };
    for chunk in 0..5i64 {
        let writes: Vec<(Vec<u8>, Vec<u8>)> = (chunk * 8..chunk * 8 + 8)
            .map(|i| enc(&row(i, 9, i + 1000)))
            .chain((300 + chunk * 2..300 + chunk * 2 + 2).map(|i| enc(&row(i, 1, i))))
            .collect();
        let removes: Vec<Vec<u8>> = (40 + chunk * 2..40 + chunk * 2 + 2)
            .map(|i| enc(&row(i, i % 5, i)).0)
            .collect();
        client
            .transaction(|mut tx| {
                let (writes, removes) = (writes.clone(), removes.clone());
                async move {
                    for (k, v) in writes {
                        tx.write(t, k, v);
                    }
                    for k in removes {
                        tx.remove(t, k);
                    }
                    Ok((tx, ()))
                }
            })
            .await
            .unwrap();
    }
    let now: Vec<(i64, i64, i64)> = (0..310)
        .filter(|i| !(40..50).contains(i))
        .map(|i| match i {
            0..40 => (i, 9, i + 1000),
            300.. => (i, 1, i),
            _ => (i, i % 5, i),
        })
        .collect();

    // The whole table, then and now.
    assert_eq!(
        rows_at(&client, t, (vec![], None), before).await,
        Ok(then.clone())
    );
    assert_eq!(
        rows_at(&client, t, (vec![], None), 0).await,
        Ok(now.clone())
    );
    // Through the index: grp 1 at the snapshot includes the rows that left
    // it since (moved to grp 9 or removed) and not the ones that came.
    for g in [1, 9] {
        let (filter, probe) = common::typed::int_eq(1, g);
        for (ts, rows) in [(before, &then), (0, &now)] {
            let want: Vec<_> = rows.iter().copied().filter(|r| r.1 == g).collect();
            assert_eq!(
                rows_at(&client, t, (filter.clone(), Some(&probe)), ts).await,
                Ok(want.clone()),
                "grp {g} at {ts} through the index"
            );
            assert_eq!(
                rows_at(&client, t, (filter.clone(), None), ts).await,
                Ok(want),
                "grp {g} at {ts} by scan"
            );
        }
    }
    // A timestamp not handed out yet is refused before any read.
    let future = client.timestamp().await.unwrap() + 3_600_000_000;
    assert_eq!(
        rows_at(&client, t, (vec![], None), future).await,
        Err(Status::BadRequest)
    );
}
