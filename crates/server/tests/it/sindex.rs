//! Secondary indexes on a real server: a probed query returns exactly what
//! the same query without the probe returns (the log walk), through random
//! inserts, overwrites that move rows between index values, and removes;
//! it visits only the candidate rows; and it survives a table's re-creation.

use crate::common;

use std::collections::BTreeMap;

use insitu_client::{Client, QueryAnswer};
use insitu_protocol::query::{IndexProbe, Pred, QueryOutput, QueryPlan, Scalar};
use insitu_protocol::schema::Schema;

struct Cluster {
    client: Client,
    _node: common::Node,
}

async fn cluster() -> Cluster {
    let node = common::start(|c| c.shards = 2).await;
    let client = Client::connect(&node.addr()).await.unwrap();
    Cluster {
        client,
        _node: node,
    }
}

fn schema() -> Schema {
    insitu_rows::text::parse_schema(
        "id int64, grp int64, name utf8, price decimal(10,2) null",
        "id",
    )
    .unwrap()
}

/// (grp, name, price) of a row.
type Row = (i64, String, Option<i64>);

fn row(id: i64, r: &Row) -> Vec<Scalar> {
    vec![
        Scalar::Int(id),
        Scalar::Int(r.0),
        Scalar::Str(r.1.clone()),
        r.2.map_or(Scalar::Null, |value| Scalar::Decimal { value, scale: 2 }),
    ]
}

fn ids_plan(filter: Vec<Pred>) -> QueryPlan {
    QueryPlan {
        filter,
        output: QueryOutput::Rows {
            columns: vec![0],
            order_by: Vec::new(),
            limit: None,
        },
    }
}

fn random_row(rng: &mut fastrand::Rng) -> Row {
    (
        rng.i64(0..20),
        format!("n{}", rng.u8(0..6)),
        (rng.u8(0..5) > 0).then(|| rng.i64(0..5000)),
    )
}

/// `grp = g` as a filter, and as the probe of the index on grp.
fn grp_is(g: i64) -> (QueryPlan, IndexProbe) {
    let (filter, probe) = common::typed::int_eq(1, g);
    (ids_plan(filter), probe)
}

/// Create typed table `name` (the test schema) in `tablets` tablets.
async fn create(c: &Client, name: &str, tablets: u32) -> u64 {
    c.create_table_with(name, tablets, Some(schema()))
        .await
        .unwrap()
        .id
}

/// The ids a query returns (sorted) and the rows it visited.
async fn ids(
    c: &Client,
    table: u64,
    plan: &QueryPlan,
    probe: Option<&IndexProbe>,
) -> (Vec<i64>, u64) {
    let out = c.query_with(table, plan, probe).await.unwrap();
    let QueryAnswer::Rows(batches) = out.answer else {
        panic!("rows expected")
    };
    let mut ids = Vec::new();
    for b in batches {
        let a = b
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        ids.extend(a.values().iter().copied());
    }
    ids.sort_unstable();
    (ids, out.visited)
}

/// Every probe shape against the model and against the unprobed query.
async fn check(c: &Client, table: u64, model: &BTreeMap<i64, Row>) {
    let want = |f: &dyn Fn(&Row) -> bool| -> Vec<i64> {
        model
            .iter()
            .filter(|(_, r)| f(r))
            .map(|(id, _)| *id)
            .collect()
    };
    for g in [0i64, 3, 7, 19] {
        let (plan, probe) = grp_is(g);
        let (got, visited) = ids(c, table, &plan, Some(&probe)).await;
        let expected = want(&|r: &Row| r.0 == g);
        assert_eq!(got, expected, "grp = {g}");
        assert_eq!(
            visited,
            expected.len() as u64,
            "only candidates are visited"
        );
        assert_eq!(ids(c, table, &plan, None).await.0, expected);
    }
    // IN on text, and a range on a decimal.
    let names = vec![Scalar::Str("n1".into()), Scalar::Str("n4".into())];
    let plan = ids_plan(vec![Pred::In {
        col: 2,
        values: names.clone(),
    }]);
    let probe = IndexProbe::Eq {
        col: 2,
        values: names,
    };
    let expected = want(&|r: &Row| r.1 == "n1" || r.1 == "n4");
    assert_eq!(ids(c, table, &plan, Some(&probe)).await.0, expected);
    let (lo, hi) = (
        Scalar::Decimal {
            value: 1000,
            scale: 2,
        },
        Scalar::Decimal {
            value: 2000,
            scale: 2,
        },
    );
    let plan = ids_plan(vec![Pred::Between {
        col: 3,
        lo: lo.clone(),
        hi: hi.clone(),
    }]);
    let probe = IndexProbe::Range {
        col: 3,
        lo: Some((lo, true)),
        hi: Some((hi, true)),
    };
    let expected = want(&|r: &Row| r.2.is_some_and(|p| (1000..=2000).contains(&p)));
    let (got, visited) = ids(c, table, &plan, Some(&probe)).await;
    assert_eq!(got, expected);
    assert_eq!(visited, expected.len() as u64);
    assert_eq!(ids(c, table, &plan, None).await.0, expected);
}

