//! The server roles: `up`, `coordinator`, `server`.

use std::path::PathBuf;

use anyhow::Context;
use insitu_coordinator::CoordinatorConfig;
use insitu_server::{ServerConfig, SyncMode};

use crate::ClusterArg;
use crate::auth::{RoleAuthArgs, no_auth_warning};
use crate::tls::RoleTlsArgs;

/// `up`'s `--resp-port` help: the shared one, plus how several servers split the ports.
const UP_RESP_PORT_HELP: &str = "Serve the Redis protocol (RESP2/RESP3) on this port: redis-cli, \
    redis-benchmark and Redis client libraries work against it, and every key is served \
    whichever server holds it. With several servers, the first listens on PORT and each other \
    on a free port of its own (printed), which Redis Cluster clients (redis-cli -c, \
    redis-benchmark --cluster) learn from any port and use directly";

#[derive(clap::Args)]
#[command(mut_arg("resp_port", |a| a.help(UP_RESP_PORT_HELP)))]
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
    /// Replicas of every log segment on other servers' disks (R); 0 = in
    /// memory only. Default: min(2, servers - 1), at least 1 (one server
    /// keeps its replicas on its own disk).
    #[arg(long)]
    replicas: Option<u32>,
    /// Run without authentication (a throwaway local cluster). By default
    /// `up` creates a client token (DIR/auth-token) and a cluster credential
    /// (DIR/cluster-token) on first start and requires them.
    #[arg(long)]
    no_auth: bool,
    /// Serve TLS on every port, with a CA and a certificate for localhost
    /// and 127.0.0.1 made under DIR/tls on first start (and kept). Clients
    /// pass --tls-ca DIR/tls/ca.pem (or INSITU_TLS_CA).
    #[arg(long)]
    tls: bool,
    /// Serve Prometheus metrics (`/metrics`) and the cluster's status page
    /// (`/`, for a browser) over HTTP on this port of 127.0.0.1.
    #[arg(long, value_name = "PORT")]
    metrics_port: Option<u16>,
    #[command(flatten)]
    resp: RespArgs,
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
    /// Replicas of every log segment on other servers' disks (R); 0 = in
    /// memory only (a server crash loses its objects).
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    /// A server that answers no ping for this long is declared dead and its
    /// tablets recovered.
    #[arg(long, default_value_t = 500, value_name = "MS")]
    failure_timeout_ms: u64,
    #[command(flatten)]
    security: RoleSecurityArgs,
    /// Serve Prometheus metrics (`/metrics`) and the cluster's status page
    /// (`/`) over HTTP on this port of --host.
    #[arg(long, value_name = "PORT")]
    metrics_port: Option<u16>,
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServerArgs {
    /// Without a subcommand: run a storage server.
    #[command(subcommand)]
    pub action: Option<ServerAction>,
    /// Coordinator address.
    #[arg(long, env = "INSITU_CLUSTER", default_value = "127.0.0.1:7070")]
    coordinator: String,
    /// Port of shard 0; shard i listens on PORT+i. 0 picks free ports.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Address to listen on (0.0.0.0: every interface, with --advertise).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Host name or address the coordinator, clients and other servers reach
    /// this server at, when it is not --host (bound to 0.0.0.0, or behind
    /// NAT). Default: --host.
    #[arg(long, value_name = "HOST")]
    advertise: Option<String>,
    #[arg(long, default_value = "./insitu-data/server")]
    dir: PathBuf,
    /// Shards (event-loop threads); default: one per core.
    #[arg(long)]
    shards: Option<usize>,
    /// Memory budget for the whole server, in MiB.
    #[arg(long, default_value_t = 4096)]
    memory_mb: usize,
    /// Take over the addresses of a registered server with another identity
    /// (one that is dead: it is declared dead and its tablets recovered). Without it, the
    /// coordinator refuses a server whose address another server already has.
    #[arg(long)]
    replace: bool,
    /// When a replica this server holds (for itself or another server) counts
    /// as durable. `interval`: acknowledged once in this server's memory,
    /// written and fsynced every --sync-interval-ms; a crash or power loss of
    /// this server loses the replica data of the last interval, which costs
    /// acknowledged writes only if the segment's master and its other
    /// replicas are lost too (a power loss of every machine holding them, or
    /// a one-server cluster killed). `always`: written and fsynced before it
    /// is acknowledged (one fsync per group of concurrent writes): a crash or
    /// power loss loses no acknowledged write, at the cost of an fsync in
    /// every write's latency.
    #[arg(long, value_enum, default_value_t = SyncArg::Interval)]
    sync: SyncArg,
    /// With --sync interval: how often buffered replicas are written and
    /// fsynced, in milliseconds (the window a power loss can cost).
    #[arg(long, default_value_t = 1000)]
    sync_interval_ms: u64,
    /// Port of the backup service (replicas for other servers; the
    /// coordinator pings it). Default: the port after the last shard's
    /// (PORT + shards) when --port is given, else any free port.
    #[arg(long)]
    backup_port: Option<u16>,
    #[command(flatten)]
    security: RoleSecurityArgs,
    /// Serve this server's Prometheus metrics (`/metrics`) over HTTP on this
    /// port of --host.
    #[arg(long, value_name = "PORT")]
    metrics_port: Option<u16>,
    #[command(flatten)]
    resp: RespArgs,
}

