//! `insitu bench recovery`: how long a dead server's data takes to come back.
//!
//! Loads N MB into one server of S (the table is created while that server is
//! the only one, so every tablet lands there; the others join afterwards and
//! hold its replicas), kills it with SIGKILL, and measures the time from the
//! kill to (a) the coordinator declaring it dead (`detect_ms`) and (b) every
//! tablet answering reads again (`recover_ms`, counted from the detection:
//! a multi-read of `SAMPLE_KEYS` keys spread over the key space, which
//! reaches every tablet, all found). Beside it, also from the detection:
//! every tablet with a live owner on record (`owners_ms`) and every tablet
//! taking writes again (`writable_ms`, the sample written back with its own
//! values). Every object is then read back and compared (`verify_ms`, not
//! part of the recovery time): `objects_lost` must be 0.
//!
//! Meanwhile a probe pings every shard of the surviving servers in turn
//! (one `Ping` at a time, 1 ms apart) from the kill to the end of the
//! recovery: `probe_ping_ms_max` is the longest any of them waited, what a
//! request to a recovery master's shard may wait while it recovers. It
//! pings the survivors' backup ports too: `backup_ping_ms_max` is what the
//! coordinator's failure detector (which pings there) may wait meanwhile;
//! near the failure timeout (500 ms by default), a busy recovery master
//! would be declared dead.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use insitu_client::{Client, ClientConfig};
use insitu_protocol::ServerState;
use serde_json::json;

use crate::kv_procs::start_insitu;
use crate::pushdown_cluster::write_json;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Megabytes of objects to load into the server that is killed.
    #[arg(long, default_value_t = 256)]
    pub mb: usize,
    /// Storage servers in all (the killed one included); at least 2.
    #[arg(long, default_value_t = 3)]
    pub servers: usize,
    /// Tablets of the table (all on the killed server): the recovery
    /// partitions, spread over the surviving servers.
    #[arg(long, default_value_t = 8)]
    pub tablets: u32,
    /// Bytes per value.
    #[arg(long, default_value_t = 1000)]
    pub value_bytes: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Keys read to tell that every tablet answers again (see the module docs).
const SAMPLE_KEYS: u64 = 256;

fn key(i: u64) -> [u8; 8] {
    i.to_le_bytes()
}

