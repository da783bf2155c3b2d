//! Client commands: tables, point operations, scan, load, status, tablet moves.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Subcommand;
use insitu_client::Client;

use crate::{ClusterArg, Command};

/// A missing object: printed plainly on stderr, exit code 1.
#[derive(Debug)]
pub struct NotFound(pub String);
impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for NotFound {}

#[derive(Subcommand)]
pub enum TableCmd {
    /// Create a table split into N tablets spread over the servers.
    Create {
        /// The new table's name.
        name: String,
        /// Tablets (hash ranges) to split it into, 1 to 1024; more tablets spread it over more shards.
        #[arg(long, default_value_t = 4)]
        tablets: u32,
        /// Make a typed table with these columns: `NAME TYPE [null], ...`; types int32, int64,
        /// float64, decimal(P,S) (P <= 18), date32, utf8, bool; columns are NOT NULL unless
        /// marked `null`. Without --schema the table is untyped (opaque values).
        #[arg(long, requires = "key")]
        schema: Option<String>,
        /// The primary key of a typed table: its columns, comma-separated (e.g. `l_orderkey,l_linenumber`).
        #[arg(long, requires = "schema")]
        key: Option<String>,
    },
    /// List tables and their tablets.
    List,
    /// Drop a table and free its memory on every server.
    Drop { name: String },
    /// Acknowledge that a table lost objects with a server that held them in memory only.
    ///
    /// A server that held some of the table's tablets in memory only
    /// (`--replicas 0`) died, and they came back empty. Until this command, a
    /// read of a missing key there fails with "data lost" (the key may have
    /// existed) and `count`/`agg` warn; afterwards missing keys are simply not
    /// found. `insitu status` lists the tablets concerned.
    AckLoss {
        /// The table.
        name: String,
    },
    /// Give up replicas no backup holds, so waiting tablets recover from what is held.
    ///
    /// A tablet's recovery is refused while its log's digest shows that
    /// segments are missing (their only replicas sat on disks that are gone,
    /// say servers given up with `insitu server remove`); reads of it say
    /// so. Start a server again on such a disk if you can: nothing is lost
    /// then. If the disks are gone for good, this command recovers every
    /// tablet of the table still waiting from what the backups hold, and
    /// marks it lost: reads of missing keys fail with "data lost" until
    /// `insitu table ack-loss TABLE`.
    AcceptLoss {
        /// The table.
        name: String,
    },
}