/// The credentials and TLS of a standalone role (`coordinator`, `server`):
/// one flag set, so both check credentials and dial each other alike.
#[derive(clap::Args)]
struct RoleSecurityArgs {
    #[command(flatten)]
    auth: RoleAuthArgs,
    #[command(flatten)]
    tls: RoleTlsArgs,
}

impl RoleSecurityArgs {
    /// The gate (with the TLS it dials peers with) and the TLS it serves.
    fn resolve(
        &self,
        cluster: &ClusterArg,
    ) -> anyhow::Result<(insitu_auth::Gate, Option<insitu_tls::ServerTls>)> {
        let gate = crate::auth::role_gate(&self.auth, cluster)?;
        let (serve, dial) = crate::tls::role_tls(&self.tls, cluster)?;
        Ok((gate.with_dial_tls(dial), serve))
    }
}

/// The Redis protocol flags of the roles that run servers (`up`, `server`).
#[derive(clap::Args)]
struct RespArgs {
    /// Serve the Redis protocol (RESP2/RESP3) on this port: redis-cli,
    /// redis-benchmark and Redis client libraries work against it, and every
    /// key is served whichever server holds it.
    #[arg(long, value_name = "PORT")]
    resp_port: Option<u16>,
    /// The table that holds Redis database 0 (database N is TABLE.dbN),
    /// created on first use; insitu's own commands (count, agg, ...)
    /// read the same objects.
    #[arg(long, value_name = "TABLE", default_value = "redis")]
    resp_table: String,
}

impl RespArgs {
    /// A server's RESP settings, if `--resp-port` was given: listening on
    /// the port `port_for` makes of it (`up` gives all but its first server
    /// a free one).
    fn settings(&self, port_for: impl FnOnce(u16) -> u16) -> Option<insitu_server::RespSettings> {
        self.resp_port.map(|port| insitu_server::RespSettings {
            port: port_for(port),
            table: self.resp_table.clone(),
            join: false,
        })
    }
}

/// `--sync`: see `ServerArgs::sync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum SyncArg {
    Interval,
    Always,
}

/// What `insitu server SUBCOMMAND` does instead of running a server.
#[derive(clap::Subcommand)]
pub enum ServerAction {
    /// Declare server ID dead now (it is gone for good): its tablets are
    /// recovered onto the live servers. `insitu status` lists the ids.
    Remove {
        /// The server's id.
        id: u64,
    },
}

/// Print a line of a server role's banner on stdout, ignoring a closed one.
/// Why not `println!`: it panics when stdout is a closed pipe (`insitu up |
/// head -1`), and in these processes a panic aborts the whole cluster (the
/// panic hook); a banner nobody reads is no reason to stop serving.
fn say(line: std::fmt::Arguments) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    // A line at a time, for whoever waits for the banner through a pipe.
    let _ = out.flush();
}

