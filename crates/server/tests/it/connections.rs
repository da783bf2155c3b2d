//! Bounded connections: partly received frames stay within the shard's frame
//! budget and a fresh client is still served; stalled and idle connections are
//! closed after their (short, test-configured) timeouts; at the connection
//! limit the longest-idle connection makes room for a new one, on a shard's
//! port and on the backup port.

use crate::common;

use std::time::Duration;

use bytes::BytesMut;
use insitu_client::RpcConn;
use insitu_protocol::frame::{FrameKind, HEADER_BYTES, check_header};
use insitu_protocol::{MAX_BODY_BYTES, Request, Response, Status, encode_request};
use insitu_server::{ConnLimits, MAX_FRAME_BYTES};
use insitu_testkit::raw::{check_frame_budget, check_stalled_and_idle_closed, until_closed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A safety net for awaits that must end; not a performance assertion.
const SAFETY: Duration = Duration::from_secs(20);

struct Cluster {
    node: common::Node,
    shard: String,
}

async fn cluster(limits: ConnLimits) -> Cluster {
    let node = common::start(|c| c.limits = limits).await;
    let shard = node.shard(0);
    Cluster { node, shard }
}

impl Cluster {
    async fn stop(self) {
        self.node.server.shutdown();
        self.node.coordinator.shutdown().await;
    }
}

async fn ping(addr: &str) {
    let conn = tokio::time::timeout(SAFETY, RpcConn::connect(addr))
        .await
        .unwrap()
        .unwrap();
    let reply = tokio::time::timeout(SAFETY, conn.call(&Request::Ping))
        .await
        .expect("a fresh client is served")
        .unwrap();
    assert!(matches!(reply.decode().unwrap(), Response::Pong));
}

/// A Ping on a raw socket, waiting for its whole reply.
async fn raw_ping(s: &mut TcpStream) {
    let mut out = BytesMut::new();
    encode_request(&mut out, 7, &Request::Ping).unwrap();
    s.write_all(&out).await.unwrap();
    let mut head = [0u8; HEADER_BYTES];
    s.read_exact(&mut head).await.unwrap();
    let (h, body_len) = check_header(&head, MAX_BODY_BYTES).unwrap().unwrap();
    assert_eq!(
        (h.kind, h.request_id, h.status),
        (FrameKind::Response, 7, Status::Ok)
    );
    let mut body = vec![0u8; body_len];
    s.read_exact(&mut body).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn partly_sent_big_frames_stay_within_the_budget() {
    let budget = 2 * MAX_FRAME_BYTES;
    let c = cluster(ConnLimits {
        max_connections: 1000,
        frame_budget_bytes: budget,
        ..ConnLimits::default()
    })
    .await;
    let buffered = || {
        let (buffered, total) = c.node.server.buffered_frame_bytes()[0];
        assert_eq!(total, budget);
        buffered
    };
    check_frame_budget(&c.shard, budget, buffered, ping(&c.shard)).await;
    c.stop().await;
}

#[tokio::test(flavor = "current_thread")]
async fn stalled_and_idle_connections_are_closed() {
    let c = cluster(ConnLimits {
        stall_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(300),
        ..ConnLimits::default()
    })
    .await;
    check_stalled_and_idle_closed(&c.shard, 300).await;
    // Meanwhile others are served.
    ping(&c.shard).await;
    // The budget was never touched by the small frames.
    assert_eq!(c.node.server.buffered_frame_bytes()[0].0, 0);
    c.stop().await;
}

#[tokio::test(flavor = "current_thread")]
async fn at_the_limit_the_longest_idle_connection_makes_room() {
    let c = cluster(ConnLimits {
        max_connections: 4,
        ..ConnLimits::default()
    })
    .await;
    // Four connections, each answered once (so accepted and idle, in order).
    let mut idle = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(&c.shard).await.unwrap();
        raw_ping(&mut s).await;
        idle.push(s);
    }
    ping(&c.shard).await;
    // The oldest was closed to let the new client in.
    assert!(until_closed(&mut idle[0]).await.is_empty());
    c.stop().await;
}

/// The backup port has the same limit: at it, the longest-idle connection
/// makes room. The coordinator's failure detector holds a connection to
/// this port too (it pings it), so which connections are evicted is not
/// exact: 8 connections arrive at a limit of 4, each pinged once, so at
/// least 4 evictions happen; the detector's connection, which is idle again
/// and re-registered after every ping, can take at most a couple of them
/// and the rest fall on the oldest of these 8: the first two are closed,
/// and a fresh client is served.
#[tokio::test(flavor = "current_thread")]
async fn the_backup_port_at_its_limit_evicts_the_longest_idle() {
    let c = cluster(ConnLimits {
        max_connections: 4,
        ..ConnLimits::default()
    })
    .await;
    let backup = c.node.server.backup_addr.to_string();
    let mut idle = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(&backup).await.unwrap();
        raw_ping(&mut s).await;
        idle.push(s);
    }
    ping(&backup).await;
    assert!(until_closed(&mut idle[0]).await.is_empty());
    assert!(until_closed(&mut idle[1]).await.is_empty());
    c.stop().await;
}
