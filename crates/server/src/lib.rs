//! insitu storage server: one single-threaded event loop per shard (core).
//!
//! Each shard owns an `Engine` and the tablets assigned to it outright, and
//! listens on its own port, so a request never crosses threads and the data
//! path takes no lock (see ARCHITECTURE.md, "Storage server").

mod backup_job;
mod backup_local;
mod backup_service;
mod commit_bound;
mod conn;
mod enumerate;
mod expiry;
mod faults;
mod handler;
mod held;
mod hold;
mod identity;
mod inbox;
mod limits;
mod lost;
mod metrics;
mod migrate;
mod multi;
mod pipeline;
mod point;
mod query;
mod recover;
mod replicate;
pub mod resp;
mod scan;
mod scan_run;
mod shard;
mod sindex;
mod snapshot;
mod snapshot_read;
mod stamped;
mod stamped_batch;
mod tablet_control;
mod txn;
mod txn_apply;
mod txn_durable;
mod txn_peers;
mod txn_proof;
mod txn_resolve;
mod txn_room;
mod update_apply;
mod update_keys;
mod update_log;
mod versions;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use insitu_auth::Gate;
use insitu_client::rpc::RpcConn;
use insitu_engine::EngineConfig;
use insitu_protocol::{Request, Response, Status};
use insitu_tls::ServerTls;
use tokio::sync::watch;

pub use backup_service::REPLICA_DIR;
pub use insitu_backup::SyncMode;
pub use limits::{ConnLimits, MAX_FRAME_BYTES};
pub use recover::read_replica;
pub use replicate::{ClusterIdentity, ReplicationConfig};
pub use resp::{RespConfig, RespListen};

/// How a storage server is started.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Coordinator address, "host:port".
    pub coordinator: String,
    /// Address the shards and the backup service bind.
    pub host: String,
    /// Host others reach this server at, when it is not `host` (a server
    /// bound to 0.0.0.0, or behind NAT). Enlisted shard and backup addresses
    /// are this host with the bound ports. None: `host`.
    pub advertise: Option<String>,
    /// Port of shard 0; shard i listens on `base_port + i`. 0 = any free ports.
    pub base_port: u16,
    /// Number of shards (event-loop threads). Default: the number of cores.
    pub shards: usize,
    /// Data directory (segment replicas will live here).
    pub dir: PathBuf,
    /// Engine settings; `memory_budget_bytes` is for the whole server and is split evenly over the shards.
    pub engine: EngineConfig,
    /// Ask the coordinator to retire any registered server with another
    /// identity on this server's addresses (the operator says it is dead).
    pub replace: bool,
    /// How long to keep trying to reach the coordinator at start (with
    /// back-off) before giving up.
    pub enlist_patience: Duration,
    /// Connection limits per shard. A `frame_budget_bytes` of 0 means a quarter
    /// of the shard's memory budget, at least two max-size frames and at most
    /// 64 MiB: big frames are rare (bulk multi-operations), and a quarter keeps
    /// a flood of half-sent frames well below the data's own memory.
    pub limits: ConnLimits,
    /// Port of the backup service (replicas of other servers' segments,
    /// and the coordinator's pings). 0 = any free port; the CLI defaults it
    /// to the port after the last shard's when `--port` is given.
    pub backup_port: u16,
    /// When a replica write counts as durable: `Interval` (default) answers
    /// once it is in the backup's memory and fsyncs within `sync_interval`;
    /// `Always` fsyncs (once per group of requests) before answering.
    pub sync: SyncMode,
    /// Interval mode: how often buffered replica data is written and fsynced
    /// (default 1 s: what a power loss of every replica's machine may cost).
    pub sync_interval: Duration,
    /// Disk bytes the replica files may take; past it backups answer
    /// `NoSpace` and masters choose another. Default: only the disk limits.
    pub backup_disk_budget_bytes: u64,
    /// Replication to backups: timeouts, back-off, and what a fence does.
    pub replication: ReplicationConfig,
    /// Which tokens this server accepts, and the cluster credential it
    /// presents to the coordinator and its peers. `Gate::open()`: no
    /// authentication (every connection may send every request).
    /// Its dial credentials carry the TLS trust (`Gate::with_dial_tls`).
    pub gate: Gate,
    /// TLS on every port this server listens on (shards and the backup
    /// service); None: plain TCP.
    pub tls: Option<ServerTls>,
    /// The Redis protocol port (`--resp-port`); None: not served.
    pub resp: Option<RespSettings>,
}