/// `say` for stderr (`eprintln!` panics on a closed stderr just the same).
pub(crate) fn note(line: std::fmt::Arguments) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// "R = 2 replicas per segment", or the warning that goes with R = 0.
fn replicas_note(replicas: u32) -> String {
    match replicas {
        0 => "R = 0: in-memory only: a server crash loses its objects".to_string(),
        1 => "R = 1 replica per segment".to_string(),
        r => format!("R = {r} replicas per segment"),
    }
}

/// `insitu up`'s default R: min(2, servers - 1), at least 1.
fn default_up_replicas(servers: usize) -> u32 {
    u32::try_from(servers.saturating_sub(1))
        .unwrap_or(2)
        .clamp(1, 2)
}

/// Bind the metrics port, if `--metrics-port` gave one, and serve it in the
/// background; returns its URL. Takes the flag as given so every role
/// starts (or skips) its metrics alike.
async fn start_metrics(
    host: &str,
    port: Option<u16>,
    page: Option<insitu_telemetry::http::StatusPage>,
) -> anyhow::Result<Option<String>> {
    let Some(port) = port else {
        return Ok(None);
    };
    insitu_telemetry::recorder();
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .with_context(|| format!("--metrics-port: cannot listen on {host}:{port}"))?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(insitu_telemetry::http::serve(listener, page));
    Ok(Some(url))
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
    // Replicas: `insitu up` and a server without flags use the defaults
    // (interval mode, 1 s); `insitu server` overrides them from its flags.
    c.sync = SyncMode::Interval;
    c.sync_interval = std::time::Duration::from_secs(1);
    c
}

/// Apply `insitu server`'s replica flags to `c` (after its shard count is known).
fn apply_backup_flags(c: &mut ServerConfig, args: &ServerArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.sync_interval_ms > 0,
        "--sync-interval-ms must be at least 1"
    );
    c.sync = match args.sync {
        SyncArg::Interval => SyncMode::Interval,
        SyncArg::Always => SyncMode::Always,
    };
    c.sync_interval = std::time::Duration::from_millis(args.sync_interval_ms);
    c.backup_port = match (args.backup_port, args.port) {
        (Some(p), _) => p,
        (None, 0) => 0,
        (None, p) => u16::try_from(c.shards)
            .ok()
            .and_then(|n| p.checked_add(n))
            .with_context(|| {
                format!("--port {p} with {} shards leaves no port for the backup service; give --backup-port", c.shards)
            })?,
    };
    Ok(())
}