#[derive(Subcommand)]
pub enum TabletCmd {
    /// Move tablet TABLET_INDEX of TABLE to server SERVER_ID (writes during the move wait, none is lost).
    Move {
        /// The table.
        table: String,
        /// Which of its tablets, from 0 (`insitu table list` shows how many there are).
        tablet_index: u32,
        /// The server to move it to (`insitu status` lists the servers).
        server_id: u64,
    },
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

/// Connect to the coordinator at `--cluster`, with errors that say what to check.
pub(crate) async fn connect(cluster: &ClusterArg) -> anyhow::Result<Client> {
    let addr = cluster.cluster.as_str();
    // A missing port would otherwise read "invalid socket address".
    let has_port = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !has_port {
        bail!("--cluster {addr:?} is not an address: write HOST:PORT, e.g. 127.0.0.1:7070");
    }
    let config = insitu_client::ClientConfig {
        auth_token: crate::auth::client_token(cluster)?,
        tls: crate::tls::client_tls(cluster)?,
        ..Default::default()
    };
    let plain = config.tls.is_none();
    Client::connect_with(addr, config).await.with_context(|| {
        // A TLS port closes a plaintext connection without a word.
        let tls_hint = if plain {
            "; if it serves TLS, pass --tls-ca (or INSITU_TLS_CA)"
        } else {
            ""
        };
        format!(
            "cannot reach the insitu cluster at {addr} (is `insitu up` running there?{tls_hint})"
        )
    })
}

/// Connect and look the table up: what every per-table command starts with.
pub(crate) async fn open(
    cluster: &ClusterArg,
    table: &str,
) -> anyhow::Result<(Client, insitu_client::TableInfo)> {
    let client = connect(cluster).await?;
    match client.open_table(table).await {
        Ok(info) => Ok((client, info)),
        Err(e) if e.status() == Some(insitu_client::Status::UnknownTable) => bail!(
            "unknown table {table:?} (`insitu table list` shows the tables, \
             `insitu table create {table}` makes it)"
        ),
        Err(e) => Err(e.into()),
    }
}

fn not_found(key: &str, table: &str) -> anyhow::Error {
    NotFound(format!("no object with key {key:?} in table {table}")).into()
}

pub fn run(command: Command, cluster: &ClusterArg) -> anyhow::Result<()> {
    runtime()?.block_on(run_async(command, cluster))
}

async fn run_async(command: Command, cluster: &ClusterArg) -> anyhow::Result<()> {
    match command {
        Command::Table(TableCmd::Create {
            name,
            tablets,
            schema,
            key,
        }) => {
            let schema = match (schema, key) {
                (Some(s), Some(k)) => Some(
                    insitu_rows::text::parse_schema(&s, &k)
                        .map_err(|e| anyhow::anyhow!("bad --schema/--key: {e}"))?,
                ),
                _ => None,
            };
            let client = connect(cluster).await?;
            let info = client.create_table_with(&name, tablets, schema).await?;
            crate::outln!(
                "created table {} (id {}) with {} tablets",
                info.name,
                info.id,
                info.tablets.len()
            )?;
        }
        Command::Table(TableCmd::List) => {
            let client = connect(cluster).await?;
            let tables = client.list_tables().await?;
            if tables.is_empty() {
                crate::outln!("no tables")?;
            }
            for t in tables {
                let mut servers: Vec<u64> = t.tablets.iter().map(|x| x.server_id).collect();
                servers.sort_unstable();
                servers.dedup();
                crate::outln!(
                    "{}\tid {}\t{} tablets\tservers {:?}",
                    t.name,
                    t.id,
                    t.tablets.len(),
                    servers
                )?;
            }
        }
        Command::Table(TableCmd::AcceptLoss { name }) => {
            let client = connect(cluster).await?;
            match client.accept_loss(&name).await {
                Ok(0) => crate::outln!("table {name} has no tablet waiting for recovery")?,
                Ok(n) => crate::outln!(
                    "gave up what no backup holds of {n} tablets of table {name}: they are recovered from what the backups hold and marked lost (reads of missing keys fail with \"data lost\"; `insitu table ack-loss {name}` acknowledges that once they serve)"
                )?,
                Err(e) => return Err(loss_error(&name, e)),
            }
        }
        Command::Table(TableCmd::AckLoss { name }) => {
            let client = connect(cluster).await?;
            match client.ack_loss(&name).await {
                Ok(0) => crate::outln!("table {name} has no lost objects to acknowledge")?,
                Ok(n) => crate::outln!(
                    "acknowledged: {n} tablets of table {name} lost their objects; missing keys there now read as not found"
                )?,
                Err(e) => return Err(loss_error(&name, e)),
            }
        }
        Command::Table(TableCmd::Drop { name }) => {
            let client = connect(cluster).await?;
            client.drop_table(&name).await?;
            crate::outln!("dropped table {name}")?;
        }
        Command::Tablet(TabletCmd::Move {
            table,
            tablet_index,
            server_id,
        }) => {
            let client = connect(cluster).await?;
            let started = Instant::now();
            match client.move_tablet(&table, tablet_index, server_id).await {
                Ok(()) => {}
                // The request was sent and no reply came: the coordinator may
                // still finish or undo the move, so "failed" would be a lie.
                Err(
                    e @ (insitu_client::ClientError::Timeout { .. }
                    | insitu_client::ClientError::Closed(_)),
                ) => bail!(
                    "outcome unknown: {e}; the coordinator may still finish or undo the move, check `insitu status`"
                ),
                Err(e) => return Err(e.into()),
            }
            crate::outln!(
                "moved tablet {tablet_index} of {table} to server {server_id} in {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            )?;
        }
        Command::Put {
            table,
            key,
            value,
            file,
            ttl,
        } => {
            let value = put_value(value, file.as_deref())?;
            let (client, t) = open(cluster, &table).await?;
            if t.schema.is_some() {
                bail!(
                    "{table:?} is a typed table: its rows are written by their columns with \
                     `insitu insert {table} 'v1,v2,...'` or `insitu load {table} FILE`"
                );
            }
            let Some(ttl_s) = ttl else {
                let version = client.write(t.id, key.as_bytes(), &value).await?;
                crate::outln!("ok (version {version})")?;
                return Ok(());
            };
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis() as u64;
            // `ttl` is at most 10^11 s (clap's range): no overflow.
            let deadline_ms = now_ms + ttl_s * 1000;
            let version = client
                .write_expiring(
                    t.id,
                    key.as_bytes(),
                    &value,
                    deadline_ms,
                    Default::default(),
                )
                .await?;
            crate::outln!("ok (version {version}, expires in {ttl_s} s)")?;
        }
        Command::Get { table, key } => {
            let (client, t) = open(cluster, &table).await?;
            match client.read(t.id, key.as_bytes()).await? {
                Some((value, _version)) => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&value)?;
                    out.write_all(b"\n")?;
                }
                None => return Err(not_found(&key, &table)),
            }
        }
        Command::Del { table, key } => {
            let (client, t) = open(cluster, &table).await?;
            match client.remove(t.id, key.as_bytes()).await? {
                Some(version) => crate::outln!("removed (version {version})")?,
                None => return Err(not_found(&key, &table)),
            }
        }
        Command::Scan { table, limit } => {
            let (client, t) = open(cluster, &table).await?;
            let mut cursor = client.enumerate(t.id);
            let mut printed = 0u64;
            let limit = limit.unwrap_or(u64::MAX);
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            'outer: while let Some(batch) = cursor.next_batch().await? {
                for (k, v, _version) in batch {
                    if printed >= limit {
                        break 'outer;
                    }
                    out.write_all(&k)?;
                    out.write_all(b"\t")?;
                    out.write_all(&v)?;
                    out.write_all(b"\n")?;
                    printed += 1;
                }
            }
            out.flush()?;
        }
        Command::Load { table, file, batch } => {
            anyhow::ensure!(
                (1..=100_000).contains(&batch),
                "--batch must be between 1 and 100000"
            );
            let (client, t) = open(cluster, &table).await?;
            match &t.schema {
                Some(schema) => crate::typed::load(&client, t.id, schema, &file, batch).await?,
                None => crate::load::load(&client, t.id, &file, batch).await?,
            }
        }
        Command::Status => crate::status::status(cluster).await?,
        Command::Insert { table, rows } => {
            let (client, t) = open(cluster, &table).await?;
            let Some(schema) = &t.schema else {
                bail!(
                    "{table:?} is an untyped table: write to it with `insitu put {table} KEY VALUE`"
                );
            };
            crate::typed::insert(&client, t.id, schema, &rows).await?;
        }
        Command::Up(_)
        | Command::Coordinator(_)
        | Command::Auth(_)
        | Command::Tls(_)
        | Command::Server(_)
        | Command::Bench(_)
        | Command::Count(_)
        | Command::Agg(_)
        | Command::Update(_)
        | Command::Delete(_)
        | Command::Train(_)
        | Command::Tpch(_)
        | Command::Sql(_)
        | Command::Index(_)
        | Command::Txn(_) => {
            unreachable!("dispatched in main")
        }
    }
    Ok(())
}

