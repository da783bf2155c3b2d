//! The plot of `insitu bench resp`: requests per second of each
//! redis-benchmark test, Redis beside insitu, one panel per pipeline depth
//! (single stores first, then the `--cluster` runs if the report has them).
//! Plain SVG drawn from the report's JSON, no dependencies.

use std::fmt::Write;

use serde_json::Value;

const PANEL_W: f64 = 300.0;
const H: f64 = 300.0;
const TOP: f64 = 50.0;
const PLOT_H: f64 = 200.0;
const LEFT: f64 = 70.0;
const TESTS: [&str; 4] = ["set", "get", "incr", "mset"];
const STORES: [(&str, &str); 2] = [("redis", "#c0392b"), ("insitu", "#2060c0")];

pub fn svg(report: &Value) -> String {
    let single = report["runs"].as_array().cloned().unwrap_or_default();
    let cluster = report["cluster"]["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let runs: Vec<(&str, Value)> = single
        .into_iter()
        .map(|r| ("", r))
        .chain(cluster.into_iter().map(|r| ("cluster ", r)))
        .collect();
    let width = LEFT + PANEL_W * runs.len().max(1) as f64 + 20.0;
    let rps = |run: &Value, test: &str, store: &str| {
        run["tests"][test][store]["requests_per_s"]
            .as_f64()
            .unwrap_or(0.0)
    };
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="18" font-size="13">redis-benchmark requests/s: Redis (red) and insitu's RESP port (blue); one core each, or two nodes each (cluster)</text>"#
    );
    for (i, (label, run)) in runs.iter().enumerate() {
        let x0 = LEFT + PANEL_W * i as f64;
        let max = TESTS
            .iter()
            .flat_map(|t| STORES.iter().map(move |(st, _)| (t, st)))
            .map(|(t, st)| rps(run, t, st))
            .fold(1.0_f64, f64::max);
        let p = run["pipeline"].as_u64().unwrap_or(0);
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" font-size="12">{label}-P {p}</text>"#,
            x0 + 10.0,
            TOP - 8.0
        );
        let _ = write!(
            s,
            r##"<line x1="{x0}" y1="{}" x2="{}" y2="{}" stroke="#444"/>"##,
            TOP + PLOT_H,
            x0 + PANEL_W - 20.0,
            TOP + PLOT_H
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{:.0}k</text>"#,
            x0 - 4.0,
            TOP + 4.0,
            max / 1e3
        );
        let slot = (PANEL_W - 20.0) / TESTS.len() as f64;
        for (j, test) in TESTS.iter().enumerate() {
            let tx = x0 + slot * j as f64;
            for (k, (store, colour)) in STORES.iter().enumerate() {
                let v = rps(run, test, store);
                let h = PLOT_H * v / max;
                let bx = tx + 8.0 + k as f64 * (slot - 16.0) / 2.0;
                let _ = write!(
                    s,
                    r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{colour}"><title>{store} {test} -P {p}: {v:.0} req/s</title></rect>"#,
                    TOP + PLOT_H - h,
                    (slot - 16.0) / 2.0 - 2.0
                );
            }
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{test}</text>"#,
                tx + slot / 2.0,
                TOP + PLOT_H + 15.0
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn draws_a_bar_per_store_and_test() {
        let report = serde_json::json!({"runs": [{"pipeline": 1, "tests": {
            "set": {"redis": {"requests_per_s": 100.0}, "insitu": {"requests_per_s": 90.0}},
            "get": {"redis": {"requests_per_s": 100.0}, "insitu": {"requests_per_s": 110.0}}
        }}]});
        let svg = super::svg(&report);
        assert_eq!(svg.matches("<rect").count(), 8);
        assert!(svg.contains("insitu get -P 1: 110 req/s"));
    }

    #[test]
    fn draws_the_cluster_runs_after_the_single_ones() {
        let run = |p: u64, v: f64| {
            serde_json::json!({"pipeline": p, "tests": {
                "set": {"redis": {"requests_per_s": 100.0}, "insitu": {"requests_per_s": v}}
            }})
        };
        let report = serde_json::json!({
            "runs": [run(1, 90.0), run(16, 91.0)],
            "cluster": {"runs": [run(16, 92.0)]}
        });
        let svg = super::svg(&report);
        assert_eq!(svg.matches("<rect").count(), 3 * 8);
        assert!(svg.contains(">cluster -P 16</text>"), "{svg}");
        assert!(svg.find("91 req/s").unwrap() < svg.find("92 req/s").unwrap());
    }
}