#[tokio::test]
async fn probes_match_the_log_walk_through_random_writes() {
    let c = cluster().await;
    let table = create(&c.client, "items", 4).await;
    let mut rng = insitu_testkit::rng(7);
    let mut model: BTreeMap<i64, Row> = BTreeMap::new();
    let mut put = Vec::new();
    for id in 0..3000 {
        let r = random_row(&mut rng);
        put.push(row(id, &r));
        model.insert(id, r);
    }
    for r in c.client.put_rows(table, &put).await.unwrap() {
        r.unwrap();
    }
    for column in ["grp", "name", "price"] {
        c.client.set_index("items", column, true).await.unwrap();
    }
    check(&c.client, table, &model).await;

    for round in 0..6 {
        // Overwrites (moving rows between index values), inserts, removes.
        let mut put = Vec::new();
        for _ in 0..400 {
            let id = rng.i64(0..3600);
            let r = random_row(&mut rng);
            put.push(row(id, &r));
            model.insert(id, r);
        }
        for r in c.client.put_rows(table, &put).await.unwrap() {
            r.unwrap();
        }
        for _ in 0..150 {
            let id = rng.i64(0..3600);
            if let Some(old) = model.remove(&id) {
                let key = insitu_rows::encode_key(&schema(), &row(id, &old)).unwrap();
                c.client.remove(table, &key).await.unwrap();
            }
        }
        check(&c.client, table, &model).await;
        if round == 3 {
            // Wait past the shards' keep-up period: changes applied in the
            // background give the same answers.
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }

    // A dropped and re-created table is a new tablet instance: its index
    // is built afresh, not served from the old one.
    c.client.drop_table("items").await.unwrap();
    let table = create(&c.client, "items", 4).await;
    c.client.set_index("items", "grp", true).await.unwrap();
    let r: Row = (7, "n1".into(), None);
    for x in c.client.put_rows(table, &[row(1, &r)]).await.unwrap() {
        x.unwrap();
    }
    let (plan, probe) = grp_is(7);
    assert_eq!(ids(&c.client, table, &plan, Some(&probe)).await.0, vec![1]);
}

#[tokio::test]
async fn a_probe_matching_more_than_the_candidate_limit_scans_instead() {
    let c = cluster().await;
    let table = create(&c.client, "wide", 1).await;
    // One more row of grp 0 than a tablet's candidate limit, and ten of grp 1.
    let n = 100_001i64;
    for start in (0..n + 10).step_by(10_000) {
        let rows: Vec<Vec<Scalar>> = (start..(start + 10_000).min(n + 10))
            .map(|id| row(id, &(i64::from(id >= n), "n".into(), None)))
            .collect();
        for r in c.client.put_rows(table, &rows).await.unwrap() {
            r.unwrap();
        }
    }
    c.client.set_index("wide", "grp", true).await.unwrap();
    // Selective: only the ten candidates are visited.
    let (plan, probe) = grp_is(1);
    let (got, visited) = ids(&c.client, table, &plan, Some(&probe)).await;
    assert_eq!((got.len(), visited), (10, 10));
    // Not selective: the whole tablet is walked, with the same answer.
    let (plan, probe) = grp_is(0);
    let (got, visited) = ids(&c.client, table, &plan, Some(&probe)).await;
    assert_eq!(got.len() as i64, n);
    assert_eq!(visited, n as u64 + 10, "a log walk visits every row");
}

#[tokio::test]
async fn bad_declarations_are_refused_clearly() {
    let c = cluster().await;
    create(&c.client, "items", 1).await;
    c.client.create_table("blobs", 1).await.unwrap();
    let err = |e: insitu_client::ClientError| e.to_string();
    let e = err(c.client.set_index("items", "nope", true).await.unwrap_err());
    assert!(e.contains("no column \"nope\"") && e.contains("grp"), "{e}");
    let e = err(c.client.set_index("blobs", "x", true).await.unwrap_err());
    assert!(e.contains("untyped"), "{e}");
    let e = err(c.client.set_index("missing", "x", true).await.unwrap_err());
    assert!(e.contains("no table"), "{e}");
    c.client.set_index("items", "grp", true).await.unwrap();
    let e = err(c.client.set_index("items", "grp", true).await.unwrap_err());
    assert!(e.contains("already indexed"), "{e}");
    c.client.set_index("items", "grp", false).await.unwrap();
    let e = err(c.client.set_index("items", "grp", false).await.unwrap_err());
    assert!(e.contains("has no index"), "{e}");
    let listed = c.client.open_table("items").await.unwrap();
    assert!(listed.indexes.is_empty());
    c.client.set_index("items", "name", true).await.unwrap();
    assert_eq!(c.client.open_table("items").await.unwrap().indexes, vec![2]);
}