/// The largest value `put` reads from stdin or a file: one request's body
/// limit (a server refuses larger values anyway, most with a lower limit of
/// its own), so a mistaken `put t k - < huge` fails before reading it all.
const MAX_PUT_VALUE_BYTES: u64 = insitu_protocol::frame::MAX_BODY_BYTES as u64;

/// The value of `put`: the argument, stdin for `-`, or `--file` (clap
/// refuses a value together with --file).
fn put_value(value: Option<String>, file: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    let (reader, what): (Box<dyn std::io::Read>, String) = match (value, file) {
        (Some(v), None) if v != "-" => return Ok(v.into_bytes()),
        (Some(_), None) => (Box::new(std::io::stdin().lock()), "standard input".into()),
        (None, Some(path)) => (
            Box::new(
                std::fs::File::open(path)
                    .with_context(|| format!("cannot open {}", path.display()))?,
            ),
            path.display().to_string(),
        ),
        (Some(_), Some(_)) => bail!("give either VALUE or --file, not both"),
        (None, None) => bail!("give VALUE, `-` (standard input) or --file PATH"),
    };
    let mut out = Vec::new();
    reader
        .take(MAX_PUT_VALUE_BYTES + 1)
        .read_to_end(&mut out)
        .with_context(|| format!("cannot read the value from {what}"))?;
    anyhow::ensure!(
        out.len() as u64 <= MAX_PUT_VALUE_BYTES,
        "the value in {what} is over {} MiB, more than one request may carry",
        MAX_PUT_VALUE_BYTES >> 20
    );
    Ok(out)
}

/// An `accept-loss` or `ack-loss` failure: an unknown table said plainly
/// (with where to find the names), anything else as the client reported it.
fn loss_error(name: &str, e: insitu_client::ClientError) -> anyhow::Error {
    if e.status() == Some(insitu_client::Status::UnknownTable) {
        anyhow::anyhow!("unknown table {name:?} (`insitu table list` shows the tables)")
    } else {
        e.into()
    }
}
