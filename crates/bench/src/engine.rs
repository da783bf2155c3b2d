//! `insitu bench engine`: the storage engine alone, side by side with the
//! peers a reader would compare it with, all in one run on the same keys:
//! point puts and gets against `std::collections::HashMap`, a log-traversal
//! scan against summing a flat `Vec<u64>` of the same bytes (the machine's
//! own limit), and memory utilisation after steady-state overwrites with the
//! cleaner working under a tight budget.

use std::collections::HashMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::engine_stall::{STALL_BOUND_NS, fixed_work_calls, steal_ms, time_calls};
use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use insitu_engine::{
    ENTRY_HEADER_BYTES_MAX, Engine, EngineConfig, HashRange, MAX_KEY_BYTES, RejectRules,
    index_bytes_for, object_entry_bytes,
};

pub struct EngineBenchArgs {
    pub objects: u64,
    pub key_bytes: usize,
    pub value_bytes: usize,
    /// Also write the figures as JSON here.
    pub json: Option<PathBuf>,
}

impl Default for EngineBenchArgs {
    fn default() -> Self {
        EngineBenchArgs {
            objects: 1_000_000,
            key_bytes: 30,
            value_bytes: 100,
            json: None,
        }
    }
}

const TABLE: u64 = 1;
/// Repetitions of the read-only measurements; the best one counts.
const REPEATS: usize = 5;

/// splitmix64: a bijection on u64, so distinct inputs give distinct keys.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Fixed-width records in one flat buffer (no per-key allocation to measure).
struct Records {
    bytes: Vec<u8>,
    width: usize,
}

impl Records {
    fn get(&self, i: usize) -> &[u8] {
        &self.bytes[i * self.width..(i + 1) * self.width]
    }
}

fn keys(n: usize, width: usize) -> Records {
    let mut bytes = vec![0u8; n * width];
    for (i, k) in bytes.chunks_exact_mut(width).enumerate() {
        k[..8].copy_from_slice(&mix(i as u64).to_le_bytes()); // unique
        for (j, b) in k[8..].iter_mut().enumerate() {
            *b = b'a' + (mix(i as u64 ^ ((j as u64) << 40)) % 26) as u8;
        }
    }
    Records { bytes, width }
}

/// Value `i` starts with the i64 `i * stamp` (what the scan sums).
fn values(n: usize, width: usize, stamp: i64) -> Records {
    let mut bytes = vec![0u8; n * width];
    for (i, v) in bytes.chunks_exact_mut(width).enumerate() {
        v[..8].copy_from_slice(&(i as i64 * stamp).to_le_bytes());
        v[8..].fill((i as u8).wrapping_add(stamp as u8));
    }
    Records { bytes, width }
}

