//! The server roles: `up`, `coordinator`, `server`.

use std::path::PathBuf;

use anyhow::Context;
use insitu_coordinator::CoordinatorConfig;
use insitu_server::ServerConfig;

#[derive(clap::Args)]
pub struct UpArgs {
    /// Storage servers to run.
    #[arg(long, default_value_t = 2)]
    servers: usize,
    /// Shards (event-loop threads) per server; default: one per core.
    #[arg(long)]
    shards: Option<usize>,
    /// Data directory for the coordinator's metadata and the servers.
    #[arg(long, default_value = "./insitu-data")]
    dir: PathBuf,
    /// Coordinator port (clients connect here).
    #[arg(long, default_value_t = 7070)]
    port: u16,
    /// Memory budget per server, in MiB.
    #[arg(long, default_value_t = 4096)]
    memory_mb: usize,
}

#[derive(clap::Args)]
pub struct CoordinatorArgs {
    #[arg(long, default_value_t = 7070)]
    port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Directory for the durable metadata.
    #[arg(long, default_value = "./insitu-data/coordinator")]
    dir: PathBuf,
}

#[derive(clap::Args)]
pub struct ServerArgs {
    /// Coordinator address.
    #[arg(long, env = "INSITU_CLUSTER", default_value = "127.0.0.1:7070")]
    coordinator: String,
    /// Port of shard 0; shard i listens on PORT+i. 0 picks free ports.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Address to listen on and advertise.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value = "./insitu-data/server")]
    dir: PathBuf,
    /// Shards (event-loop threads); default: one per core.
    #[arg(long)]
    shards: Option<usize>,
    /// Memory budget for the whole server, in MiB.
    #[arg(long, default_value_t = 4096)]
    memory_mb: usize,
    /// Take over the addresses of a registered server with another identity
    /// (one that is dead; its tablets are re-created empty). Without it, the
    /// coordinator refuses a server whose address another server already has.
    #[arg(long)]
    replace: bool,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

fn server_config(
    coordinator: String,
    host: String,
    port: u16,
    dir: PathBuf,
    shards: Option<usize>,
    memory_mb: usize,
) -> ServerConfig {
    let mut c = ServerConfig::new(coordinator, dir);
    c.host = host;
    c.base_port = port;
    if let Some(s) = shards {
        c.shards = s;
    }
    c.engine.memory_budget_bytes = memory_mb.saturating_mul(1 << 20);
    c
}

pub fn up(args: UpArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=64).contains(&args.servers),
        "--servers must be between 1 and 64"
    );
    runtime()?.block_on(async move {
        std::fs::create_dir_all(&args.dir).with_context(|| format!("cannot create {}", args.dir.display()))?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
            .await
            .with_context(|| format!("cannot listen on 127.0.0.1:{} (is another insitu running? try --port)", args.port))?;
        // Every server of a previous run lived in that run's process: forget
        // them, so their tablets are re-created (empty) on this run's servers.
        let mut config = CoordinatorConfig::new(args.dir.join("coordinator"));
        config.forget_servers = true;
        // Re-create the previous run's tablets once all servers are in, so
        // they spread over all of them.
        config.rehome_after_servers = args.servers;
        let coordinator = insitu_coordinator::start(config, listener).await?;
        let kept = coordinator.orphaned_table_names();
        let addr = coordinator.addr().to_string();
        let mut servers = Vec::new();
        for i in 0..args.servers {
            let config = server_config(addr.clone(), "127.0.0.1".into(), 0, args.dir.join(format!("server-{i}")), args.shards, args.memory_mb);
            servers.push(insitu_server::start(config).await.with_context(|| format!("starting server {i}"))?);
        }
        let shards: usize = servers.iter().map(|s| s.shard_addrs.len()).sum();
        println!("insitu is up: coordinator at {addr}, {} servers, {shards} shards, data under {}", servers.len(), args.dir.display());
        if !kept.is_empty() {
            println!("warning: {}", kept_tables_warning(&kept));
        }
        println!("  try: insitu --cluster {addr} table create demo --tablets 4   (or export INSITU_CLUSTER={addr})");
        println!("  Ctrl-C to stop.");
        wait_for_stop().await?;
        eprintln!("shutting down...");
        tokio::task::spawn_blocking(move || servers.into_iter().for_each(|s| s.shutdown())).await?;
        coordinator.shutdown().await;
        eprintln!("stopped.");
        Ok(())
    })
}

pub fn coordinator(args: CoordinatorArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        // Standalone servers may outlive the coordinator: keep them (a server
        // restarted on the same addresses retires its old entry when it enlists).
        let handle =
            insitu_coordinator::start(CoordinatorConfig::new(args.dir.clone()), listener).await?;
        println!(
            "insitu coordinator at {}, metadata in {}",
            handle.addr(),
            args.dir.display()
        );
        wait_for_stop().await?;
        handle.shutdown().await;
        Ok(())
    })
}

pub fn server(args: ServerArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        let mut config = server_config(
            args.coordinator,
            args.host,
            args.port,
            args.dir,
            args.shards,
            args.memory_mb,
        );
        config.replace = args.replace;
        let handle = insitu_server::start(config).await?;
        let addrs: Vec<String> = handle.shard_addrs.iter().map(|a| a.to_string()).collect();
        println!(
            "insitu server {} up, shards at {}",
            handle.server_id,
            addrs.join(" ")
        );
        wait_for_stop().await?;
        tokio::task::spawn_blocking(move || handle.shutdown()).await?;
        Ok(())
    })
}

/// "N tables from a previous run kept (a, b, ...), their objects were held
/// in memory only and are gone".
fn kept_tables_warning(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut list: Vec<String> = names.iter().take(SHOWN).map(|n| format!("{n:?}")).collect();
    if names.len() > SHOWN {
        list.push(format!("and {} more", names.len() - SHOWN));
    }
    let (tables, their) = if names.len() == 1 {
        ("table", "its")
    } else {
        ("tables", "their")
    };
    format!(
        "{} {tables} from a previous run kept ({}), {their} objects were held in memory only and are gone",
        names.len(),
        list.join(", ")
    )
}

/// Ctrl-C or SIGTERM (what process managers and tests send).
async fn wait_for_stop() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("cannot wait for Ctrl-C")?,
        _ = term.recv() => {}
    }
    Ok(())
}