/// What `--resp-port` and `--resp-table` ask for.
#[derive(Clone, Debug)]
pub struct RespSettings {
    /// Port every shard accepts RESP connections on (0: any free port).
    pub port: u16,
    /// The table that holds Redis database 0 (database n: `{table}.db{n}`),
    /// created on first use.
    pub table: String,
    /// Another server of this process already listens on `port`: share it
    /// (`insitu up`). Otherwise the port must be free.
    pub join: bool,
}

impl ServerConfig {
    pub fn new(coordinator: impl Into<String>, dir: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
            coordinator: coordinator.into(),
            host: "127.0.0.1".into(),
            advertise: None,
            base_port: 0,
            shards: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            dir: dir.into(),
            engine: EngineConfig::default(),
            replace: false,
            enlist_patience: Duration::from_secs(300),
            limits: ConnLimits::default(),
            backup_port: 0,
            sync: SyncMode::Interval,
            sync_interval: Duration::from_secs(1),
            backup_disk_budget_bytes: u64::MAX,
            replication: ReplicationConfig::default(),
            gate: Gate::open(),
            tls: None,
            resp: None,
        }
    }
}

/// A running server. Dropping it does not stop it; call `shutdown`.
pub struct ServerHandle {
    /// Id the coordinator assigned at enlistment.
    pub server_id: u64,
    /// One address per shard, in shard order (what the coordinator publishes).
    pub shard_addrs: Vec<SocketAddr>,
    /// Address of the backup service (sent in `Enlist`).
    pub backup_addr: SocketAddr,
    /// Address of the Redis protocol port, if served.
    pub resp_addr: Option<SocketAddr>,
    /// The cluster id the coordinator answered at enlistment (labels replicas).
    pub cluster_id: u64,
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
    /// Each shard's frame budget, to report what is buffered.
    frame_budgets: Vec<Arc<limits::FrameBudget>>,
    /// Shared with the shards: says whether the server was fenced.
    replication: Arc<replicate::ServerReplication>,
}

impl ServerHandle {
    /// Bytes each shard holds for partly received big frames right now, and
    /// each shard's budget for them.
    pub fn buffered_frame_bytes(&self) -> Vec<(usize, usize)> {
        self.frame_budgets
            .iter()
            .map(|b| (b.buffered_bytes(), b.total()))
            .collect()
    }

    /// Whether a backup answered `Fenced` (the coordinator declared this
    /// server dead) and the shards stopped serving; only observable with
    /// `ReplicationConfig::exit_on_fence` false (else the process exited).
    pub fn fenced(&self) -> bool {
        self.replication.is_fenced()
    }

