//! Bounded connections on the coordinator: partly received big frames stay
//! within the frame budget while a fresh client is served; stalled and idle
//! connections are closed after their (short, test-configured) timeouts; at
//! the connection limit the longest-idle connection makes room.

use crate::common;

use std::time::Duration;

use common::*;
use insitu_coordinator::{ConnLimits, CoordinatorConfig};
use insitu_protocol::{HEADER_BYTES, MAX_BODY_BYTES, Request, Response};
use insitu_testkit::raw::{check_frame_budget, check_stalled_and_idle_closed};

/// A safety net for awaits that must end; not a performance assertion.
const SAFETY: Duration = Duration::from_secs(20);

async fn list_servers(handle: &insitu_coordinator::CoordinatorHandle) {
    let conn = connect(handle).await;
    let reply = call(&conn, Request::ListServers).await;
    assert!(matches!(reply.decode().unwrap(), Response::Servers(_)));
}

fn config(dir: &TempDir, limits: ConnLimits) -> CoordinatorConfig {
    let mut c = CoordinatorConfig::new(dir.0.clone());
    c.limits = limits;
    c
}

#[tokio::test]
async fn partly_sent_big_frames_stay_within_the_budget() {
    let dir = TempDir::new("conn-budget");
    let budget = 2 * (HEADER_BYTES + MAX_BODY_BYTES);
    let limits = ConnLimits {
        frame_budget_bytes: budget,
        ..ConnLimits::default()
    };
    let handle = start_coordinator_with(config(&dir, limits)).await;
    let addr = handle.addr().to_string();
    let fresh = async {
        tokio::time::timeout(SAFETY, list_servers(&handle))
            .await
            .expect("a fresh client is served")
    };
    check_frame_budget(&addr, budget, || handle.buffered_frame_bytes(), fresh).await;
    handle.shutdown().await;
}

#[tokio::test]
async fn stalled_and_idle_connections_are_closed() {
    let dir = TempDir::new("conn-stall");
    let limits = ConnLimits {
        stall_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(300),
        ..ConnLimits::default()
    };
    let handle = start_coordinator_with(config(&dir, limits)).await;
    let addr = handle.addr().to_string();
    check_stalled_and_idle_closed(&addr, 300).await;
    list_servers(&handle).await;
    handle.shutdown().await;
}

#[tokio::test]
async fn at_the_limit_the_longest_idle_connection_makes_room() {
    let dir = TempDir::new("conn-evict");
    let limits = ConnLimits {
        max_connections: 4,
        ..ConnLimits::default()
    };
    let handle = start_coordinator_with(config(&dir, limits)).await;
    // Four clients, each answered once, so all four are open and idle, in order.
    let mut idle = Vec::new();
    for _ in 0..4 {
        let conn = connect(&handle).await;
        call(&conn, Request::Ping).await;
        idle.push(conn);
    }
    list_servers(&handle).await;
    // The oldest was closed to let the new client in.
    assert!(
        insitu_testkit::poll_until(2000, || idle[0].is_closed()).await,
        "the longest-idle connection is still open"
    );
    assert!(!idle[3].is_closed());
    handle.shutdown().await;
}
