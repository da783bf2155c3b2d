//! `insitu`: one binary for every role — the embedded cluster (`up`), the
//! coordinator, a storage server, the client commands and the benchmarks.

mod auth;
mod cluster;
mod data;
mod index;
mod load;
mod ops;
mod sql;
mod status;
mod tls;
mod tpch;
mod txn;
mod typed;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "insitu", version, about = "A distributed in-memory key-value store that computes where the data lives.", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Global, so it may come before or after the subcommand.
    #[command(flatten)]
    cluster: ClusterArg,
}

/// Where client commands find the cluster.
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterArg {
    /// Coordinator address (HOST:PORT) the client commands connect to.
    #[arg(
        long,
        env = "INSITU_CLUSTER",
        default_value = "127.0.0.1:7070",
        global = true,
        value_name = "HOST:PORT"
    )]
    pub cluster: String,
    /// File holding the client token (`insitu up` writes one under its
    /// --dir). Without it: the INSITU_AUTH_TOKEN environment variable (the
    /// token itself), else the file INSITU_AUTH_TOKEN_FILE names, in the
    /// same order as the Rust and Python clients. Servers and the
    /// coordinator accept it for data requests.
    #[arg(long, global = true, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Dial the cluster over TLS, trusting the CA certificate(s) in this PEM
    /// file (`insitu up --tls` writes DIR/tls/ca.pem); the servers'
    /// certificates must be signed by it and name the addresses dialled.
    /// The coordinator and servers dial each other with it too.
    #[arg(long, env = "INSITU_TLS_CA", global = true, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a whole cluster in this process: a coordinator and N storage servers on loopback.
    Up(cluster::UpArgs),
    /// Run the coordinator: tables, tablet map, server membership (metadata kept durably in --dir).
    Coordinator(cluster::CoordinatorArgs),
    /// Run a storage server that enlists with a coordinator (or `server remove ID`: declare one dead).
    Server(cluster::ServerArgs),
    /// Authentication: `auth init DIR` writes a client token and a cluster credential.
    #[command(subcommand)]
    Auth(auth::AuthCmd),
    /// TLS: `tls init DIR --host H` writes a CA and a certificate for the cluster's hosts.
    #[command(subcommand)]
    Tls(tls::TlsCmd),
    /// Create, list or drop tables.
    #[command(subcommand)]
    Table(data::TableCmd),
    /// Move tablets between servers.
    #[command(subcommand)]
    Tablet(data::TabletCmd),
    /// Create, drop or list secondary indexes of typed tables.
    #[command(subcommand)]
    Index(index::IndexCmd),
    /// Write a value under KEY: the VALUE argument, `-` for standard input, or --file.
    Put {
        /// The table (see `insitu table list`).
        table: String,
        /// The key (any UTF-8 text).
        key: String,
        /// The value; `-` reads it from standard input (bytes as they are, a final newline included).
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        value: Option<String>,
        /// Read the value from this file (for values too large for an argument).
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
        /// Give the object a deadline this many seconds from now: from then on every read,
        /// count and query leaves it out, and the server removes it (as Redis's `EX`).
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=100_000_000_000))]
        ttl: Option<u64>,
    },
    /// Insert rows into a typed table: each ROW is CSV in the table's column order (an empty
    /// field is NULL), e.g. `insitu insert users '1,alice,31'`.
    Insert {
        /// The typed table (see `insitu table list`).
        table: String,
        /// Rows, one per argument.
        #[arg(required = true)]
        rows: Vec<String>,
    },
    /// Print the value under KEY (exit code 1 if there is none).
    Get { table: String, key: String },
    /// Remove KEY (many objects at once: `insitu delete`).
    Del { table: String, key: String },
    /// Print a table's objects as `key<TAB>value` lines.
    Scan {
        /// The table (see `insitu table list`).
        table: String,
        /// Stop after this many objects.
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Load a file into a table. Untyped tables: CSV (`key,value`) or JSON lines
    /// (`{"key": ..., "value": ...}`). Typed tables: CSV with a header line naming the columns,
    /// or Parquet (`.parquet`), columns matched by name.
    Load {
        /// The table to load into (create it first with `insitu table create`).
        table: String,
        /// The input: JSON lines if it ends in .json, .jsonl or .ndjson, else CSV (no header line).
        file: PathBuf,
        /// Objects sent per batch (one multi-write request per batch and server).
        #[arg(long, default_value_t = 1000)]
        batch: usize,
    },
    /// Servers, tablets per server, objects and memory used.
    Status,
    /// Benchmarks (each reports ratios against a reference measured in the same run).
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Count a table's objects on the servers (optionally those matching --where).
    Count(ops::CountArgs),
    /// Aggregate a numeric field on the servers: sum, min, max, avg or count of FIELD (e.g. i64@0).
    Agg(ops::AggArgs),
    /// Change a numeric field of every (matching) object on the servers; each change is a new version.
    Update(ops::UpdateArgs),
    /// Remove every (matching) object or row on the servers: `--where`, a key range, or `--all`.
    Delete(ops::DeleteArgs),
    /// Train a model with every gradient computed on the servers.
    #[command(subcommand)]
    Train(ops::TrainCmd),
    /// The TPC-H benchmark's tables and data.
    #[command(subcommand)]
    Tpch(tpch::TpchCmd),
    /// SQL over the typed tables: filters, projections, limits and aggregates run on the
    /// servers, joins and sorts in this process (Apache DataFusion). Without SQL, a shell.
    Sql(sql::SqlArgs),
    /// Run a script of get/put/del/add lines as one transaction: all of it commits or none.
    Txn(txn::TxnArgs),
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
    /// TPC-H lineitem: range filter, point lookup, regex, Q1 and Q6 read out vs pushed down, and DuckDB.
    Tpch(insitu_bench::tpch::Args),
    /// Crash recovery: load N MB into one server of S, kill it (-9), time detection and recovery.
    Recovery(insitu_bench::recovery::Args),
    /// Transactions: a checkout workload (10 items read and decremented, an order written) and a
    /// bank (transfers with audits) against PostgreSQL (REPEATABLE READ, pgbench).
    Txn(insitu_bench::txn::Args),
    /// The Redis protocol port against redis-server, measured by redis-benchmark
    /// (set, get, incr, mset; -P 1 and 16), one core per store.
    Resp(insitu_bench::resp_bench::Args),
    /// The storage engine alone: put/get against std HashMap, log-scan bandwidth, memory
    /// utilisation after 3x random overwrites under a tight budget, and the longest overwrite
    /// call against calls of fixed work of the same mean length (what the machine adds).
    Engine {
        /// Objects to load.
        #[arg(long, default_value_t = 1_000_000)]
        objects: u64,
        /// Bytes of each key (8 up to the engine's key limit: the first 8 make keys unique).
        #[arg(long, default_value_t = 30)]
        key_bytes: usize,
        /// Bytes of each value (at least 8: the scan sums the first 8 as an integer).
        #[arg(long, default_value_t = 100)]
        value_bytes: usize,
        /// Write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Point operations side by side with Redis (latency, throughput, batching, memory).
    Kv {
        /// The peer to compare with: `redis` (started, and installed if missing), `redis-aof`
        /// (writes with durability on against Redis with appendonly yes: --sync interval vs
        /// appendfsync everysec, --sync always vs appendfsync always), `snapshots` (insitu's
        /// writes while snapshots are read, each taking a timestamp, against insitu's with
        /// none) or `none`.
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
        /// Both stores serve TLS only (a fresh CA and certificate; Redis on
        /// --tls-port), and the load generator speaks TLS to both.
        #[arg(long)]
        tls: bool,
    },
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("INSITU_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Why off: when a line cannot be written (stderr is a closed pipe),
        // the subscriber would report it with `eprintln!`, which panics on
        // that same closed stderr, and a panic aborts a server process. A
        // log line nobody can read is dropped instead.
        .log_internal_errors(false)
        .try_init();
}

/// `println!` that returns the write's error instead of panicking, so a
/// closed stdout (`insitu scan t | head`) ends the command quietly (see
/// `is_broken_pipe`). Every command's output goes through it.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// Whether `e` comes from writing to a closed pipe. Rust ignores SIGPIPE, so
/// a write to a closed stdout fails with EPIPE; we end quietly with status 0
/// then (the reader chose to stop, as `head` does), rather than restoring the
/// default SIGPIPE, which would also kill the commands that run servers
/// in-process whenever a peer's socket closes under a write.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `--cluster` is global (accepted before or after the subcommand), but the
/// roles that run servers do not connect to a cluster: refuse it there rather
/// than ignore it.
fn refuse_cluster_for_roles(matches: &clap::ArgMatches, command: &Command) -> anyhow::Result<()> {
    if matches.value_source("cluster") != Some(clap::parser::ValueSource::CommandLine) {
        return Ok(());
    }
    let hint = match command {
        Command::Up(_) => "`insitu up` runs its own coordinator: choose its port with --port",
        Command::Coordinator(_) => "`insitu coordinator` listens on --host and --port",
        // `insitu server remove ID` is a client command.
        Command::Server(args) if args.action.is_some() => return Ok(()),
        Command::Server(_) => "`insitu server` takes the coordinator's address as --coordinator",
        Command::Bench(_) => "the benchmarks start their own clusters",
        _ => return Ok(()),
    };
    anyhow::bail!("--cluster is for the client commands; {hint}")
}

fn main() -> std::process::ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = refuse_cluster_for_roles(&matches, &cli.command) {
        return report(Err(e));
    }
    let cluster = &cli.cluster;
    let result = match cli.command {
        Command::Up(args) => {
            init_tracing("info");
            insitu_telemetry::abort_on_panic();
            cluster::up(args)
        }
        Command::Coordinator(args) => {
            init_tracing("info");
            insitu_telemetry::abort_on_panic();
            cluster::coordinator(args, cluster)
        }
        Command::Auth(cmd) => {
            init_tracing("warn");
            auth::run(cmd)
        }
        Command::Tls(cmd) => {
            init_tracing("warn");
            tls::run(cmd)
        }
        Command::Server(cluster::ServerArgs {
            action: Some(cluster::ServerAction::Remove { id }),
            ..
        }) => {
            init_tracing("warn");
            status::remove_server(id, cluster)
        }
        Command::Server(args) => {
            init_tracing("info");
            insitu_telemetry::abort_on_panic();
            cluster::server(args, cluster)
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
            tls,
        }) => {
            init_tracing("warn");
            let versus = match vs.as_str() {
                "redis" => Ok(insitu_bench::kv::Versus::Redis),
                "redis-aof" => Ok(insitu_bench::kv::Versus::RedisAof),
                "snapshots" => Ok(insitu_bench::kv::Versus::Snapshots),
                "none" => Ok(insitu_bench::kv::Versus::Nothing),
                other => Err(anyhow::anyhow!(
                    "--vs must be redis, redis-aof, snapshots or none, not {other:?}"
                )),
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
                    tls,
                })
                .map(|_| ())
            })
        }
        Command::Bench(BenchCmd::Aggregate(args)) => {
            init_tracing("warn");
            insitu_bench::aggregate::run(&args)
        }
        Command::Bench(BenchCmd::Tpch(args)) => {
            init_tracing("warn");
            insitu_bench::tpch::run(&args)
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
        Command::Bench(BenchCmd::Recovery(args)) => {
            init_tracing("warn");
            insitu_bench::recovery::run(&args)
        }
        Command::Bench(BenchCmd::Resp(args)) => insitu_bench::resp_bench::run(&args),
        Command::Bench(BenchCmd::Txn(args)) => {
            init_tracing("warn");
            insitu_bench::txn::run(&args)
        }
        Command::Count(args) => {
            init_tracing("warn");
            ops::count(args, cluster)
        }
        Command::Agg(args) => {
            init_tracing("warn");
            ops::agg(args, cluster)
        }
        Command::Update(args) => {
            init_tracing("warn");
            ops::update(args, cluster)
        }
        Command::Delete(args) => {
            init_tracing("warn");
            ops::delete(args, cluster)
        }
        Command::Train(cmd) => {
            init_tracing("warn");
            ops::train(cmd, cluster)
        }
        Command::Tpch(cmd) => {
            init_tracing("warn");
            tpch::run(cmd, cluster)
        }
        Command::Sql(args) => {
            init_tracing("warn");
            sql::run(args, cluster)
        }
        Command::Index(cmd) => {
            init_tracing("warn");
            index::run(cmd, cluster)
        }
        Command::Txn(args) => {
            init_tracing("warn");
            txn::run(args, cluster)
        }
        other => {
            init_tracing("warn");
            data::run(other, cluster)
        }
    };
    report(result)
}

/// The exit status of a command, its error (if any) printed on stderr.
fn report(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
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
