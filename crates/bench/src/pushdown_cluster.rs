//! An in-process cluster for the data-operation benchmarks: a coordinator
//! and N storage servers on loopback (their shards run on their own
//! threads, as in `insitu up`), a client runtime, bulk loading, and the
//! Python references (DuckDB, NumPy).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use insitu_client::{Client, ClientConfig};
use insitu_coordinator::{CoordinatorConfig, CoordinatorHandle};
use insitu_server::{ServerConfig, ServerHandle};

pub struct LocalCluster {
    pub rt: tokio::runtime::Runtime,
    coordinator: Option<CoordinatorHandle>,
    servers: Vec<ServerHandle>,
    dir: PathBuf,
    pub addr: String,
    pub client: Client,
}

impl LocalCluster {
    /// `servers` servers of `shards` shards each, `memory_mb` per server.
    pub fn start(servers: usize, shards: usize, memory_mb: usize) -> anyhow::Result<LocalCluster> {
        Self::start_with(servers, shards, memory_mb, Self::default_replicas())
    }

    /// The coordinator's default replicas per segment.
    pub fn default_replicas() -> u32 {
        CoordinatorConfig::new(PathBuf::new()).replicas
    }

    /// `start`, with `replicas` replicas per segment (0: in memory only).
    pub fn start_with(
        servers: usize,
        shards: usize,
        memory_mb: usize,
        replicas: u32,
    ) -> anyhow::Result<LocalCluster> {
        // One thread for the client (and the idle coordinator): waking a task
        // on another thread costs tens of microseconds here, more than a
        // loopback round trip, so the client's I/O tasks and the code awaiting
        // them share a thread. The servers' shards run on their own threads.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "insitu-bench-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        let (coordinator, handles, addr, client) = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let mut config = CoordinatorConfig::new(dir.join("coordinator"));
            config.replicas = replicas;
            let coordinator = insitu_coordinator::start(config, listener).await?;
            let addr = coordinator.addr().to_string();
            let mut handles = Vec::new();
            for i in 0..servers {
                let mut c = ServerConfig::new(addr.clone(), dir.join(format!("server-{i}")));
                c.shards = shards;
                c.engine.memory_budget_bytes = memory_mb << 20;
                handles.push(insitu_server::start(c).await?);
            }
            let client = Client::connect_with(
                &addr,
                ClientConfig {
                    op_timeout: Duration::from_secs(600),
                    ..ClientConfig::default()
                },
            )
            .await?;
            anyhow::Ok((coordinator, handles, addr, client))
        })?;
        Ok(LocalCluster {
            rt,
            coordinator: Some(coordinator),
            servers: handles,
            dir,
            addr,
            client,
        })
    }

    /// Create `name` with `tablets` tablets; returns its id.
    pub fn create_table(&self, name: &str, tablets: u32) -> anyhow::Result<u64> {
        Ok(self
            .rt
            .block_on(self.client.create_table(name, tablets))?
            .id)
    }

    /// Write `n` objects, `make(i)` giving (key, value), in parallel batches.
    pub fn load(
        &self,
        table: u64,
        n: u64,
        make: impl Fn(u64, &mut Vec<u8>, &mut Vec<u8>) + Sync,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let batch = 2000u64;
        let inflight = 4u64;
        let make = &make;
        self.rt.block_on(async {
            let mut next = 0u64;
            while next < n {
                let mut futs = Vec::new();
                for _ in 0..inflight {
                    if next >= n {
                        break;
                    }
                    let end = (next + batch).min(n);
                    let items: Vec<(Vec<u8>, Vec<u8>)> = (next..end)
                        .map(|i| {
                            let (mut k, mut v) = (Vec::new(), Vec::new());
                            make(i, &mut k, &mut v);
                            (k, v)
                        })
                        .collect();
                    next = end;
                    let client = self.client.clone();
                    futs.push(async move {
                        let results = client.multi_write(table, &items).await?;
                        for r in results {
                            r?;
                        }
                        anyhow::Ok(())
                    });
                }
                for r in futures_join(futs).await {
                    r?;
                }
            }
            anyhow::Ok(())
        })?;
        Ok(started.elapsed())
    }

    pub fn shutdown(mut self) {
        for s in self.servers.drain(..) {
            s.shutdown();
        }
        if let Some(c) = self.coordinator.take() {
            self.rt.block_on(c.shutdown());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn futures_join<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut out = Vec::with_capacity(futs.len());
    let handles: Vec<_> = futs.into_iter().map(Box::pin).collect();
    // Poll all concurrently.
    let joined = join_all(handles).await;
    out.extend(joined);
    out
}

async fn join_all<F: std::future::Future + Unpin>(mut futs: Vec<F>) -> Vec<F::Output> {
    use std::task::Poll;
    let mut results: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if results[i].is_none() {
                match std::pin::Pin::new(f).poll(cx) {
                    Poll::Ready(v) => results[i] = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    results.into_iter().map(|r| r.expect("ready")).collect()
}

/// Run a Python snippet; `Ok(None)` (with a note on stderr) if Python or the
/// module is unavailable even after trying `pip install`.
pub fn python(module: &str, script: &str, args: &[String]) -> Option<String> {
    let has = |m: &str| {
        Command::new("python3")
            .args(["-c", &format!("import {m}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has(module) {
        eprintln!("note: python module {module} missing; trying `python3 -m pip install {module}`");
        let _ = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", module])
            .status();
        if !has(module) {
            eprintln!("note: {module} unavailable: its column is skipped");
            return None;
        }
    }
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "note: the {module} reference failed, its column is skipped: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Write `value` as pretty JSON to `path`, and say so on stdout.
pub fn write_json(path: &std::path::Path, value: &serde_json::Value) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(value)? + "\n")
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// For smoke tests: run a benchmark that writes its JSON report to the path
/// it is given (a fresh file under the temp dir), and return the parsed report.
pub fn smoke_json(
    name: &str,
    run: impl FnOnce(std::path::PathBuf) -> anyhow::Result<()>,
) -> anyhow::Result<serde_json::Value> {
    let path =
        std::env::temp_dir().join(format!("insitu-{name}-smoke-{}.json", std::process::id()));
    run(path.clone())?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("the {name} benchmark wrote no {}", path.display()))?;
    let _ = std::fs::remove_file(&path);
    Ok(serde_json::from_str(&text)?)
}

/// Parse "a,b,c" into numbers.
pub fn parse_list<T: std::str::FromStr>(s: &str, what: &str) -> anyhow::Result<Vec<T>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|_| anyhow::anyhow!("bad {what} {x:?} in {s:?}"))
        })
        .collect()
}
