//! The timestamp oracle over real TCP, through the Rust client: concurrent
//! callers get distinct timestamps, and after the coordinator stops like a
//! killed process and starts again over the same directory (on the same
//! address, so the same client carries on), every timestamp is greater than
//! every one handed out before, even when those ran far ahead of the clock.

use crate::common;

use std::collections::HashSet;

use common::*;
use insitu_client::{Client, ClientConfig};
use insitu_protocol::{MAX_TIMESTAMPS, Request, Response, Status};

/// `total` timestamps from `tasks` tasks calling `client.timestamp()` at
/// once; checks they are distinct and returns them.
async fn take_concurrently(client: &Client, tasks: usize, total: usize) -> Vec<u64> {
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let client = client.clone();
            let n = total / tasks + usize::from(t < total % tasks);
            tokio::spawn(async move {
                let mut mine = Vec::with_capacity(n);
                for _ in 0..n {
                    mine.push(client.timestamp().await.expect("a timestamp"));
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::with_capacity(total);
    for handle in handles {
        let mine = handle.await.expect("task");
        assert!(mine.windows(2).all(|w| w[1] > w[0]), "one caller's go up");
        all.extend(mine);
    }
    let distinct: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), total, "a timestamp was handed out twice");
    assert!(!distinct.contains(&0));
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clients_timestamps_increase_across_a_coordinator_restart() {
    let dir = TempDir::new("timestamps");
    let coord = start_coordinator(&dir).await;
    let addr = coord.addr();
    let client = Client::connect_with(&addr.to_string(), ClientConfig::default())
        .await
        .expect("connect");
    let mut highest = *take_concurrently(&client, 16, 1000)
        .await
        .iter()
        .max()
        .unwrap();

    // Run ~20 s of timestamps ahead of the clock (past two reservations), so
    // only the reservation on record, not the clock, can put the restarted
    // oracle above them.
    let conn = connect(&coord).await;
    for _ in 0..300 {
        let request = Request::Timestamps {
            count: MAX_TIMESTAMPS,
        };
        match expect_ok(&call(&conn, request).await) {
            Response::Timestamps { first, count } => {
                assert_eq!(count, MAX_TIMESTAMPS);
                assert!(first > highest, "{first} after {highest}");
                highest = first + u64::from(count) - 1;
            }
            other => panic!("expected Timestamps, got {other:?}"),
        }
    }
    for count in [0, MAX_TIMESTAMPS + 1] {
        let reply = call(&conn, Request::Timestamps { count }).await;
        expect_err(&reply, Status::BadRequest);
    }
    drop(conn);

    coord.crash().await;
    let coord = start_coordinator_on(&dir, addr).await;
    // The same client reconnects by itself.
    let next = client
        .timestamp()
        .await
        .expect("a timestamp after the restart");
    assert!(
        next > highest,
        "{next} after {highest}, handed out before the restart"
    );
    let after = take_concurrently(&client, 16, 1000).await;
    assert!(after.iter().all(|&ts| ts > next));

    // A clean stop keeps the promise too.
    let highest = *after.iter().max().unwrap();
    coord.shutdown().await;
    let coord = start_coordinator_on(&dir, addr).await;
    assert!(client.timestamp().await.expect("a timestamp") > highest);
    coord.shutdown().await;
}