    /// Stop every shard's event loop and the backup service (which flushes
    /// its buffered replicas first) and wait for the threads to end.
    pub fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The address others reach `bound` at: the advertised host (if any) with
/// the bound port.
fn advertised(bound: &SocketAddr, config: &ServerConfig) -> String {
    match &config.advertise {
        Some(host) if host.contains(':') && !host.starts_with('[') => {
            format!("[{host}]:{}", bound.port())
        }
        Some(host) => format!("{host}:{}", bound.port()),
        None => bound.to_string(),
    }
}

/// Bind every shard, start their threads, and enlist with the coordinator.
pub async fn start(config: ServerConfig) -> anyhow::Result<ServerHandle> {
    let unspecified = config
        .host
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified());
    if unspecified && config.advertise.is_none() {
        bail!(
            "--host {} binds every interface but names none that others can reach: \
             give --advertise HOST (the address clients and other servers use)",
            config.host
        );
    }
    if let Some(host) = &config.advertise {
        let bad = host.is_empty() || host.contains(char::is_whitespace) || host.contains('/');
        if bad {
            bail!("--advertise {host:?} is not a host name or address");
        }
    }
    if config.shards == 0 || config.shards > 256 {
        bail!("--shards must be between 1 and 256, got {}", config.shards);
    }
    std::fs::create_dir_all(&config.dir)
        .with_context(|| format!("cannot create data directory {}", config.dir.display()))?;
    // Who this server is, across restarts: kept in its data directory.
    let identity = identity::load_or_create(&config.dir)?;
    let mut engine_config = config.engine.clone();
    engine_config.memory_budget_bytes =
        (config.engine.memory_budget_bytes / config.shards).max(config.engine.segment_bytes);
    // Fail early, with the engine's own message, on an inconsistent configuration.
    insitu_engine::Engine::new(engine_config.clone())
        .map_err(|e| anyhow::anyhow!("engine configuration: {e}"))?;

    if config.limits.max_connections == 0 {
        bail!("the connection limit must be at least 1");
    }
    let frame_budget_bytes = match config.limits.frame_budget_bytes {
        0 => (engine_config.memory_budget_bytes / 4).clamp(2 * MAX_FRAME_BYTES, 64 << 20),
        n if n < MAX_FRAME_BYTES => {
            bail!(
                "the frame budget must hold one max-size frame ({MAX_FRAME_BYTES} bytes), got {n}"
            )
        }
        n => n,
    };
    let frame_budgets: Vec<Arc<limits::FrameBudget>> = (0..config.shards)
        .map(|_| Arc::new(limits::FrameBudget::new(frame_budget_bytes)))
        .collect();
    let (stop_tx, stop_rx) = watch::channel(false);
    // Created before the shards start; it learns the cluster identity once
    // this server has enlisted (replies wait for it when they must).
    let replication =
        replicate::ServerReplication::new(config.replication.clone(), config.gate.clone());
    let mut listeners = Vec::with_capacity(config.shards);
    for i in 0..config.shards {
        let port = if config.base_port == 0 {
            0
        } else {
            config
                .base_port
                .checked_add(i as u16)
                .context("port out of range")?
        };
        let addr = format!("{}:{}", config.host, port);
        let l = std::net::TcpListener::bind(&addr)
            .with_context(|| format!("shard {i}: cannot listen on {addr}"))?;
        l.set_nonblocking(true)?;
        listeners.push(l);
    }
    let mut resp_listeners: Vec<Option<resp::RespListen>> =
        (0..config.shards).map(|_| None).collect();
    let mut resp_addr = None;
    if let Some(settings) = &config.resp {
        let bound = resp::bind(&config.host, settings.port, config.shards, settings.join)
            .with_context(|| {
                format!(
                    "cannot listen for Redis clients on {}:{}",
                    config.host, settings.port
                )
            })?;
        let addr = bound[0].local_addr()?;
        resp_addr = Some(addr);
        let client = config.gate.as_client().clone();
        let resp_config = Arc::new(resp::RespConfig {
            coordinator: config.coordinator.clone(),
            table: settings.table.clone(),
            password: client.token.clone(),
            credentials: client,
            port: addr.port(),
            limits: insitu_resp::Limits {
                max_bulk_bytes: engine_config
                    .max_value_bytes
                    .max(insitu_engine::MAX_KEY_BYTES),
                // A command is at most what a native frame may be.
                max_command_bytes: insitu_protocol::frame::MAX_BODY_BYTES,
                ..insitu_resp::Limits::default()
            },
            max_value_bytes: engine_config.max_value_bytes,
            node_id: resp::new_node_id(),
        });
        for (slot, listener) in resp_listeners.iter_mut().zip(bound) {
            *slot = Some(resp::RespListen {
                listener,
                config: resp_config.clone(),
            });
        }
    }
    let shard_addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()?;
    let mut threads = Vec::with_capacity(config.shards);
    for (i, (listener, resp)) in listeners.into_iter().zip(resp_listeners).enumerate() {
        let engine_config = engine_config.clone();
        let (limits, budget) = (config.limits.clone(), frame_budgets[i].clone());
        let stop = stop_rx.clone();
        let repl = replication.clone();
        let tls = config.tls.clone();
        let t = std::thread::Builder::new()
            .name(format!("insitu-shard-{i}"))
            .spawn(move || {
                let listen = shard::Listen {
                    listener,
                    tls,
                    resp,
                };
                shard::run_shard(i, listen, engine_config, limits, budget, repl, stop)
            })
            .context("cannot start shard thread")?;
        threads.push(t);
    }

