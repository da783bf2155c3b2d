//! Smoke test of `insitu bench resp --quick`: redis-benchmark against Redis
//! and against insitu's RESP port end to end, and `--cluster` against two
//! nodes of each, JSON with the keys.
//! Needs redis-server and redis-benchmark (CI installs both); without them
//! the test says SKIPPED.

use std::process::Command;

use insitu_testkit::on_path;

#[test]
fn bench_resp_quick_measures_both_stores() {
    if !on_path("redis-server") || !on_path("redis-benchmark") {
        eprintln!("SKIPPED: `insitu bench resp` needs redis-server and redis-benchmark");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("resp.json");
    let out = Command::new(env!("CARGO_BIN_EXE_insitu"))
        .args(["bench", "resp", "--quick", "--clients", "8", "--json"])
        .arg(&json_path)
        .output()
        .expect("run insitu bench resp");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench resp failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).expect("json written")).expect("json");
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "-P 1 and -P 16");
    for run in runs {
        for test in ["set", "get", "incr", "mset"] {
            let t = &run["tests"][test];
            for store in ["redis", "insitu"] {
                let rps = t[store]["requests_per_s"].as_f64().unwrap_or(0.0);
                assert!(rps > 0.0, "{test} on {store}: {t}");
            }
        }
    }
    // redis-benchmark --cluster against two Redis Cluster nodes and two
    // insitu servers, each described as a node.
    let cluster_runs = report["cluster"]["runs"].as_array().expect("cluster runs");
    assert_eq!(cluster_runs.len(), 2, "-P 1 and -P 16: {report}");
    for run in cluster_runs {
        for test in ["set", "get"] {
            for store in ["redis", "insitu"] {
                let rps = run["tests"][test][store]["requests_per_s"]
                    .as_f64()
                    .unwrap_or(0.0);
                assert!(rps > 0.0, "cluster {test} on {store}: {run}");
            }
        }
    }
    for key in [
        "resp_get_vs_redis",
        "resp_set_vs_redis",
        "resp_cluster_get_vs_redis",
        "resp_cluster_set_vs_redis",
    ] {
        assert!(
            report[key].as_f64().is_some_and(|r| r > 0.0),
            "{key}: {report}"
        );
    }
}
