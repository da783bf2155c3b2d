//! Metrics: one Prometheus recorder per process (the `metrics` facade's
//! global recorder, rendered by `metrics-exporter-prometheus`), and the small
//! HTTP endpoint that serves it (`http.rs`: `GET /metrics`, and a status page
//! at `/` where the process has one).
//!
//! Why one recorder per process: `insitu up` runs the coordinator and every
//! server in one process; their series are told apart by labels (`server`,
//! `shard`), so one endpoint shows the whole local cluster.
//!
//! Also the server processes' panic policy (`panic.rs`): a panic in any
//! thread aborts the process.

pub mod http;
mod panic;

pub use panic::{ABORT_MESSAGE, abort_on_panic};

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency buckets, in seconds: 10 µs to 10 s. Fixed buckets keep a
/// histogram's memory constant however many samples it takes (a summary
/// would keep samples until the next scrape).
const LATENCY_BUCKETS_S: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// How often recorded histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's recorder, installed on first use (later calls return the
/// same). Metrics recorded before it is installed are dropped, so roles call
/// this before they start serving.
pub fn recorder() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Suffix("duration_seconds".into()),
                LATENCY_BUCKETS_S,
            )
            .expect("the bucket list is not empty");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            // Another recorder is installed (an embedding program's): its
            // metrics go there; this endpoint then shows none of them.
            tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
        }
        let upkeep = handle.clone();
        // A thread, not a task: the recorder outlives any one runtime
        // (`insitu up` and tests start several).
        let _ = std::thread::Builder::new()
            .name("insitu-metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_INTERVAL);
                    upkeep.run_upkeep();
                }
            });
        handle
    })
}

/// The Prometheus text of every metric recorded in this process.
pub fn render() -> String {
    recorder().render()
}
