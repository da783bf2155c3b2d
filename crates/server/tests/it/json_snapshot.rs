//! JSON paths at a snapshot: an aggregate or a filtered count of a JSON
//! path as of a timestamp reads each object's version of then, through the
//! same overlay of kept versions as the other kernels, while later commits
//! changed, removed and replaced documents (one with bytes that are not
//! JSON).

use crate::common;

use insitu_client::{AtSnapshot, Client, Selection};
use insitu_compute::expr::parse_where;
use insitu_compute::parse_path;

fn at(mode: AtSnapshot, filter: &str) -> Selection {
    Selection {
        at_snapshot: mode,
        ..Selection::filter(parse_where(filter).unwrap())
    }
}

/// (count, sum) of the numbers at `$.n` as of `mode`.
async fn sum(client: &Client, t: u64, mode: AtSnapshot) -> (u64, i128) {
    let sel = Selection {
        at_snapshot: mode,
        ..Selection::all()
    };
    let a = client
        .aggregate_json(t, parse_path("$.n").unwrap(), &sel)
        .await
        .unwrap();
    (a.count, a.sum_int)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_paths_read_each_object_as_of_the_snapshot() {
    let node = common::start(|c| c.shards = 2).await;
    let client = Client::connect(&node.addr()).await.unwrap();
    let t = client.create_table("docs", 4).await.unwrap().id;
    for (k, n) in [("a", 5), ("b", 10), ("c", 100)] {
        let doc = format!("{{\"n\": {n}, \"name\": \"{k}\"}}");
        client.write(t, k, doc.into_bytes()).await.unwrap();
    }
    // The first snapshot read makes the shards keep replaced versions.
    assert_eq!(sum(&client, t, AtSnapshot::On).await, (3, 115));
    let before = client.timestamp().await.unwrap();
    client
        .transaction(|mut tx| async move {
            tx.write(t, "a", br#"{"n": 7, "name": "a"}"#);
            tx.remove(t, "c");
            tx.write(t, "d", br#"{"n": 1000, "name": "d"}"#);
            tx.write(t, "b", b"no longer JSON");
            Ok((tx, ()))
        })
        .await
        .unwrap();
    let after = client.timestamp().await.unwrap();
    assert_eq!(sum(&client, t, AtSnapshot::At(before)).await, (3, 115));
    assert_eq!(sum(&client, t, AtSnapshot::At(after)).await, (2, 1007));
    let count = |mode, filter: &'static str| {
        let client = client.clone();
        async move { client.count(t, &at(mode, filter)).await.unwrap() }
    };
    assert_eq!(count(AtSnapshot::At(before), "$.n > 6").await, 2);
    assert_eq!(count(AtSnapshot::At(after), "$.n > 6").await, 2);
    assert_eq!(count(AtSnapshot::At(before), "not $.n > 6").await, 1);
    assert_eq!(count(AtSnapshot::At(after), "not $.n > 6").await, 0);
    assert_eq!(count(AtSnapshot::At(before), "$.name = 'c'").await, 1);
    assert_eq!(count(AtSnapshot::At(after), "$.name = 'c'").await, 0);
    assert_eq!(count(AtSnapshot::Off, "$.name <> 'x'").await, 2);
}