/// A random permutation of 0..n (Fisher-Yates on splitmix64).
fn shuffled(n: usize, seed: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = (mix(seed ^ i as u64) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

fn ns_per(d: Duration, ops: usize) -> f64 {
    d.as_nanos() as f64 / ops.max(1) as f64
}

fn best_of<T>(repeats: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..repeats {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed());
        out = Some(r);
    }
    (best, out.expect("at least one repetition"))
}

/// Segments sized so even a small run has enough of them for the cleaner to
/// choose from (64+ segments of live data), at most the 2 MiB default.
fn segment_bytes_for(live_bytes: usize, largest_entry: usize) -> usize {
    (live_bytes / 64)
        .next_power_of_two()
        .clamp(16 * 1024, 2 * 1024 * 1024)
        .max((2 * largest_entry).next_power_of_two())
}

pub fn run(args: &EngineBenchArgs) -> anyhow::Result<serde_json::Value> {
    let n = usize::try_from(args.objects).context("object count")?;
    if n == 0 || n > u32::MAX as usize {
        bail!("--objects must be in 1..={}", u32::MAX);
    }
    if args.key_bytes < 8 || args.key_bytes > MAX_KEY_BYTES {
        bail!("key size must be in 8..={MAX_KEY_BYTES} bytes (8 make keys unique)");
    }
    if args.value_bytes < 8 {
        bail!("value size must be at least 8 bytes (the scan sums an i64 at offset 0)");
    }
    let (kb, vb) = (args.key_bytes, args.value_bytes);
    // Sized at the widest version the run can reach (the load plus the
    // overwrites: 4 bytes up to 2^32), a bound on every entry.
    let entry_bytes = object_entry_bytes(kb, vb, u64::from(u32::MAX));
    let live_bytes = n * entry_bytes;
    let segment_bytes = segment_bytes_for(live_bytes, entry_bytes + ENTRY_HEADER_BYTES_MAX);
    // Budget ~ live / 0.9 plus a few segments (heads and the cleaner's
    // reserves) plus the hash index, charged to the budget too (1.5 times
    // its final size: the old table exists beside the new one while it
    // grows): the overwrite phase cannot run without the cleaner.
    let budget_bytes =
        (live_bytes as f64 / 0.9).ceil() as usize + 4 * segment_bytes + index_bytes_for(n) * 3 / 2;
    let config = EngineConfig {
        segment_bytes,
        memory_budget_bytes: budget_bytes,
        max_value_bytes: vb,
    };
    let mut engine = Engine::with_max_key_bytes(config.clone(), kb)
        .map_err(|e| anyhow::anyhow!("engine config: {e}"))?;
    engine
        .create_tablet(TABLE, HashRange::FULL)
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    // Generated outside every timed loop.
    let keys = keys(n, kb);
    let vals = values(n, vb, 1);
    let order = shuffled(n, 0x5EED);
    let any = RejectRules::default();

    // ---- puts -----------------------------------------------------------------
    let t = Instant::now();
    for i in 0..n {
        engine
            .write(TABLE, keys.get(i), vals.get(i), &any)
            .map_err(|e| anyhow::anyhow!("put {i}: {e}"))?;
    }
    let put_ns = ns_per(t.elapsed(), n);
    // What each object costs beyond its key and value right after the load:
    // the log's headers and segment tails plus the hash index.
    let loaded = engine.memory();
    let overhead_bytes_per_object =
        (loaded.segment_bytes + loaded.index_bytes) as f64 / n as f64 - (kb + vb) as f64;
    let index_bytes_per_object = loaded.index_bytes as f64 / n as f64;

    let mut map: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let t = Instant::now();
    for i in 0..n {
        // Copying key and value into Vecs, as the engine copies them into its log.
        map.insert(keys.get(i).to_vec(), vals.get(i).to_vec());
    }
    let std_put_ns = ns_per(t.elapsed(), n);

    // ---- gets, random order --------------------------------------------------------
    let (get_time, found) = best_of(REPEATS.min(3), || {
        let mut sum = 0u64;
        for &i in &order {
            let o = engine
                .read(TABLE, keys.get(i as usize))
                .expect("every loaded key is readable");
            sum = sum.wrapping_add(u64::from(o.value[0]));
        }
        black_box(sum)
    });
    let (std_get_time, std_found) = best_of(REPEATS.min(3), || {
        let mut sum = 0u64;
        for &i in &order {
            let v = map
                .get(keys.get(i as usize))
                .expect("every loaded key is present");
            sum = sum.wrapping_add(u64::from(v[0]));
        }
        black_box(sum)
    });
    if found != std_found {
        bail!("engine and HashMap read different values");
    }
    let get_ns = ns_per(get_time, n);
    let std_get_ns = ns_per(std_get_time, n);
    drop(map);

    // ---- scan: log traversal vs a flat array of the same bytes -----------------------------
    let scan_bytes: usize = engine
        .segments(TABLE, 0)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .iter()
        .map(|s| s.len())
        .sum();
    let expected_sum: i64 = (0..n as i64).sum();
    let (scan_time, scan_sum) = best_of(REPEATS, || {
        let mut sum = 0i64;
        engine
            .for_each_log(TABLE, 0, |o| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&o.value[..8]);
                sum = sum.wrapping_add(i64::from_le_bytes(b));
            })
            .expect("tablet exists");
        black_box(sum)
    });
    if scan_sum != expected_sum {
        bail!("log scan summed {scan_sum}, expected {expected_sum}");
    }
    let flat: Vec<u64> = (0..(scan_bytes / 8) as u64).collect();
    let (flat_time, _) = best_of(REPEATS, || {
        black_box(
            black_box(&flat)
                .iter()
                .fold(0u64, |a, &x| a.wrapping_add(x)),
        )
    });
    let flat_bytes = flat.len() * 8;
    drop(flat);
    let scan_gbps = scan_bytes as f64 / scan_time.as_secs_f64() / 1e9;
    let flat_gbps = flat_bytes as f64 / flat_time.as_secs_f64() / 1e9;
    let scan_ns_per_object = ns_per(scan_time, n);
    let scan_bandwidth_fraction = scan_gbps / flat_gbps;

    // ---- replay: the loaded log rebuilt in a fresh engine ------------------------------
    // What a recovery master's core does with a tablet's segments once they
    // have arrived (ARCHITECTURE.md, "Replay"): verify every entry, keep the
    // newest of each key, append the winners and index them. The peer is a
    // plain copy of the same bytes into fresh memory, the least a rebuild
    // must do. Fresh engines each time, so every run faults its memory in,
    // as a recovery master does.
    let log: Vec<Vec<u8>> = engine
        .segments(TABLE, 0)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    let mut replay_time = Duration::MAX;
    for _ in 0..3 {
        let mut fresh = Engine::with_max_key_bytes(config.clone(), kb)
            .map_err(|e| anyhow::anyhow!("engine config: {e}"))?;
        let t = Instant::now();
        let report = fresh
            .replay(TABLE, HashRange::FULL, log.iter().map(Vec::as_slice))
            .map_err(|e| anyhow::anyhow!("replay: {e}"))?;
        replay_time = replay_time.min(t.elapsed());
        if report.objects_loaded != n as u64 || !report.corrupt.is_empty() {
            bail!("replay rebuilt {} of {n} objects", report.objects_loaded);
        }
    }
    let (copy_time, _) = best_of(3, || {
        let copies: Vec<Vec<u8>> = log.iter().map(|s| s.to_vec()).collect();
        black_box(copies.len())
    });
    drop(log);
    let replay_gbps = scan_bytes as f64 / replay_time.as_secs_f64() / 1e9;
    let copy_gbps = scan_bytes as f64 / copy_time.as_secs_f64() / 1e9;

    // ---- steady-state overwrites under the tight budget ------------------------------
    let overwrites = 3 * n;
    let new_vals = values(n, vb, 3);
    let picks: Vec<u32> = (0..overwrites as u64)
        .map(|i| (mix(i ^ 0xABCD) % n as u64) as u32)
        .collect();
    let cleaned_before = engine.cleaner_totals();
    // Every call is timed on its own: the cleaner's work lands on some
    // writes, and what a user sees in the tail is the longest of them.
    // Split by whether the cleaner moved entries in the call (a stall the
    // engine makes is cleaning work), and by whether the kernel switched
    // the thread out or faulted a page meanwhile (`engine_stall.rs`).
    let steal_before = steal_ms();
    let times = time_calls(
        &picks,
        &mut engine,
        |engine, i| {
            engine
                .write(TABLE, keys.get(i as usize), new_vals.get(i as usize), &any)
                .map(|_| ())
                .map_err(|e| anyhow::anyhow!("overwrite: {e}"))
        },
        |engine| engine.cleaner_totals().entries_moved,
    )?;
    let steal_during_ms = steal_ms()
        .zip(steal_before)
        .map(|(after, before)| after - before);
    let overwrite_ns = ns_per(times.wall_total, overwrites);
    let noise_steal_before = steal_ms();
    let noise = fixed_work_calls(&picks, vb, overwrite_ns)?;
    let noise_steal_ms = steal_ms()
        .zip(noise_steal_before)
        .map(|(after, before)| after - before);
    let call_ns = &times.call_ns;
    let us = |ns: u64| ns as f64 / 1000.0;
    let call_us = |q: f64| us(call_ns.value_at_quantile(q));
    let (call_us_p99, call_us_p999, call_us_max) =
        (call_us(0.99), call_us(0.999), us(call_ns.max()));
    // The bound on one engine call (and how many exceeded it: on a
    // shared machine a preempted call counts too).
    let over_bound =
        |h: &Histogram<u64>| h.count_between(STALL_BOUND_NS + 1, h.max().max(STALL_BOUND_NS + 1));
    let calls_over_500us = over_bound(call_ns);
    let memory = engine.memory();
    let cleaner = engine.cleaner_totals();
    // Headers are variable-width (the version's bytes), so the expected
    // live bytes are summed from each key's current version.
    let mut expected_live = 0u64;
    for i in 0..n {
        let o = engine
            .read(TABLE, keys.get(i))
            .map_err(|e| anyhow::anyhow!("read back key {i}: {e}"))?;
        expected_live += object_entry_bytes(kb, vb, o.version) as u64;
    }
    if memory.live_bytes != expected_live {
        bail!(
            "live bytes {} after overwrites, expected {expected_live}",
            memory.live_bytes
        );
    }

    let report = serde_json::json!({
        "objects": n,
        "key_bytes": kb,
        "value_bytes": vb,
        "segment_bytes": segment_bytes,
        "memory_budget_bytes": budget_bytes,
        "put_ns": put_ns,
        "overhead_bytes_per_object": overhead_bytes_per_object,
        "index_bytes_per_object": index_bytes_per_object,
        "get_ns": get_ns,
        "std_hashmap_put_ns": std_put_ns,
        "std_hashmap_get_ns": std_get_ns,
        "get_ratio_vs_std_hashmap": get_ns / std_get_ns,
        "scan_ns_per_object": scan_ns_per_object,
        "scan_log_bytes": scan_bytes,
        "scan_gb_per_s": scan_gbps,
        "flat_sum_gb_per_s": flat_gbps,
        "scan_bandwidth_fraction": scan_bandwidth_fraction,
        "replay_gb_per_s": replay_gbps,
        "replay_ns_per_object": ns_per(replay_time, n),
        "copy_gb_per_s": copy_gbps,
        "replay_fraction_of_copy": replay_gbps / copy_gbps,
        "overwrites": overwrites,
        "overwrite_ns": overwrite_ns,
        "overwrite_call_us_p99": call_us_p99,
        "overwrite_call_us_p999": call_us_p999,
        "max_write_stall_us": call_us_max,
        "overwrite_calls_over_500us": calls_over_500us,
        "max_write_stall_undisturbed_us": us(times.undisturbed_ns_max),
        "overwrite_calls_over_500us_undisturbed": times.undisturbed_calls_over_bound,
        "overwrite_calls_disturbed": times.disturbed_calls,
        "max_write_stall_cpu_us": us(times.cpu_ns_max),
        "overwrite_calls_over_500us_cpu": times.calls_over_bound_cpu,
        "overwrite_call_entries_moved_max": times.work_max,
        "max_write_stall_cleaning_us": us(times.working_ns_max),
        "max_write_stall_plain_us": us(times.plain_ns_max),
        "noise_call_ns_mean": ns_per(noise.wall_total, overwrites),
        "noise_max_call_us": us(noise.call_ns.max()),
        "noise_max_call_undisturbed_us": us(noise.undisturbed_ns_max),
        "noise_calls_over_500us": over_bound(&noise.call_ns),
        "noise_calls_disturbed": noise.disturbed_calls,
        "steal_ms_during_overwrites": steal_during_ms,
        "steal_ms_during_noise": noise_steal_ms,
        "memory_utilization": memory.utilization,
        "live_bytes": memory.live_bytes,
        "segment_bytes_held": memory.segment_bytes,
        "cleaner_segments_cleaned": cleaner.segments_cleaned - cleaned_before.segments_cleaned,
        "cleaner_entries_moved": cleaner.entries_moved - cleaned_before.entries_moved,
    });

    println!(
        "insitu engine benchmark: {n} objects, {kb}-byte keys, {vb}-byte values, {} KiB segments",
        segment_bytes / 1024
    );
    println!(
        "  {:<40} {:>12} {:>14} {:>8}",
        "measure", "engine", "peer", "ratio"
    );
    println!(
        "  {:<40} {:>12.1} {:>14.1} {:>8.2}",
        "put, ns/op (peer: std HashMap)",
        put_ns,
        std_put_ns,
        put_ns / std_put_ns
    );
    println!(
        "  {:<40} {:>12.1} {:>14.1} {:>8.2}",
        "get random order, ns/op (peer: HashMap)",
        get_ns,
        std_get_ns,
        get_ns / std_get_ns
    );
    println!(
        "  {:<40} {:>12.2} {:>14.2} {:>8.2}",
        "scan, GB/s (peer: flat Vec<u64> sum)", scan_gbps, flat_gbps, scan_bandwidth_fraction
    );
    println!("  {:<40} {:>12.1}", "scan, ns/object", scan_ns_per_object);
    println!(
        "  {:<40} {:>12.2} {:>14.2} {:>8.2}",
        "replay, GB/s (peer: copy of the log)",
        replay_gbps,
        copy_gbps,
        replay_gbps / copy_gbps
    );
    println!(
        "  {:<40} {:>12.1}",
        "bytes per object beyond key + value", overhead_bytes_per_object
    );
    println!(
        "  {:<40} {:>12.1}",
        "overwrite under a tight budget, ns/op", overwrite_ns
    );
    println!(
        "  {:<40} {:>12.1}   (p99 {:.1}, p99.9 {:.1}; {} calls over 500 us)",
        "longest overwrite call, us", call_us_max, call_us_p99, call_us_p999, calls_over_500us
    );
    println!(
        "  {:<40} {:>12.1}   ({} calls over 500 us; {} of {} calls switched out or faulted)",
        "longest call the kernel left alone, us",
        us(times.undisturbed_ns_max),
        times.undisturbed_calls_over_bound,
        times.disturbed_calls,
        overwrites
    );
    println!(
        "  {:<40} {:>12.1}   (cleaning {:.1}, no cleaning {:.1})",
        "longest overwrite call by kind, us",
        call_us_max,
        us(times.working_ns_max),
        us(times.plain_ns_max)
    );
    println!(
        "  {:<40} {:>12.1}   (left alone {:.1}; calls of fixed work, mean {:.0} ns)",
        "longest fixed-work call, us",
        us(noise.call_ns.max()),
        us(noise.undisturbed_ns_max),
        ns_per(noise.wall_total, overwrites)
    );
    if let (Some(ms), Some(noise_ms)) = (steal_during_ms, noise_steal_ms) {
        println!(
            "  {:<40} {:>12.0}   (fixed work: {:.0}; the host ran others on this machine's CPUs)",
            "steal during the overwrites, ms", ms, noise_ms
        );
    }
    println!(
        "  {:<40} {:>12}",
        "most entries one overwrite copied", times.work_max
    );
    println!(
        "  {:<40} {:>12.3}   ({} live of {} held, budget {})",
        "memory utilisation after 3x overwrites",
        memory.utilization,
        memory.live_bytes,
        memory.segment_bytes,
        budget_bytes
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_run_produces_every_figure() {
        let args = EngineBenchArgs {
            objects: 1000,
            ..EngineBenchArgs::default()
        };
        let r = run(&args).expect("bench");
        for key in [
            "put_ns",
            "get_ns",
            "std_hashmap_put_ns",
            "std_hashmap_get_ns",
            "scan_ns_per_object",
            "scan_bandwidth_fraction",
            "replay_gb_per_s",
            "replay_fraction_of_copy",
            "memory_utilization",
            "overwrite_call_us_p99",
            "max_write_stall_us",
            "max_write_stall_cpu_us",
            "max_write_stall_plain_us",
            "max_write_stall_undisturbed_us",
            "noise_call_ns_mean",
            "noise_max_call_us",
            "overhead_bytes_per_object",
            "index_bytes_per_object",
        ] {
            let v = r[key].as_f64().unwrap_or(f64::NAN);
            assert!(v.is_finite() && v > 0.0, "{key} = {v}");
        }
    }
}