    // The backup port is bound before enlisting, so `Enlist` carries it.
    let backup_settings = backup_service::BackupSettings {
        sync: config.sync,
        sync_interval: config.sync_interval,
        disk_budget_bytes: config.backup_disk_budget_bytes,
        limits: config.limits.clone(),
        gate: config.gate.clone(),
        tls: config.tls.clone(),
    };
    let started = backup_service::start(
        &config.host,
        config.backup_port,
        backup_settings.clone(),
        stop_rx.clone(),
    );
    let (backup_addr, installer, own_backup) = match started {
        Ok((addr, installer, thread, door)) => {
            threads.push(thread);
            (addr, installer, door)
        }
        Err(e) => return Err(stop_all(&stop_tx, threads, e)),
    };

    let addrs: Vec<String> = shard_addrs.iter().map(|a| advertised(a, &config)).collect();
    let advertised_backup = advertised(&backup_addr, &config);
    let enlist = enlist(&config, addrs, advertised_backup.clone(), identity);
    let enlisted = match enlist.await {
        Ok(e) => e,
        Err(e) => {
            let e = e.context(format!(
                "cannot enlist with the coordinator at {}",
                config.coordinator
            ));
            return Err(stop_all(&stop_tx, threads, e));
        }
    };
    let server_id = enlisted.server_id;
    // Replicas are labelled with the cluster id, so the store opens only now.
    let replica_dir = config.dir.join(REPLICA_DIR);
    let cluster_id = enlisted.cluster_id;
    let opened = tokio::task::spawn_blocking(move || {
        backup_service::open_store(&replica_dir, cluster_id, &backup_settings)
    })
    .await
    .map_err(anyhow::Error::from)
    .and_then(|r| r)
    .and_then(|service| installer.install(service));
    if let Err(e) = opened {
        return Err(stop_all(&stop_tx, threads, e));
    }
    tracing::info!(server_id, cluster_id, ?shard_addrs, %backup_addr, "storage server enlisted");
    replication.set_identity(replicate::ClusterIdentity {
        server_id,
        cluster_id,
        replicas: enlisted.replicas,
        coordinator: config.coordinator.clone(),
        // The own backup: a last resort (and with one server the only one),
        // so `insitu up --servers 1` keeps its replicas on its own disk.
        backup_addr: if config.replication.own_backup {
            advertised_backup
        } else {
            String::new()
        },
        own_backup: config.replication.own_backup.then_some(own_backup),
    });
    tracing::info!(replicas = enlisted.replicas, "replication configured");
    Ok(ServerHandle {
        server_id,
        shard_addrs,
        backup_addr,
        resp_addr,
        cluster_id,
        stop: stop_tx,
        threads,
        frame_budgets,
        replication,
    })
}

