//! The metrics port of a real `insitu up --metrics-port`: `/metrics` parses
//! as Prometheus text and its counters move when requests are made; `/` is
//! the status page naming the servers and tables, and it renders in
//! headless Chromium (a screenshot that is not blank) where Chromium is
//! installed (CI installs it; elsewhere that part says SKIPPED).

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::free_port;
use insitu_client::{BlockingClient, ClientConfig, Token};

/// `GET path` on the metrics port.
fn get(addr: &str, path: &str) -> (u16, String) {
    common::rt()
        .block_on(insitu_telemetry::http::get(addr, path))
        .expect("metrics port answers")
}

/// Every sample of a scrape: (metric name, labels) -> value (counters,
/// gauges and untyped; histograms by their `_count`).
fn scrape(addr: &str) -> Vec<(String, HashMap<String, String>, f64)> {
    let (code, text) = get(addr, "/metrics");
    assert_eq!(code, 200);
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let parsed =
        prometheus_parse::Scrape::parse(lines).expect("the metrics parse as Prometheus text");
    parsed
        .samples
        .into_iter()
        .filter_map(|s| {
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                prometheus_parse::Value::Histogram(ref buckets) => {
                    buckets.iter().map(|b| b.count).fold(0.0, f64::max)
                }
                _ => return None,
            };
            Some((
                s.metric,
                s.labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                value,
            ))
        })
        .collect()
}

/// The sum of `metric` over the samples whose labels include `want`.
fn sum(
    samples: &[(String, HashMap<String, String>, f64)],
    metric: &str,
    want: &[(&str, &str)],
) -> f64 {
    samples
        .iter()
        .filter(|(m, labels, _)| {
            m == metric
                && want
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// Scrape until `pred` holds (the shards publish once a second), at most 15 s.
fn scrape_until(
    addr: &str,
    what: &str,
    pred: impl Fn(&[(String, HashMap<String, String>, f64)]) -> bool,
) -> Vec<(String, HashMap<String, String>, f64)> {
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let samples = scrape(addr);
        if pred(&samples) {
            return samples;
        }
        assert!(Instant::now() < until, "the metrics never showed {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn metrics_move_with_requests_and_the_status_page_names_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (port, metrics_port) = (free_port(), free_port());
    let addr = format!("127.0.0.1:{port}");
    let metrics = format!("127.0.0.1:{metrics_port}");
    let metrics_flag = metrics_port.to_string();
    let _up = common::start_up_with(
        2,
        port,
        &data,
        &["--metrics-port", &metrics_flag],
        "metrics at",
    );
    let config = ClientConfig {
        auth_token: Some(Token::from_file(&data.join("auth-token")).unwrap()),
        ..ClientConfig::default()
    };
    let client = BlockingClient::connect_with(&addr, config).unwrap();
    let table = client.create_table("metered", 4).unwrap().id;
    for i in 0..100 {
        client
            .write(table, format!("k{i}"), format!("value {i}"))
            .unwrap();
    }
    let samples = scrape_until(&metrics, "100 writes and the cluster's shape", |s| {
        sum(s, "insitu_requests_total", &[("kind", "Write")]) >= 100.0
            && sum(s, "insitu_servers", &[("state", "live")]) == 2.0
            // Two servers keep one replica each (R = 1): every acknowledged
            // write waited for a replication round.
            && sum(s, "insitu_replication_round_duration_seconds", &[]) >= 1.0
            && sum(s, "insitu_objects", &[]) >= 100.0
    });
    let reads_before = sum(&samples, "insitu_requests_total", &[("kind", "Read")]);
    assert!(
        sum(
            &samples,
            "insitu_coordinator_requests_total",
            &[("kind", "CreateTable")]
        ) >= 1.0
    );
    assert!(sum(&samples, "insitu_memory_budget_bytes", &[]) > 0.0);
    assert!(
        sum(
            &samples,
            "insitu_tablet_objects",
            &[("table", &table.to_string())]
        ) >= 100.0
    );
    // Latency is sampled (one request in 16 per shard): 100 writes over the
    // shards give at least a few timed ones, never more than the writes.
    let timed = sum(
        &samples,
        "insitu_request_duration_seconds",
        &[("kind", "Write")],
    );
    assert!(
        (1.0..=100.0).contains(&timed),
        "{timed} timed writes of 100"
    );
    assert_eq!(sum(&samples, "insitu_tables", &[]), 1.0);

    // Counters move: 50 reads, and a refused one (an unknown tablet's table).
    for i in 0..50 {
        assert!(client.read(table, format!("k{i}")).unwrap().is_some());
    }
    scrape_until(&metrics, "50 more reads", |s| {
        sum(s, "insitu_requests_total", &[("kind", "Read")]) >= reads_before + 50.0
    });

    // The status page: servers, their shards, the table.
    let (code, page) = get(&metrics, "/");
    assert_eq!(code, 200);
    for want in [
        "insitu cluster",
        "server 1",
        "server 2",
        "metered",
        "2 of 2 servers live",
    ] {
        assert!(
            page.contains(want),
            "the status page lacks {want:?}:\n{page}"
        );
    }
    screenshot_in_chromium(&format!("http://{metrics}/"), dir.path());
}

/// Render the page in headless Chromium: a screenshot that is not blank
/// (a blank 1200x800 PNG is ~4 KB; the page's text and tables make it many
/// times that) and a DOM that names the servers.
fn screenshot_in_chromium(url: &str, dir: &std::path::Path) {
    let Some(chromium) = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| insitu_testkit::proc::on_path(b))
    else {
        println!("status page in a browser: SKIPPED (no chromium on PATH; CI installs it)");
        return;
    };
    let shot = dir.join("status.png");
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1200,800",
    ];
    let out = std::process::Command::new(chromium)
        .args(args)
        .arg(format!("--screenshot={}", shot.display()))
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::metadata(&shot).expect("a screenshot").len();
    assert!(bytes > 12_000, "the screenshot looks blank ({bytes} bytes)");
    let dom = std::process::Command::new(chromium)
        .args(args)
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains("server 1") && dom.contains("server 2"),
        "{dom}"
    );
}
