//! Smoke test of `insitu bench kv --quick`: the whole benchmark end to end
//! (child processes, load, every case, JSON). Against Redis only when
//! `redis-server` is installed; otherwise the insitu half runs alone and the
//! Redis half is reported as skipped.

use std::process::Command;

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

#[test]
fn bench_kv_quick_runs_every_case_and_writes_the_ratios() {
    let with_redis = on_path("redis-server");
    if !with_redis {
        eprintln!(
            "SKIPPED: the Redis half of `insitu bench kv` (redis-server is not installed); \
             testing the insitu half alone"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("kv.json");
    let plot_path = dir.path().join("kv.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_insitu"))
        .args([
            "bench",
            "kv",
            "--quick",
            "--keys",
            "2000",
            "--seconds",
            "0.1",
        ])
        .args(["--vs", if with_redis { "redis" } else { "none" }])
        .arg("--json")
        .arg(&json_path)
        .arg("--plot")
        .arg(&plot_path)
        .output()
        .expect("run insitu bench kv");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench kv failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ratios:"), "no table printed:\n{stdout}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).expect("json written")).expect("json");
    let cases = report["cases"].as_array().expect("cases");
    for store in ["insitu", "redis"] {
        let mine: Vec<_> = cases.iter().filter(|c| c["store"] == store).collect();
        if store == "redis" && !with_redis {
            assert!(mine.is_empty());
            continue;
        }
        // read, write, mix x {1,16,64} conns x {1,16} depth, plus multiRead(10|100) x {1,16} conns.
        assert_eq!(mine.len(), 22, "{store} cases: {mine:#?}");
        for c in mine {
            assert!(c["ops_per_sec"].as_f64().unwrap() > 0.0, "{c}");
            // The server's longest point request of the case (>= 1 us: any
            // request takes some time, rounded up); Redis has no such figure.
            if store == "insitu" {
                assert!(
                    c["server_longest_call_us"]
                        .as_u64()
                        .is_some_and(|us| us >= 1),
                    "{c}"
                );
            } else {
                assert!(c["server_longest_call_us"].is_null(), "{c}");
            }
            assert!(
                c["p99_us"].as_f64().unwrap() >= c["p50_us"].as_f64().unwrap(),
                "{c}"
            );
        }
    }
    let ratios = &report["ratios"];
    let single = |k: &str| ratios[k].as_f64();
    assert!(single("multiread_100_vs_single").is_some_and(|r| r > 0.0));
    for k in [
        "read_throughput_vs_redis",
        "write_throughput_vs_redis",
        "read_p99_vs_redis",
        "multiread_100_vs_mget_100",
        "memory_per_object_vs_redis",
    ] {
        if with_redis {
            assert!(single(k).is_some_and(|r| r > 0.0), "{k} = {}", ratios[k]);
        } else {
            assert!(ratios[k].is_null(), "{k} without Redis must be null");
        }
    }
    assert!(report["memory"]["insitu_rss_per_object"].as_f64().is_some());
    // At 2,000 keys the RSS growth is too coarse for a sign; only its presence.
    assert_eq!(
        ratios["overhead_per_object_vs_redis"]
            .as_f64()
            .is_some_and(f64::is_finite),
        with_redis,
        "{}",
        ratios["overhead_per_object_vs_redis"]
    );
    let svg = std::fs::read_to_string(&plot_path).expect("plot written");
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
}

