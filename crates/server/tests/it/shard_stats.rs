//! `ShardStats::longest_point_call_us`: the longest single point request of
//! a window, and `reset_longest_call` starting a new window (what
//! `insitu bench kv` brackets each case with).

use crate::common;

use insitu_client::Client;

#[tokio::test]
async fn the_longest_point_call_is_recorded_and_a_reset_starts_a_new_window() {
    let node = common::start(|_| {}).await;
    let shard = node.shard(0);
    let client = Client::connect(&node.addr()).await.unwrap();
    let info = client.create_table("stats", 1).await.unwrap();
    let stats = client.shard_stats_with(&shard, true).await.unwrap();
    assert_eq!(stats.longest_point_call_us, 0, "no point request yet");
    let big = vec![7u8; 512 << 10];
    client.write(info.id, b"big", &big).await.unwrap();
    let first = client.shard_stats_with(&shard, true).await.unwrap();
    assert!(first.longest_point_call_us >= 1, "{first:?}");
    // The reset took effect: nothing ran since.
    let empty = client.shard_stats_with(&shard, false).await.unwrap();
    assert_eq!(empty.longest_point_call_us, 0);
    // Without a reset the figure stays (the status page reads it so).
    client.read(info.id, b"big").await.unwrap();
    let a = client.shard_stats(&shard).await.unwrap();
    let b = client.shard_stats(&shard).await.unwrap();
    assert!(a.longest_point_call_us >= 1);
    assert_eq!(a.longest_point_call_us, b.longest_point_call_us);
    node.server.shutdown();
    node.coordinator.shutdown().await;
}
