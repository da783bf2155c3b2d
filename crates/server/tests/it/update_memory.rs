//! An update's list of matched keys is charged to the server's memory
//! budget: an update whose list would not fit is refused before it writes
//! anything, and the objects keep their values.

use crate::common;

use insitu_client::Client;
use insitu_protocol::Number;
use insitu_protocol::plan::{Field, Op, ScanPlan, UpdateAction};

/// Server memory budget: small, so the test fills it quickly.
const BUDGET_BYTES: usize = 32 << 20;

/// Long keys and 8-byte values: the key list is about as large as the data.
fn key(i: usize) -> Vec<u8> {
    format!("{i:08}-{}", "k".repeat(4000)).into_bytes()
}

#[tokio::test]
async fn an_update_whose_key_list_does_not_fit_the_budget_writes_nothing() {
    let node = common::start(|c| c.engine.memory_budget_bytes = BUDGET_BYTES).await;
    let client = Client::connect(&node.addr()).await.unwrap();
    let table = client.create_table("big", 1).await.unwrap().id;
    // Fill to a bit under half of the budget: the data fits, data plus a
    // copy of every key does not.
    let objects = BUDGET_BYTES * 45 / 100 / (key(0).len() + 40);
    let items: Vec<(Vec<u8>, Vec<u8>)> = (0..objects)
        .map(|i| (key(i), 10i64.to_le_bytes().to_vec()))
        .collect();
    for chunk in items.chunks(500) {
        for r in client.multi_write(table, chunk).await.unwrap() {
            r.expect("the data fits the budget");
        }
    }
    let plan = ScanPlan::new(Op::Update {
        field: Field::I64(0),
        action: UpdateAction::Add(Number::I64(1)),
    });
    let refused = client
        .execute_plan(table, &plan)
        .await
        .expect_err("the key list cannot fit");
    let message = refused.to_string();
    assert!(
        message.contains("does not fit in this server's memory budget")
            && message.contains("nothing was written"),
        "{message}"
    );
    for i in (0..objects).step_by(97) {
        let (value, _) = client.read(table, key(i)).await.unwrap().expect("present");
        assert_eq!(&value[..], &10i64.to_le_bytes(), "object {i} unchanged");
    }
    // A count (no key list) still runs, and a filtered update that matches
    // few keys fits and applies.
    let small = ScanPlan {
        key_range: Some(insitu_protocol::plan::KeyRange {
            start: key(0),
            end: Some(key(10)),
        }),
        ..plan.clone()
    };
    let applied = client
        .execute_plan(table, &small)
        .await
        .expect("a small update fits");
    assert_eq!(applied.matched, 10);
    node.server.shutdown();
    node.coordinator.shutdown().await;
}
