//! What the coordinator reports on the metrics port: requests by kind (and
//! refusals by status) with their latency, recorded as they are served
//! (metadata requests are few, so the global recorder's per-call lookup is
//! cheap enough), and once a second the cluster's shape from the model.
//! Recoveries and tablet moves are counted where they happen (`death.rs`,
//! `service.rs`).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::service::{Coordinator, Reject};

const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

/// One request of `kind` served in `elapsed`; `refused` if it was.
pub fn record(kind: &'static str, refused: Option<&Reject>, elapsed: Duration) {
    metrics::counter!("insitu_coordinator_requests_total", "kind" => kind).increment(1);
    if let Some(reject) = refused {
        metrics::counter!(
            "insitu_coordinator_request_errors_total",
            "kind" => kind,
            "status" => format!("{:?}", reject.status)
        )
        .increment(1);
    }
    metrics::histogram!("insitu_coordinator_request_duration_seconds", "kind" => kind)
        .record(elapsed.as_secs_f64());
}

/// Servers, tables, tablets, moves and recoveries pending, every second.
pub async fn publish(coord: Arc<Coordinator>, shutdown: CancellationToken) {
    insitu_telemetry::recorder();
    let mut tick = tokio::time::interval(PUBLISH_INTERVAL);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let model = coord.model();
        let live = model.live_servers().len();
        metrics::gauge!("insitu_servers", "state" => "live").set(live as f64);
        metrics::gauge!("insitu_servers", "state" => "dead")
            .set(model.servers.len().saturating_sub(live) as f64);
        metrics::gauge!("insitu_tables").set(model.tables.len() as f64);
        let tablets: usize = model.tables.values().map(|t| t.tablets.len()).sum();
        metrics::gauge!("insitu_cluster_tablets").set(tablets as f64);
        metrics::gauge!("insitu_tablets_awaiting_recovery").set(model.lost_from.len() as f64);
        // Tablets whose objects were lost (R = 0), until acknowledged.
        metrics::gauge!("insitu_tablets_lost").set(model.data_lost.len() as f64);
        metrics::gauge!("insitu_tablet_moves_in_progress").set(model.moves.len() as f64);
        metrics::gauge!("insitu_map_version").set(model.map_version as f64);
    }
}
