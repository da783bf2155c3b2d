//! Result rows of `bench kv`: one measured case, medians over rounds, the
//! insitu/Redis ratios and the printed table. Separate from the run so the
//! report format can change without touching process or load handling.

use std::time::Duration;

use serde_json::{Value, json};

use crate::loadgen::{self, Mix};

/// One figure of a case's row (its throughput, p99, CPU per op, ...).
type Figure = fn(&Row) -> f64;

#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) case: String,
    pub(crate) store: &'static str,
    pub(crate) mix: Mix,
    pub(crate) conns: usize,
    pub(crate) depth: usize,
    pub(crate) ops_per_sec: f64,
    pub(crate) objects_per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) p999_us: f64,
    pub(crate) server_cpu_util: f64,
    pub(crate) server_cpu_us_per_op: f64,
    /// CPU the load generator (this process) used, as a fraction of one core.
    pub(crate) client_cpu_util: f64,
    pub(crate) curve: Vec<(f64, f64)>,
    /// Per-round ops/s and p99 (us) behind the medians.
    pub(crate) ops_rounds: Vec<f64>,
    pub(crate) p99_rounds: Vec<f64>,
    /// insitu only: the longest a single point request held the shard
    /// during the case (the server's `longest_point_call_us`), µs; the
    /// largest over the rounds.
    pub(crate) server_longest_call_us: Option<u64>,
}

impl Row {
    pub(crate) fn json(&self) -> Value {
        json!({
            "case": self.case,
            "store": self.store,
            "op": mix_name(self.mix),
            "conns": self.conns,
            "depth": self.depth,
            "keys_per_op": self.mix.objects_per_op(),
            "ops_per_sec": round(self.ops_per_sec, 1),
            "objects_per_sec": round(self.objects_per_sec, 1),
            "p50_us": round(self.p50_us, 2),
            "p99_us": round(self.p99_us, 2),
            "p999_us": round(self.p999_us, 2),
            "server_cpu_util": round(self.server_cpu_util, 3),
            "server_cpu_us_per_op": round(self.server_cpu_us_per_op, 3),
            "client_cpu_util": round(self.client_cpu_util, 3),
            "latency_percentiles_us": self.curve.iter().map(|(q, us)| json!([q, round(*us, 2)])).collect::<Vec<_>>(),
            "ops_per_sec_rounds": self.ops_rounds.iter().map(|x| round(*x, 0)).collect::<Vec<_>>(),
            "server_longest_call_us": self.server_longest_call_us,
            "p99_us_rounds": self.p99_rounds.iter().map(|x| round(*x, 1)).collect::<Vec<_>>(),
        })
    }
}

pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

pub(crate) fn mix_name(mix: Mix) -> String {
    match mix {
        Mix::Read => "read".into(),
        Mix::Write => "write".into(),
        Mix::Mixed { write_pct } => format!("mix{}/{}", 100 - write_pct, write_pct),
        Mix::MultiRead(n) => format!("multiread{n}"),
    }
}

pub(crate) fn case_name(mix: Mix, conns: usize, depth: usize, store: &str) -> String {
    let op = match (mix, store) {
        (Mix::MultiRead(n), "redis") => format!("mget{n}"),
        (m, _) => mix_name(m),
    };
    format!("{op} c{conns} d{depth}")
}

pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// One row per (store, case): every figure the median over its rounds.
pub(crate) fn median_rows(raw: &[Row]) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    for r in raw {
        if out.iter().any(|o| o.store == r.store && o.case == r.case) {
            continue;
        }
        let same: Vec<&Row> = raw
            .iter()
            .filter(|o| o.store == r.store && o.case == r.case)
            .collect();
        let m = |f: Figure| median(same.iter().map(|x| f(x)).collect());
        out.push(Row {
            ops_per_sec: m(|x| x.ops_per_sec),
            objects_per_sec: m(|x| x.objects_per_sec),
            p50_us: m(|x| x.p50_us),
            p99_us: m(|x| x.p99_us),
            p999_us: m(|x| x.p999_us),
            server_cpu_util: m(|x| x.server_cpu_util),
            server_cpu_us_per_op: m(|x| x.server_cpu_us_per_op),
            client_cpu_util: m(|x| x.client_cpu_util),
            curve: (0..r.curve.len())
                .map(|i| {
                    (
                        r.curve[i].0,
                        median(same.iter().map(|x| x.curve[i].1).collect()),
                    )
                })
                .collect(),
            ops_rounds: same.iter().map(|x| x.ops_per_sec).collect(),
            p99_rounds: same.iter().map(|x| x.p99_us).collect(),
            server_longest_call_us: same.iter().filter_map(|x| x.server_longest_call_us).max(),
            ..r.clone()
        });
    }
    out
}

pub(crate) fn find<'a>(
    rows: &'a [Row],
    store: &str,
    mix: Mix,
    conns: usize,
    depth: usize,
) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.store == store && r.mix == mix && r.conns == conns && r.depth == depth)
}

pub(crate) fn ratio(a: Option<f64>, b: Option<f64>) -> Value {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => json!(round(a / b, 3)),
        _ => Value::Null,
    }
}

/// The report's ratios: insitu over Redis at named points and over the whole
/// grid, insitu's multiRead over single reads, and the two memory ratios.
pub(crate) fn ratios(
    rows: &[Row],
    mem_ratio: Value,
    overhead_ratio: Value,
) -> serde_json::Map<String, Value> {
    let get = |store: &str, mix: Mix, conns: usize, depth: usize, f: Figure| {
        find(rows, store, mix, conns, depth).map(f)
    };
    let ops = |r: &Row| r.ops_per_sec;
    let objs = |r: &Row| r.objects_per_sec;
    let p99 = |r: &Row| r.p99_us;
    // insitu's value over Redis's at one point of the grid.
    let vs_redis = |mix: Mix, conns: usize, depth: usize, f: Figure| {
        ratio(
            get("insitu", mix, conns, depth, f),
            get("redis", mix, conns, depth, f),
        )
    };
    let mut ratios = serde_json::Map::new();
    let mut put = |k: &str, v: Value| {
        ratios.insert(k.to_string(), v);
    };
    for n in [100, 10] {
        // insitu's multiRead of n keys over its single reads, and over
        // Redis's MGET of n keys, in objects per second.
        put(
            &format!("multiread_{n}_vs_single"),
            ratio(
                get("insitu", Mix::MultiRead(n), 16, 1, objs),
                get("insitu", Mix::Read, 16, 1, objs),
            ),
        );
        put(
            &format!("multiread_{n}_vs_mget_{n}"),
            vs_redis(Mix::MultiRead(n), 16, 1, objs),
        );
    }
    put("memory_per_object_vs_redis", mem_ratio);
    put("overhead_per_object_vs_redis", overhead_ratio);
    // Server CPU per operation (schedstat of every store thread): what each
    // request costs the store itself, independent of the load generator.
    let cpu = |r: &Row| r.server_cpu_us_per_op;
    // Reads and writes at 16 and 64 connections, one request in flight:
    // `{op}_{figure}_vs_redis` and `{op}_{figure}_vs_redis_c64`, that is
    // `read_throughput_vs_redis`, `write_throughput_vs_redis`,
    // `read_p99_vs_redis`, `write_p99_vs_redis`,
    // `read_server_cpu_per_op_vs_redis`, `write_server_cpu_per_op_vs_redis`,
    // and each of them again with `_c64`.
    let figures: [(&str, Figure); 3] = [
        ("throughput", ops),
        ("p99", p99),
        ("server_cpu_per_op", cpu),
    ];
    for (mix, op) in [(Mix::Read, "read"), (Mix::Write, "write")] {
        for (conns, suffix) in [(16, ""), (64, "_c64")] {
            for (figure_name, figure) in figures {
                put(
                    &format!("{op}_{figure_name}_vs_redis{suffix}"),
                    vs_redis(mix, conns, 1, figure),
                );
            }
        }
    }
    // The other named ratios of insitu over Redis: (name, mix, connections, depth, figure).
    #[rustfmt::skip]
    let named: [(&str, Mix, usize, usize, Figure); 5] = [
        // Pipelined writes: where an inline cleaning pass stalled every queued request.
        ("write_p99_vs_redis_c16_d16", Mix::Write, 16, 16, p99),
        ("write_p99_vs_redis_c64_d16", Mix::Write, 64, 16, p99),
        ("mix_throughput_vs_redis", Mix::Mixed { write_pct: 5 }, 16, 1, ops),
        ("read_d16_server_cpu_per_op_vs_redis", Mix::Read, 16, 16, cpu),
        ("write_d16_server_cpu_per_op_vs_redis", Mix::Write, 16, 16, cpu),
    ];
    for (name, mix, conns, depth, figure) in named {
        put(name, vs_redis(mix, conns, depth, figure));
    }
    for conns in [1, 16, 64] {
        for depth in [1, 16] {
            for (mix, name) in [
                (Mix::Read, "read"),
                (Mix::Write, "write"),
                (Mix::Mixed { write_pct: 5 }, "mix"),
            ] {
                let key = format!("grid_{name}_c{conns}_d{depth}");
                put(
                    &format!("{key}_throughput_vs_redis"),
                    vs_redis(mix, conns, depth, ops),
                );
                put(
                    &format!("{key}_p99_vs_redis"),
                    vs_redis(mix, conns, depth, p99),
                );
            }
        }
    }
    ratios
}