pub fn up(args: UpArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=64).contains(&args.servers),
        "--servers must be between 1 and 64"
    );
    runtime()?.block_on(async move {
        // Caught from here on, before any ready line is printed.
        let stop = StopSignals::new()?;
        std::fs::create_dir_all(&args.dir).with_context(|| format!("cannot create {}", args.dir.display()))?;
        let (gate, token_file) = if args.no_auth {
            (insitu_auth::Gate::open(), None)
        } else {
            let (gate, path, _) = crate::auth::init_dir(&args.dir)?;
            (gate, Some(path))
        };
        let (tls, gate) = if args.tls {
            let (serve, dial, files) = crate::tls::up_files(&args.dir)?;
            (Some((serve, files)), gate.with_dial_tls(Some(dial)))
        } else {
            (None, gate)
        };
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
        config.replicas = args.replicas.unwrap_or(default_up_replicas(args.servers));
        config.gate = gate.clone();
        config.tls = tls.as_ref().map(|(serve, _)| serve.clone());
        let coordinator = insitu_coordinator::start(config, listener).await?;
        let metrics_url = start_metrics("127.0.0.1", args.metrics_port, Some(coordinator.status_page())).await?;
        let kept = coordinator.awaiting_recovery_table_names();
        let replicas = coordinator.replicas();
        let addr = coordinator.addr().to_string();
        let mut servers = Vec::new();
        for i in 0..args.servers {
            let mut config = server_config(addr.clone(), "127.0.0.1".into(), 0, args.dir.join(format!("server-{i}")), args.shards, args.memory_mb);
            // Every server of `up` lives in this one process: a fenced one
            // (declared dead, e.g. `insitu server remove`) stops serving
            // rather than exiting the process, which would take the others.
            config.replication.exit_on_fence = false;
            config.gate = gate.clone();
            config.tls = tls.as_ref().map(|(serve, _)| serve.clone());
            // Each server has a RESP port of its own, so a Redis Cluster
            // client can be sent to the server holding a key; every port
            // still serves every key. The first is the port asked for, the
            // others free ones (PORT + 1 ... might be taken).
            config.resp = args.resp.settings(|port| if i == 0 { port } else { 0 });
            servers.push(insitu_server::start(config).await.with_context(|| format!("starting server {i}"))?);
        }
        let shards: usize = servers.iter().map(|s| s.shard_addrs.len()).sum();
        say(format_args!("insitu is up: coordinator at {addr}, {} servers, {shards} shards, {}, data under {}", servers.len(), replicas_note(replicas), args.dir.display()));
        if !kept.is_empty() {
            say(format_args!("warning: {}", kept_tables_warning(&kept, replicas)));
        }
        // What a client passes: the try line and its `export` twin.
        let mut flags = String::new();
        let mut exports = format!("INSITU_CLUSTER={addr}");
        match &token_file {
            Some(path) => {
                let path = path.display();
                say(format_args!("  clients present the token in {path} (it stays across restarts; the cluster credential beside it is for servers only)"));
                flags.push_str(&format!(" --auth-token-file {path}"));
                exports.push_str(&format!(" INSITU_AUTH_TOKEN_FILE={path}"));
            }
            None => say(format_args!("  {}", no_auth_warning())),
        }
        if let Some((_, files)) = &tls {
            let ca = files.ca.display();
            say(format_args!("  TLS on every port; clients verify the servers with the CA in {ca}"));
            flags.push_str(&format!(" --tls-ca {ca}"));
            exports.push_str(&format!(" INSITU_TLS_CA={ca}"));
        }
        say(format_args!("  try: insitu --cluster {addr}{flags} table create demo --tablets 4   (or export {exports})"));
        if let Some(resp) = servers.first().and_then(|s| s.resp_addr) {
            let tls_files = tls.as_ref().map(|(_, files)| files);
            say(format_args!("  Redis protocol on {resp} (table {}): {}", args.resp.resp_table, redis_cli_line(resp.port(), token_file.as_deref(), tls_files)));
            let others: Vec<String> = servers.iter().skip(1).filter_map(|s| s.resp_addr).map(|a| a.port().to_string()).collect();
            if !others.is_empty() {
                say(format_args!("  (every server has its own Redis port, each serving every key: {} too; cluster clients learn them)", others.join(", ")));
            }
        }
        if let Some(url) = &metrics_url {
            say(format_args!("  metrics at {url}/metrics, status page at {url}/"));
        }
        say(format_args!("  Ctrl-C to stop."));
        stop.wait().await;
        note(format_args!("shutting down..."));
        tokio::task::spawn_blocking(move || servers.into_iter().for_each(|s| s.shutdown())).await?;
        coordinator.shutdown().await;
        note(format_args!("stopped."));
        Ok(())
    })
}

pub fn coordinator(args: CoordinatorArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let (gate, tls) = args.security.resolve(cluster)?;
    runtime()?.block_on(async move {
        // Caught from here on, before any ready line is printed.
        let stop = StopSignals::new()?;
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        // Standalone servers may outlive the coordinator: keep them (those
        // that do not answer pings are declared dead and recovered).
        let mut config = CoordinatorConfig::new(args.dir.clone());
        config.replicas = args.replicas;
        config.failure_timeout = std::time::Duration::from_millis(args.failure_timeout_ms);
        config.gate = gate;
        config.tls = tls;
        let handle = insitu_coordinator::start(config, listener).await?;
        let metrics_url =
            start_metrics(&args.host, args.metrics_port, Some(handle.status_page())).await?;
        say(format_args!(
            "insitu coordinator at {}, metadata in {}, {}",
            handle.addr(),
            args.dir.display(),
            replicas_note(handle.replicas())
        ));
        if let Some(url) = &metrics_url {
            say(format_args!(
                "metrics at {url}/metrics, status page at {url}/"
            ));
        }
        stop.wait().await;
        handle.shutdown().await;
        Ok(())
    })
}

