//! An aggregate whose argument (or sum) does not fit 128 bits fails with a clear error
//! the query's fault (`BadRequest`), found when the servers' last batch of
//! rows is aggregated (`agg_fast.rs`), and the server goes on serving.

use crate::common;

use insitu_client::{Client, Status};
use insitu_protocol::query::{AggFunc, AggSpec, QueryOutput, QueryPlan, Scalar, ValueOp};

#[tokio::test]
async fn an_aggregate_past_128_bits_is_the_querys_error_not_the_servers() {
    let node = common::start(|_| {}).await;
    let client = Client::connect(&node.addr()).await.unwrap();
    let schema = insitu_rows::text::parse_schema("id int64, x int64", "id").unwrap();
    let info = client
        .create_table_with("big", 1, Some(schema))
        .await
        .unwrap();
    // Fewer rows than a batch: the error comes when the sink finishes.
    let rows: Vec<Vec<Scalar>> = (0..3)
        .map(|i| vec![Scalar::Int(i), Scalar::Int(i64::MAX)])
        .collect();
    for r in client.put_rows(info.id, &rows).await.unwrap() {
        r.unwrap();
    }
    let cube = vec![
        ValueOp::Col(1),
        ValueOp::Col(1),
        ValueOp::Mul,
        ValueOp::Col(1),
        ValueOp::Mul,
    ];
    let plan = |arg: Vec<ValueOp>| QueryPlan {
        filter: vec![],
        output: QueryOutput::Aggregate {
            group_by: vec![],
            aggs: vec![AggSpec {
                func: AggFunc::Sum,
                arg,
            }],
        },
    };
    let e = client.query(info.id, &plan(cube)).await.unwrap_err();
    assert_eq!(e.status(), Some(Status::BadRequest), "{e}");
    assert!(e.to_string().contains("overflow"), "{e}");
    // The server still answers the same table.
    let ok = client.query(info.id, &plan(vec![ValueOp::Col(0)])).await;
    assert!(ok.is_ok(), "{ok:?}");
    drop(node);
}