pub(crate) fn print_table(
    rows: &[Row],
    memory: &serde_json::Map<String, Value>,
    load: &serde_json::Map<String, Value>,
    pinned: bool,
    keys: u64,
    measure: Duration,
) {
    println!(
        "\ninsitu vs Redis, point operations: {keys} keys of {} B / values of {} B, {:.1} s per case{}",
        loadgen::KEY_BYTES,
        loadgen::VALUE_BYTES,
        measure.as_secs_f64(),
        if pinned {
            ", stores pinned to one CPU, load generator to another"
        } else {
            ""
        }
    );
    println!(
        "{:<20} {:<7} {:>11} {:>11} {:>8} {:>8} {:>9} {:>7} {:>9} {:>7}",
        "case",
        "store",
        "ops/s",
        "objects/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "cpu %",
        "cpu us/op",
        "gen %"
    );
    for (i, r) in rows.iter().enumerate() {
        let vs = (r.store == "insitu")
            .then(|| find(rows, "redis", r.mix, r.conns, r.depth))
            .flatten()
            .map(|redis| {
                format!(
                    "  x{:.2} ops, x{:.2} p99",
                    r.objects_per_sec / redis.objects_per_sec,
                    r.p99_us / redis.p99_us
                )
            })
            .unwrap_or_default();
        println!(
            "{:<20} {:<7} {:>11.0} {:>11.0} {:>8.1} {:>8.1} {:>9.1} {:>7.0} {:>9.2} {:>7.0}{}",
            r.case,
            r.store,
            r.ops_per_sec,
            r.objects_per_sec,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.server_cpu_util * 100.0,
            r.server_cpu_us_per_op,
            r.client_cpu_util * 100.0,
            vs
        );
        if i + 1 < rows.len() && rows[i + 1].mix != r.mix {
            println!();
        }
    }
    println!(
        "(cpu %: the store's CPU use, all its threads; cpu us/op: that per operation; gen %: the load generator's)"
    );
    let longest: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            r.server_longest_call_us
                .map(|us| format!("{} {us}", r.case))
        })
        .collect();
    if !longest.is_empty() {
        println!(
            "longest single point request inside the insitu server, us: {}",
            longest.join(", ")
        );
    }
    println!("\nload (batches of 1000): {}", Value::Object(load.clone()));
    println!("memory per object: {}", Value::Object(memory.clone()));
}
