//! `insitu bench gradient`: the seed's logistic-regression experiment (002)
//! — one gradient of the log-likelihood over all points, computed on the
//! server — against the machine's own limit: the same kernel over a flat
//! `Vec<f32>` in this process, and NumPy when it is installed.
//!
//! Points: `--dims` little-endian f32 at byte 0 of the value, then a label
//! byte; keys are 8-byte integers. One server, one shard, four tablets.
//! `max_rel_error` = max_j |pushdown_j - flat_j| / max_j |flat_j| over the
//! weight gradient (relative to its largest component, so near-zero
//! components do not make the figure meaningless), and the same for the
//! bias gradient and the log-loss: the largest of the three.

use std::path::PathBuf;
use std::time::Instant;

use insitu_compute::gradient_flat;
use insitu_protocol::plan::{GradPartial, PointLayout, int_key};
use serde_json::json;

use crate::pushdown_cluster::{LocalCluster, python};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[arg(long, default_value_t = 200_000)]
    pub points: u64,
    #[arg(long, default_value_t = 256)]
    pub dims: u32,
    #[arg(long, default_value_t = 5)]
    pub repeats: u32,
    /// Skip the NumPy reference.
    #[arg(long)]
    pub no_numpy: bool,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Deterministic points: x uniform in [-1, 1), label from a fixed hyperplane plus noise.
pub fn make_points(n: usize, dims: usize) -> (Vec<f32>, Vec<u8>) {
    let mut rng = insitu_testkit::rng(0x9E37_79B9_7F4A_7C15);
    let mut rnd = move || rng.f32() * 2.0 - 1.0;
    let truth: Vec<f32> = (0..dims)
        .map(|j| if j % 2 == 0 { 1.0 } else { -0.5 })
        .collect();
    let mut x = Vec::with_capacity(n * dims);
    let mut y = Vec::with_capacity(n);
    for _ in 0..n {
        let start = x.len();
        for _ in 0..dims {
            x.push(rnd());
        }
        let z: f32 = x[start..]
            .iter()
            .zip(&truth)
            .map(|(a, b)| a * b)
            .sum::<f32>()
            + rnd();
        y.push((z > 0.0) as u8);
    }
    (x, y)
}

/// The value of point `i`: its vector's bytes, then its label.
pub fn point_value(x: &[f32], y: &[u8], dims: usize, i: usize, out: &mut Vec<u8>) {
    for f in &x[i * dims..(i + 1) * dims] {
        out.extend_from_slice(&f.to_le_bytes());
    }
    out.push(y[i]);
}

fn rel_error(a: &GradPartial, b: &GradPartial) -> f64 {
    let scale = b.grad.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    let g = a
        .grad
        .iter()
        .zip(&b.grad)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale;
    let bias = (a.bias - b.bias).abs() / b.bias.abs().max(scale);
    let loss = (a.loss - b.loss).abs() / b.loss.abs().max(1e-30);
    g.max(bias).max(loss)
}