/// Stop the threads started so far and pass `e` on (a failed start).
fn stop_all(
    stop: &watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
    e: anyhow::Error,
) -> anyhow::Error {
    let _ = stop.send(true);
    for t in threads {
        let _ = t.join();
    }
    e
}

/// What the coordinator answered at enlistment.
#[derive(Clone, Copy, Debug)]
struct Enlisted {
    server_id: u64,
    /// Labels this server's replica store (see `insitu_backup`).
    cluster_id: u64,
    /// Replicas per segment (R).
    replicas: u32,
}

/// Why one enlistment attempt failed.
enum EnlistError {
    /// The coordinator could not be reached or did not answer: try again.
    Unreachable(anyhow::Error),
    /// The coordinator answered with a refusal: final.
    Refused(anyhow::Error),
}

/// Enlist with the coordinator, retrying with back-off (100 ms doubling to
/// 5 s, each retry logged) while it cannot be reached or asks to retry, for
/// at most `config.enlist_patience`. A refusal is final.
async fn enlist(
    config: &ServerConfig,
    addrs: Vec<String>,
    backup_addr: String,
    identity: String,
) -> anyhow::Result<Enlisted> {
    let give_up = Instant::now() + config.enlist_patience;
    let mut pause = Duration::from_millis(100);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let attempt = enlist_once(config, addrs.clone(), backup_addr.clone(), identity.clone());
        let e = match attempt.await {
            Ok(id) => return Ok(id),
            Err(EnlistError::Refused(e)) => return Err(e),
            Err(EnlistError::Unreachable(e)) => e,
        };
        if Instant::now() + pause > give_up {
            return Err(e.context(format!(
                "gave up after {attempts} attempts in {:?}",
                config.enlist_patience
            )));
        }
        tracing::warn!(
            coordinator = %config.coordinator,
            attempt = attempts,
            retry_in_ms = pause.as_millis() as u64,
            "cannot enlist with the coordinator yet, retrying: {e:#}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

async fn enlist_once(
    config: &ServerConfig,
    shard_addrs: Vec<String>,
    backup_addr: String,
    identity: String,
) -> Result<Enlisted, EnlistError> {
    const CALL_TIMEOUT: Duration = Duration::from_secs(30);
    let member = config.gate.as_member();
    let conn = tokio::time::timeout(CALL_TIMEOUT, RpcConn::open(&config.coordinator, member))
        .await
        .map_err(|_| EnlistError::Unreachable(anyhow::anyhow!("connecting timed out")))?
        .map_err(|e| match e {
            // A refused token is final: retrying cannot make it right.
            insitu_client::RpcError::Refused { .. } => EnlistError::Refused(anyhow::anyhow!(
                "{e}; give this server the cluster's --cluster-token-file and --auth-token-file"
            )),
            e => EnlistError::Unreachable(e.into()),
        })?;
    let request = Request::Enlist {
        shard_addrs,
        identity,
        replace: config.replace,
        backup_addr,
    };
    let reply = conn
        .call_timeout(&request, CALL_TIMEOUT)
        .await
        .map_err(|e| EnlistError::Unreachable(e.into()))?;
    if reply.status == Status::Retry {
        return Err(EnlistError::Unreachable(anyhow::anyhow!(
            "coordinator busy: {}",
            reply.error_message()
        )));
    }
    if !reply.status.is_ok() {
        return Err(EnlistError::Refused(anyhow::anyhow!(
            "coordinator refused enlistment: {}: {}",
            reply.status,
            reply.error_message()
        )));
    }
    match reply.decode() {
        Ok(Response::Enlisted {
            server_id,
            cluster_id,
            replicas,
        }) => Ok(Enlisted {
            server_id,
            cluster_id,
            replicas,
        }),
        Ok(other) => Err(EnlistError::Refused(anyhow::anyhow!(
            "unexpected reply to Enlist: {other:?}"
        ))),
        Err(e) => Err(EnlistError::Refused(e.into())),
    }
}
