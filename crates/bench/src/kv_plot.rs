//! The latency plot of `insitu bench kv`: latency against percentile
//! (HdrHistogram style, the x axis in "nines") for reads and writes without
//! pipelining at 16 and 64 connections, Redis beside insitu. Plain SVG drawn
//! from the report's JSON, no dependencies.

use std::fmt::Write;

use serde_json::Value;

const W: f64 = 460.0;
const H: f64 = 320.0;
const LEFT: f64 = 60.0;
const TOP: f64 = 40.0;
const PLOT_W: f64 = 370.0;
const PLOT_H: f64 = 230.0;

fn nines(q: f64) -> f64 {
    -(1.0 - q / 100.0).max(1e-6).log10()
}

type Series = (String, &'static str, bool, Vec<(f64, f64)>);

fn series(report: &Value, op: &str) -> Vec<Series> {
    let mut out = Vec::new();
    let cases = report["cases"].as_array().cloned().unwrap_or_default();
    for conns in [16u64, 64] {
        for store in ["redis", "insitu"] {
            let Some(case) = cases.iter().find(|c| {
                c["store"] == store && c["op"] == op && c["conns"] == conns && c["depth"] == 1
            }) else {
                continue;
            };
            let points: Vec<(f64, f64)> = case["latency_percentiles_us"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| Some((p[0].as_f64()?, p[1].as_f64()?)))
                        .collect()
                })
                .unwrap_or_default();
            let colour = if store == "redis" {
                "#c0392b"
            } else {
                "#2060c0"
            };
            out.push((
                format!("{store}, {conns} conns"),
                colour,
                conns == 64,
                points,
            ));
        }
    }
    out
}

fn panel(svg: &mut String, x0: f64, title: &str, series: &[Series]) {
    let all: Vec<f64> = series
        .iter()
        .flat_map(|s| s.3.iter().map(|p| p.1))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().cloned().fold(f64::MAX, f64::min).max(0.1);
    let hi = all.iter().cloned().fold(0.0, f64::max).max(lo * 2.0);
    let (ylo, yhi) = (lo.log10().floor(), hi.log10().ceil());
    let px = |q: f64| x0 + LEFT + (nines(q) - nines(50.0)) / (nines(99.99) - nines(50.0)) * PLOT_W;
    let py =
        |us: f64| TOP + PLOT_H - (us.max(10f64.powf(ylo)).log10() - ylo) / (yhi - ylo) * PLOT_H;
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" font-size="14" text-anchor="middle">{title}</text>"#,
        x0 + LEFT + PLOT_W / 2.0
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="#888"/>"##,
        x0 + LEFT
    );
    for q in [50.0, 90.0, 99.0, 99.9, 99.99] {
        let x = px(q);
        let _ = writeln!(
            svg,
            r##"<line x1="{x}" y1="{TOP}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" font-size="11" text-anchor="middle">p{q}</text>"##,
            TOP + PLOT_H,
            TOP + PLOT_H + 15.0
        );
    }
    let mut e = ylo;
    while e <= yhi {
        let us = 10f64.powf(e);
        let y = py(us);
        let _ = writeln!(
            svg,
            r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" font-size="11" text-anchor="end">{us} µs</text>"##,
            x0 + LEFT,
            x0 + LEFT + PLOT_W,
            x0 + LEFT - 4.0,
            y + 4.0
        );
        e += 1.0;
    }
    for (i, (name, colour, dashed, points)) in series.iter().enumerate() {
        let path: Vec<String> = points
            .iter()
            .map(|&(q, us)| format!("{:.1},{:.1}", px(q), py(us)))
            .collect();
        let dash = if *dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#,
            path.join(" ")
        );
        let ly = TOP + 12.0 + 14.0 * i as f64;
        let lx = x0 + LEFT + 8.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/><text x="{}" y="{}" font-size="11">{name}</text>"#,
            lx + 24.0,
            lx + 28.0,
            ly + 4.0
        );
    }
}

/// The plot for a `bench kv` report.
pub fn svg(report: &Value) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{H}" font-family="sans-serif">"#,
        2.0 * W
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    panel(
        &mut svg,
        0.0,
        "GET / read latency (no pipelining)",
        &series(report, "read"),
    );
    panel(
        &mut svg,
        W,
        "SET / write latency (no pipelining)",
        &series(report, "write"),
    );
    svg.push_str("</svg>\n");
    svg
}