pub fn server(args: ServerArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let (gate, tls) = args.security.resolve(cluster)?;
    runtime()?.block_on(async move {
        // Caught from here on, before any ready line is printed.
        let stop = StopSignals::new()?;
        let mut config = server_config(
            args.coordinator.clone(),
            args.host.clone(),
            args.port,
            args.dir.clone(),
            args.shards,
            args.memory_mb,
        );
        config.replace = args.replace;
        config.advertise = args.advertise.clone();
        config.gate = gate;
        config.tls = tls;
        config.resp = args.resp.settings(|port| port);
        apply_backup_flags(&mut config, &args)?;
        let metrics_url = start_metrics(&args.host, args.metrics_port, None).await?;
        let handle = insitu_server::start(config).await?;
        let addrs: Vec<String> = handle.shard_addrs.iter().map(|a| a.to_string()).collect();
        say(format_args!(
            "insitu server {} up, shards at {}, backup at {}",
            handle.server_id,
            addrs.join(" "),
            handle.backup_addr
        ));
        if let Some(url) = &metrics_url {
            say(format_args!("metrics at {url}/metrics"));
        }
        if let Some(resp) = handle.resp_addr {
            say(format_args!(
                "Redis protocol on {resp} (table {})",
                args.resp.resp_table
            ));
        }
        stop.wait().await;
        tokio::task::spawn_blocking(move || handle.shutdown()).await?;
        Ok(())
    })
}

/// "N tables from a previous run kept (a, b, ...), their objects were held
/// in memory only and are gone" (R = 0), or that they are recovered from the
/// replicas the servers kept.
fn kept_tables_warning(names: &[String], replicas: u32) -> String {
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
    if replicas == 0 {
        return format!(
            "{} {tables} from a previous run kept ({}), {their} objects were held in memory only and are gone",
            names.len(),
            list.join(", ")
        );
    }
    format!(
        "{} {tables} from a previous run kept ({}): {their} objects are recovered from the replicas the servers kept in their --dir; objects without a replica are gone",
        names.len(),
        list.join(", ")
    )
}

/// Ctrl-C or SIGTERM (what process managers and tests send), caught from
/// the moment this is made. Made before a role prints its ready line: a
/// signal sent right after the line (a test, a supervisor) then stops the
/// process cleanly instead of killing it before a handler is in place.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn new() -> anyhow::Result<StopSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("cannot catch SIGTERM")?,
            interrupt: signal(SignalKind::interrupt()).context("cannot catch Ctrl-C")?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}

/// The redis-cli command that reaches `up`'s RESP port: with the token as
/// its password and the CA, as the cluster needs.
fn redis_cli_line(
    port: u16,
    token_file: Option<&std::path::Path>,
    tls: Option<&insitu_tls::generate::TlsFiles>,
) -> String {
    let mut line = format!("redis-cli -p {port}");
    if let Some(files) = tls {
        line.push_str(&format!(" --tls --cacert {}", files.ca.display()));
    }
    if let Some(path) = token_file {
        line.push_str(&format!(
            " --no-auth-warning -a \"$(cat {})\"",
            path.display()
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_replicas_default_and_banner_notes() {
        // min(2, servers - 1), at least 1: one server keeps replicas on its own disk.
        let got: Vec<u32> = [1, 2, 3, 8]
            .iter()
            .map(|n| default_up_replicas(*n))
            .collect();
        assert_eq!(got, vec![1, 1, 2, 2]);
        assert!(replicas_note(0).contains("in-memory only: a server crash loses its objects"));
        assert_eq!(replicas_note(2), "R = 2 replicas per segment");
        let kept = vec!["t".to_string()];
        assert!(kept_tables_warning(&kept, 0).contains("held in memory only and are gone"));
        assert!(kept_tables_warning(&kept, 1).contains("recovered from the replicas"));
    }
}