/// A value that names its key, so a read-back proves which object it is.
fn value(i: u64, bytes: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(bytes);
    v.extend_from_slice(&i.to_le_bytes());
    v.resize(bytes.max(8), (i % 251) as u8);
    v
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.servers < 2 {
        bail!("--servers must be at least 2: one to kill and one to recover it");
    }
    if args.value_bytes < 8 {
        bail!("--value-bytes must be at least 8");
    }
    let objects = ((args.mb as u64) << 20) / args.value_bytes as u64;
    let dir = tempdir()?;
    let port = insitu_testkit::free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let coord_dir = dir.join("coordinator");
    let (_coordinator, _) = start_insitu(
        "coordinator",
        None,
        &[
            "coordinator".into(),
            "--port".into(),
            port.to_string(),
            "--dir".into(),
            path_str(&coord_dir)?,
        ],
        "insitu coordinator at",
    )?;
    // Room for the data, its replicas of others and the recovered tablets.
    let memory_mb = (args.mb * 3 + 256).to_string();
    let server = |i: usize| {
        start_insitu(
            "server",
            None,
            &[
                "server".into(),
                "--coordinator".into(),
                addr.clone(),
                "--dir".into(),
                path_str(&dir.join(format!("server-{i}")))?,
                "--shards".into(),
                "1".into(),
                "--memory-mb".into(),
                memory_mb.clone(),
            ],
            "insitu server",
        )
    };
    let (mut victim, _) = server(0)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let config = ClientConfig {
        op_timeout: Duration::from_secs(120),
        ..ClientConfig::default()
    };
    let client = rt.block_on(Client::connect_with(&addr, config))?;
    let table = rt
        .block_on(client.create_table("recovery", args.tablets))?
        .id;
    let mut others = Vec::new();
    for i in 1..args.servers {
        others.push(server(i)?.0);
    }
    // The victim's shards learn of new backups from the coordinator's list,
    // fetched every second: until then its segments could only be placed on
    // its own disk, which dies with it.
    std::thread::sleep(Duration::from_millis(2500));

    eprintln!(
        "loading {objects} objects of {} bytes ({} MB) into server 0 ...",
        args.value_bytes, args.mb
    );
    let bar = indicatif::ProgressBar::new(objects);
    const BATCH: u64 = 1000;
    rt.block_on(async {
        let mut i = 0;
        while i < objects {
            let end = (i + BATCH).min(objects);
            let items: Vec<([u8; 8], Vec<u8>)> = (i..end)
                .map(|k| (key(k), value(k, args.value_bytes)))
                .collect();
            for r in client.multi_write(table, &items).await? {
                if let Err(e) = r {
                    bail!("loading failed: {e}");
                }
            }
            bar.inc(end - i);
            i = end;
        }
        anyhow::Ok(())
    })?;
    bar.finish_and_clear();

    let victim_id = rt.block_on(async {
        let servers = client.list_servers().await?;
        servers
            .iter()
            .map(|s| s.id)
            .min()
            .context("no servers listed")
    })?;
    // (address, whether it is a backup port) of every survivor's port.
    let survivors: Vec<(String, bool)> = rt
        .block_on(client.list_servers())?
        .into_iter()
        .filter(|s| s.id != victim_id)
        .flat_map(|s| {
            let backup = Some(s.backup_addr).filter(|a| !a.is_empty());
            let shards = s.shard_addrs.into_iter().map(|a| (a, false));
            shards.chain(backup.map(|a| (a, true)))
        })
        .collect();
    let stop_probe = Arc::new(AtomicBool::new(false));
    let probe = std::thread::spawn({
        let stop = stop_probe.clone();
        move || ping_probe(&survivors, &stop)
    });
    eprintln!("killing server {victim_id} (SIGKILL) ...");
    let killed = Instant::now();
    victim.kill();
    let detected = rt.block_on(async {
        loop {
            let servers = client.list_servers().await?;
            let alive = servers
                .iter()
                .any(|s| s.id == victim_id && s.state == ServerState::Up);
            if !alive {
                return anyhow::Ok(Instant::now());
            }
            if killed.elapsed() > Duration::from_secs(120) {
                bail!("server {victim_id} was not declared dead within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })?;
    // Every tablet of the table has a live owner again (the coordinator
    // commits an owner once its recovery master replayed the tablet, and
    // activates it for reads right after).
    let owners = rt.block_on(async {
        loop {
            let tables = client.list_tables().await?;
            let done = tables.iter().filter(|t| t.id == table).all(|t| {
                t.tablets
                    .iter()
                    .all(|x| x.server_id != 0 && x.server_id != victim_id)
            });
            if done {
                return anyhow::Ok(Instant::now());
            }
            if killed.elapsed() > Duration::from_secs(600) {
                bail!("the table was not recovered within 600 s");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })?;
    // Recovered: every tablet answers reads. A sample spread over the keys
    // reaches every tablet (missing one of 8 with 256 keys: ~1e-14).
    let sample: Vec<u64> = (0..SAMPLE_KEYS)
        .map(|j| j * objects / SAMPLE_KEYS)
        .collect();
    let recovered = rt.block_on(async {
        let keys: Vec<[u8; 8]> = sample.iter().map(|&i| key(i)).collect();
        loop {
            let results = client.multi_read(table, &keys).await?;
            if results.iter().all(|r| matches!(r, Ok(Some(_)))) {
                return anyhow::Ok(Instant::now());
            }
            if killed.elapsed() > Duration::from_secs(600) {
                bail!("the table was not readable within 600 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })?;
    // Writable: the sample written back (same values), every write taken.
    let writable = rt.block_on(async {
        let items: Vec<([u8; 8], Vec<u8>)> = sample
            .iter()
            .map(|&i| (key(i), value(i, args.value_bytes)))
            .collect();
        loop {
            let results = client.multi_write(table, &items).await?;
            if results.iter().all(|r| r.is_ok()) {
                return anyhow::Ok(Instant::now());
            }
            if killed.elapsed() > Duration::from_secs(600) {
                bail!("the table did not take writes within 600 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })?;
    stop_probe.store(true, Ordering::Relaxed);
    let (probe_pings, probe_ping_ms_max, backup_ping_ms_max) = probe
        .join()
        .map_err(|_| anyhow::anyhow!("the ping probe panicked"))??;
    // Then every key is read back and compared (not timed: the check, not
    // the recovery).
    let verify_started = Instant::now();
    // Readable again: every key read back, in multi-read batches, retried
    // while tablets are still being recovered (the client does that).
    let (lost, wrong) = rt.block_on(async {
        let (mut lost, mut wrong) = (0u64, 0u64);
        let mut i = 0;
        while i < objects {
            let end = (i + BATCH).min(objects);
            let keys: Vec<[u8; 8]> = (i..end).map(key).collect();
            let results = client.multi_read(table, &keys).await?;
            for (k, r) in (i..end).zip(results) {
                match r {
                    Ok(Some((v, _))) if v[..] == value(k, args.value_bytes)[..] => {}
                    Ok(Some(_)) => wrong += 1,
                    Ok(None) => lost += 1,
                    Err(e) => bail!("reading key {k} back failed: {e}"),
                }
            }
            i = end;
        }
        anyhow::Ok((lost, wrong))
    })?;
    let verify_ms = verify_started.elapsed().as_secs_f64() * 1e3;
    let detect_ms = (detected - killed).as_secs_f64() * 1e3;
    let recover_ms = (recovered - detected).as_secs_f64() * 1e3;
    let owners_ms = (owners - detected).as_secs_f64() * 1e3;
    let writable_ms = (writable - detected).as_secs_f64() * 1e3;
    let gb = args.mb as f64 / 1024.0;
    let per_gb = (detect_ms + recover_ms) / 1e3 / gb;
    println!(
        "{} MB ({objects} objects) on 1 of {} servers: detected in {detect_ms:.0} ms, \
         readable {recover_ms:.0} ms later ({per_gb:.2} s per GB), writable {writable_ms:.0} ms \
         later; every object read back in {verify_ms:.0} ms: lost {lost}, wrong {wrong}",
        args.mb, args.servers
    );
    println!(
        "a ping to a surviving server's shard waited at most {probe_ping_ms_max:.1} ms, to its \
         backup port (where failures are detected) {backup_ping_ms_max:.1} ms, during the \
         recovery ({probe_pings} pings)"
    );
    println!(
        "(target: 1 GB in at most 2 s with 3 servers; RAMCloud ~0.6 GB/s per recovery master)"
    );
    if let Some(path) = &args.json {
        write_json(
            path,
            &json!({
                "mb": args.mb, "servers": args.servers, "tablets": args.tablets,
                "objects": objects, "value_bytes": args.value_bytes,
                "detect_ms": detect_ms, "recover_ms": recover_ms,
                "owners_ms": owners_ms, "writable_ms": writable_ms,
                "recovery_seconds_per_gb": per_gb,
                "objects_lost": lost, "objects_wrong": wrong, "verify_ms": verify_ms,
                "probe_pings": probe_pings, "probe_ping_ms_max": probe_ping_ms_max,
                "backup_ping_ms_max": backup_ping_ms_max,
            }),
        )?;
    }
    drop(others);
    let _ = std::fs::remove_dir_all(&dir);
    if lost + wrong > 0 {
        bail!("{lost} objects lost and {wrong} wrong after recovery");
    }
    Ok(())
}

/// Ping every address (and whether it is a backup port) in turn, 1 ms
/// apart, until `stop`: the pings sent and the longest round trip (ms) to a
/// shard and to a backup port.
fn ping_probe(addrs: &[(String, bool)], stop: &AtomicBool) -> anyhow::Result<(u64, f64, f64)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut conns = Vec::with_capacity(addrs.len());
        for (a, backup) in addrs {
            conns.push((insitu_client::rpc::RpcConn::connect(a).await?, *backup));
        }
        let mut pings = 0u64;
        // Longest round trip to a shard [0] and to a backup port [1].
        let mut longest = [Duration::ZERO; 2];
        while !stop.load(Ordering::Relaxed) {
            for (c, backup) in &conns {
                let sent = Instant::now();
                let reply = c
                    .call_timeout(&insitu_protocol::Request::Ping, Duration::from_secs(60))
                    .await?;
                if !reply.status.is_ok() {
                    bail!("a ping was refused: {}", reply.error_message());
                }
                let kind = usize::from(*backup);
                longest[kind] = longest[kind].max(sent.elapsed());
                pings += 1;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        anyhow::Ok((pings, ms(longest[0]), ms(longest[1])))
    })
}

fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("insitu-bench-recovery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

fn path_str(p: &std::path::Path) -> anyhow::Result<String> {
    p.to_str()
        .map(str::to_string)
        .with_context(|| format!("{} is not UTF-8", p.display()))
}