fn numpy_ns_per_point(x: &[f32], y: &[u8], dims: usize, w: &[f32], bias: f32) -> Option<f64> {
    let dir = std::env::temp_dir().join(format!("insitu-grad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let as_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|f| f.to_le_bytes()).collect() };
    std::fs::write(dir.join("x.f32"), as_bytes(x)).ok()?;
    std::fs::write(dir.join("y.u8"), y).ok()?;
    std::fs::write(dir.join("w.f32"), as_bytes(w)).ok()?;
    let script = r#"
import sys, time, numpy as np
d, dims, b = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
X = np.fromfile(d + "/x.f32", dtype=np.float32).reshape(-1, dims)
y = np.fromfile(d + "/y.u8", dtype=np.uint8).astype(np.float32)
w = np.fromfile(d + "/w.f32", dtype=np.float32)
best = None
for _ in range(5):
    t = time.perf_counter()
    z = X @ w + np.float32(b)
    p = 1.0 / (1.0 + np.exp(-z))
    e = p - y
    g = X.T @ e
    gb = e.sum()
    loss = (np.logaddexp(0, z) - y * z).sum()
    dt = time.perf_counter() - t
    best = dt if best is None else min(best, dt)
print(best * 1e9 / X.shape[0])
"#;
    let out = python(
        "numpy",
        script,
        &[
            dir.to_string_lossy().into_owned(),
            dims.to_string(),
            bias.to_string(),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    out?.parse().ok()
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let n = args.points as usize;
    let dims = args.dims as usize;
    anyhow::ensure!(n > 0 && dims > 0, "--points and --dims must be positive");
    let (x, y) = make_points(n, dims);
    let w: Vec<f32> = (0..dims).map(|j| ((j % 7) as f32 - 3.0) * 0.01).collect();
    let bias = 0.1f32;
    let layout = PointLayout {
        offset: 0,
        dims: dims as u32,
        label_offset: (dims * 4) as u32,
    };
    let memory_mb = ((n as u64 * (dims as u64 * 4 + 160)) >> 20) as usize * 3 / 2 + 256;
    let c = LocalCluster::start(1, 1, memory_mb)?;
    // Several tablets on the one shard, so the partial sums are merged in a
    // different order than the flat loop's and max_rel_error measures that.
    let table = c.create_table("points", 4)?;
    let load = c.load(table, n as u64, |i, k, v| {
        k.extend_from_slice(&int_key(i));
        point_value(&x, &y, dims, i as usize, v);
    })?;
    eprintln!(
        "loaded {n} points of {dims} dims in {:.1} s",
        load.as_secs_f64()
    );

    let mut best = f64::MAX;
    let mut pushed = None;
    for _ in 0..args.repeats.max(1) {
        let t = Instant::now();
        let out = c.rt.block_on(c.client.execute_plan(
            table,
            &insitu_protocol::plan::ScanPlan::new(insitu_protocol::plan::Op::Gradient {
                layout,
                weights: w.clone(),
                bias,
            }),
        ))?;
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / n as f64);
        match out.partial {
            insitu_protocol::plan::Partial::Gradient(g) => pushed = Some(g),
            other => anyhow::bail!("unexpected partial {other:?}"),
        }
    }
    c.shutdown();
    let pushed = pushed.expect("at least one repeat");
    anyhow::ensure!(
        pushed.count == n as u64,
        "gradient over {} points, expected {n}",
        pushed.count
    );

    let mut flat_best = f64::MAX;
    let mut flat = None;
    for _ in 0..args.repeats.max(1) {
        let t = Instant::now();
        let g = gradient_flat(std::hint::black_box(&x), &y, dims, &w, bias);
        flat_best = flat_best.min(t.elapsed().as_secs_f64() * 1e9 / n as f64);
        flat = Some(g);
    }
    let flat = flat.expect("at least one repeat");
    let err = rel_error(&pushed, &flat);
    let numpy = if args.no_numpy {
        None
    } else {
        numpy_ns_per_point(&x, &y, dims, &w, bias)
    };
    let fraction = flat_best / best;
    println!("points {n}, dims {dims}");
    println!(
        "pushdown gradient      {best:>10.1} ns/point (client-observed; 4 tablets on one shard)"
    );
    println!("flat Vec<f32> gradient {flat_best:>10.1} ns/point");
    match numpy {
        Some(np) => println!("NumPy                  {np:>10.1} ns/point"),
        None => println!("NumPy                  skipped (not installed)"),
    }
    println!(
        "fraction_of_flat {fraction:.3}   max_rel_error {err:.2e}   (the seed: 1014 ns/point)"
    );
    crate::json_report::write_if_asked(args.json.as_deref(), || {
        json!({
            "points": n, "dims": dims,
            "ns_per_point": best,
            "flat_ns_per_point": flat_best,
            "fraction_of_flat": fraction,
            "max_rel_error": err,
            "numpy_ns_per_point": numpy,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoke_tiny_sizes() {
        let v = crate::pushdown_cluster::smoke_json("grad", |path| {
            run(&Args {
                points: 300,
                dims: 16,
                repeats: 1,
                no_numpy: true,
                json: Some(path),
            })
        })
        .unwrap();
        assert!(v["max_rel_error"].as_f64().unwrap() <= 1e-4);
    }
}