/// `insitu bench kv --vs VS --quick` at 1,000 keys and 0.1 s per case,
/// checked to succeed; its JSON report.
fn quick_kv_json(vs: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("kv.json");
    let out = Command::new(env!("CARGO_BIN_EXE_insitu"))
        .args(["bench", "kv", "--vs", vs, "--quick", "--keys", "1000"])
        .args(["--seconds", "0.1", "--json"])
        .arg(&json_path)
        .output()
        .expect("run insitu bench kv");
    assert!(
        out.status.success(),
        "bench kv --vs {vs} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(&json_path).expect("json written")).expect("json")
}

#[test]
fn bench_kv_vs_redis_aof_quick_reports_both_durability_pairings() {
    if !on_path("redis-server") {
        eprintln!(
            "SKIPPED: `insitu bench kv --vs redis-aof` needs redis-server, which is not installed"
        );
        return;
    }
    let report = quick_kv_json("redis-aof");
    let cases = report["cases"].as_array().expect("cases");
    for store in [
        "insitu-interval",
        "redis-everysec",
        "insitu-always",
        "redis-always",
        "insitu-r0",
    ] {
        let n = cases.iter().filter(|c| c["store"] == store).count();
        assert_eq!(n, 3, "{store}: {cases:#?}");
    }
    for mode in ["interval", "always"] {
        for k in [
            format!("durable_write_throughput_vs_redis_aof_{mode}"),
            format!("durable_write_p99_vs_redis_aof_{mode}"),
            format!("durable_write_throughput_vs_insitu_r0_{mode}"),
        ] {
            assert!(
                report["ratios"][&k].as_f64().is_some_and(|r| r > 0.0),
                "{k}: {}",
                report["ratios"]
            );
        }
    }
}

/// `--vs snapshots`: the same write cases on an insitu read at a snapshot
/// every 250 ms (its writes take timestamps) and on one never read so,
/// with their ratios. Needs no Redis.
#[test]
fn bench_kv_vs_snapshots_quick_reports_stamped_against_plain_writes() {
    let report = quick_kv_json("snapshots");
    let cases = report["cases"].as_array().expect("cases");
    for store in ["insitu", "insitu-snapshots"] {
        let n = cases.iter().filter(|c| c["store"] == store).count();
        assert_eq!(n, 3, "{store}: {cases:#?}");
    }
    assert!(
        report["config"]["snapshot_reads"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{}",
        report["config"]
    );
    for case in ["_c16", "_c64", "_c16_d16"] {
        for k in [
            format!("stamped_write_throughput_vs_unstamped{case}"),
            format!("stamped_write_p99_vs_unstamped{case}"),
        ] {
            assert!(
                report["ratios"][&k].as_f64().is_some_and(|r| r > 0.0),
                "{k}: {}",
                report["ratios"]
            );
        }
    }
}

#[test]
fn bench_kv_tls_quick_measures_both_stores_over_tls() {
    let with_redis = on_path("redis-server");
    if !with_redis {
        eprintln!(
            "SKIPPED: the Redis half of `insitu bench kv --tls` (redis-server is not installed); \
             testing the insitu half alone"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("kv-tls.json");
    let out = Command::new(env!("CARGO_BIN_EXE_insitu"))
        .args([
            "bench",
            "kv",
            "--tls",
            "--quick",
            "--keys",
            "1000",
            "--seconds",
            "0.1",
        ])
        .args(["--only", "read c16 d1", "--only", "write c16 d1"])
        .args(["--vs", if with_redis { "redis" } else { "none" }])
        .arg("--json")
        .arg(&json_path)
        .output()
        .expect("run insitu bench kv --tls");
    assert!(
        out.status.success(),
        "bench kv --tls failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).expect("json written")).expect("json");
    assert!(
        report["config"]["tls"]
            .as_str()
            .is_some_and(|t| t.contains("TLS only")),
        "{}",
        report["config"]
    );
    let cases = report["cases"].as_array().expect("cases");
    let stores: &[&str] = if with_redis {
        &["insitu", "redis"]
    } else {
        &["insitu"]
    };
    for store in stores {
        let mine: Vec<_> = cases.iter().filter(|c| c["store"] == *store).collect();
        // "read c16 d1" also selects "read c16 d16" (a substring match).
        for case in [
            "read c16 d1",
            "write c16 d1",
            "read c16 d16",
            "write c16 d16",
        ] {
            assert!(mine.iter().any(|c| c["case"] == case), "{store}: no {case}");
        }
        assert_eq!(mine.len(), 4, "{store} cases: {mine:#?}");
        assert!(
            mine.iter()
                .all(|c| c["ops_per_sec"].as_f64().unwrap() > 0.0)
        );
    }
    if with_redis {
        for k in ["read_throughput_vs_redis", "write_throughput_vs_redis"] {
            assert!(
                report["ratios"][k].as_f64().is_some_and(|r| r > 0.0),
                "{k}: {}",
                report["ratios"]
            );
        }
    }
}
