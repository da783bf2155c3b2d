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

/// The sum of a typed column read with `query_snapshot` (`AtSnapshot::Auto`
/// on 4 tablets: one fresh timestamp per query) never shows half of a
/// transaction, while one writes pairs of rows that sum to zero: each
/// commit sets row 2j to i and row 2j+1 to -i, and the two rows of a pair
/// lie on different tablets for most pairs. Read each tablet as it is, a
/// sum could see one row of a commit and not the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_sums_at_a_snapshot_never_see_half_a_transaction() {
    use insitu_client::AtSnapshot;
    let node = common::start(|c| c.shards = 2).await;
    let config = ClientConfig {
        op_timeout: Duration::from_secs(30),
        ..ClientConfig::default()
    };
    let client = Client::connect_with(&node.addr(), config).await.unwrap();
    let schema = insitu_rows::text::parse_schema("id int64, bal int64", "id").unwrap();
    let t = client
        .create_table_with("pairs", 4, Some(schema.clone()))
        .await
        .unwrap()
        .id;
    const PAIRS: i64 = 16;
    let zeros: Vec<Vec<Scalar>> = (0..2 * PAIRS)
        .map(|id| vec![Scalar::Int(id), Scalar::Int(0)])
        .collect();
    for r in client.put_rows(t, &zeros).await.unwrap() {
        r.unwrap();
    }
    let plan = QueryPlan {
        filter: Vec::new(),
        output: QueryOutput::Rows {
            columns: vec![0, 1],
            order_by: Vec::new(),
            limit: None,
        },
    };
    // (rows, sum of bal, snapshot read) of one query.
    let read = |at: AtSnapshot| {
        let (client, plan) = (client.clone(), plan.clone());
        async move {
            let out = client.query_snapshot(t, &plan, None, at).await.unwrap();
            let QueryAnswer::Rows(batches) = out.answer else {
                panic!("rows expected");
            };
            let (mut n, mut sum) = (0, 0i64);
            for b in &batches {
                for i in 0..b.num_rows() {
                    let Ok([_, Scalar::Int(bal)]) =
                        <[Scalar; 2]>::try_from(batch_row(b, i).unwrap())
                    else {
                        panic!("two int64 columns expected");
                    };
                    n += 1;
                    sum += bal;
                }
            }
            (n, sum, out.snapshot_ts)
        }
    };
    assert_eq!(read(AtSnapshot::Auto).await.0, 2 * PAIRS);
    assert_eq!(read(AtSnapshot::Off).await.2, 0, "Off reads no snapshot");

    let writer = {
        let (client, schema) = (client.clone(), schema.clone());
        tokio::spawn(async move {
            for i in 1..=150i64 {
                let j = i % PAIRS;
                let (client, schema) = (client.clone(), schema.clone());
                client
                    .transaction(|mut tx| {
                        let schema = schema.clone();
                        async move {
                            let a = [Scalar::Int(2 * j), Scalar::Int(i)];
                            let b = [Scalar::Int(2 * j + 1), Scalar::Int(-i)];
                            tx.write_row(t, &schema, &a)?;
                            tx.write_row(t, &schema, &b)?;
                            Ok((tx, ()))
                        }
                    })
                    .await
                    .unwrap();
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() {
        let (n, sum, ts) = read(AtSnapshot::Auto).await;
        assert!(ts != 0, "4 tablets: Auto reads one snapshot");
        assert_eq!((n, sum), (2 * PAIRS, 0), "at snapshot {ts}");
        reads += 1;
    }
    writer.await.unwrap();
    assert!(reads > 0);
    let (n, sum, _) = read(AtSnapshot::On).await;
    assert_eq!((n, sum), (2 * PAIRS, 0));
}
