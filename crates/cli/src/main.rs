//! `insitu`: one binary for every role — the embedded cluster (`up`), the
//! coordinator, a storage server, the client commands and the benchmarks.

mod cluster;
mod data;

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
}

#[derive(Subcommand)]
enum BenchCmd {
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
