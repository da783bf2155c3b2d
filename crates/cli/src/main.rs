//! `insitu`: one binary for every role — the embedded cluster (`up`), the
//! coordinator, a storage server, the client commands and the benchmarks.

mod cluster;
mod data;
mod ops;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "insitu", version, about = "A distributed in-memory key-value store that computes where the data lives.", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where client commands find the cluster.
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterArg {
    /// Coordinator address.
    #[arg(
        long,
        env = "INSITU_CLUSTER",
        default_value = "127.0.0.1:7070",
        global = true
    )]
    pub cluster: String,
}

#[derive(Subcommand)]
enum Command {
    /// Run a whole cluster in this process: a coordinator and N storage servers on loopback.
    Up(cluster::UpArgs),
    /// Run the coordinator: tables, tablet map, server membership (metadata kept durably in --dir).
    Coordinator(cluster::CoordinatorArgs),
    /// Run a storage server that enlists with a coordinator.
    Server(cluster::ServerArgs),
    /// Create, list or drop tables.
    #[command(subcommand)]
    Table(data::TableCmd),
    /// Move tablets between servers.
    #[command(subcommand)]
    Tablet(data::TabletCmd),
    /// Write VALUE under KEY.
    Put {
        table: String,
        key: String,
        value: String,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Print the value under KEY (exit code 1 if there is none).
    Get {
        table: String,
        key: String,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Remove KEY.
    Del {
        table: String,
        key: String,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Print a table's objects as `key<TAB>value` lines.
    Scan {
        table: String,
        /// Stop after this many objects.
        #[arg(long)]
        limit: Option<u64>,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Load a CSV (`key,value`) or JSON-lines (`{"key": ..., "value": ...}`) file into a table.
    Load {
        table: String,
        file: PathBuf,
        /// Objects per multiWrite batch.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Servers, tablets per server, objects and memory used.
    Status {
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Benchmarks (each reports ratios against a reference measured in the same run).
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Count a table's objects on the servers (optionally those matching --where).
    Count(ops::CountArgs),
    /// Aggregate a numeric field on the servers: sum, min, max, avg or count of FIELD (e.g. i64@0).
    Agg(ops::AggArgs),
    /// Change a numeric field of every (matching) object on the servers; each change is a new version.
    Update(ops::UpdateArgs),
    /// Train a model with every gradient computed on the servers.
    #[command(subcommand)]
    Train(ops::TrainCmd),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Server-side aggregation strategies against client-side reads (the seed's tables), and DuckDB.
    Aggregate(insitu_bench::aggregate::Args),
    /// Count over 1 KB objects on 1, 2, 4 servers: ns per object and total ms.
    Count(insitu_bench::count::Args),
    /// Logistic-regression gradient on the servers against a flat in-memory array (and NumPy).
    Gradient(insitu_bench::gradient::Args),
    /// Point-read p50/p99 on one shard, idle and while count, aggregate, update, enumerate and a tablet move run.
    Interference(insitu_bench::interference::Args),
    /// The storage engine alone: put/get against std HashMap, log-scan bandwidth, memory utilisation.
    Engine {
        /// Objects to load.
        #[arg(long, default_value_t = 1_000_000)]
        objects: u64,
        #[arg(long, default_value_t = 30)]
        key_bytes: usize,
        #[arg(long, default_value_t = 100)]
        value_bytes: usize,
        /// Write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Point operations side by side with Redis (latency, throughput, batching, memory).
    Kv {
        /// The peer to compare with: `redis` (started, and installed if missing) or `none`.
        #[arg(long, default_value = "redis")]
        vs: String,
        /// Write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Draw the latency percentiles as an SVG here.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Small and fast (10k keys, 0.3 s per case): a smoke test.
        #[arg(long)]
        quick: bool,
        /// Keys to load (default 1M, or 10k with --quick).
        #[arg(long)]
        keys: Option<u64>,
        /// Measured seconds per case (default 2, or 0.3 with --quick).
        #[arg(long)]
        seconds: Option<f64>,
        /// Do not pin the stores and the load generator to separate CPUs.
        #[arg(long)]
        no_pin: bool,
        /// Run only the cases whose name contains this (repeatable), e.g. "write c16".
        #[arg(long)]
        only: Vec<String>,
        /// Rounds over every case (figures are medians over the rounds).
        #[arg(long, default_value_t = 1)]
        rounds: usize,
    },
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("INSITU_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Up(args) => {
            init_tracing("info");
            cluster::up(args)
        }
        Command::Coordinator(args) => {
            init_tracing("info");
            cluster::coordinator(args)
        }
        Command::Server(args) => {
            init_tracing("info");
            cluster::server(args)
        }
        Command::Bench(BenchCmd::Engine {
            objects,
            key_bytes,
            value_bytes,
            json,
        }) => {
            init_tracing("warn");
            insitu_bench::engine::run(&insitu_bench::engine::EngineBenchArgs {
                objects,
                key_bytes,
                value_bytes,
                json,
            })
            .map(|_| ())
        }
        Command::Bench(BenchCmd::Kv {
            vs,
            json,
            plot,
            quick,
            keys,
            seconds,
            no_pin,
            only,
            rounds,
        }) => {
            init_tracing("warn");
            let versus = match vs.as_str() {
                "redis" => Ok(insitu_bench::kv::Versus::Redis),
                "none" => Ok(insitu_bench::kv::Versus::Nothing),
                other => Err(anyhow::anyhow!("--vs must be redis or none, not {other:?}")),
            };
            versus.and_then(|versus| {
                insitu_bench::kv::run(&insitu_bench::kv::KvBenchArgs {
                    versus,
                    json,
                    plot,
                    quick,
                    keys,
                    seconds,
                    pin: !no_pin,
                    only,
                    rounds,
                })
                .map(|_| ())
            })
        }
        Command::Bench(BenchCmd::Aggregate(args)) => {
            init_tracing("warn");
            insitu_bench::aggregate::run(&args)
        }
        Command::Bench(BenchCmd::Count(args)) => {
            init_tracing("warn");
            insitu_bench::count::run(&args)
        }
        Command::Bench(BenchCmd::Gradient(args)) => {
            init_tracing("warn");
            insitu_bench::gradient::run(&args)
        }
        Command::Bench(BenchCmd::Interference(args)) => {
            init_tracing("warn");
            insitu_bench::interference::run(&args)
        }
        Command::Count(args) => {
            init_tracing("warn");
            ops::count(args)
        }
        Command::Agg(args) => {
            init_tracing("warn");
            ops::agg(args)
        }
        Command::Update(args) => {
            init_tracing("warn");
            ops::update(args)
        }
        Command::Train(cmd) => {
            init_tracing("warn");
            ops::train(cmd)
        }
        other => {
            init_tracing("warn");
            data::run(other)
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            if let Some(data::NotFound(msg)) = e.downcast_ref::<data::NotFound>() {
                eprintln!("{msg}");
            } else {
                eprintln!("error: {e:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
