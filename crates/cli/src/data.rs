//! Client commands: tables, point operations, scan, load, status, tablet moves.

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
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
        name: String,
        #[arg(long, default_value_t = 4)]
        tablets: u32,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// List tables and their tablets.
    List {
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Drop a table and free its memory on every server.
    Drop {
        name: String,
        #[command(flatten)]
        cluster: ClusterArg,
    },
}

#[derive(Subcommand)]
pub enum TabletCmd {
    /// Move tablet TABLET_INDEX of TABLE to server SERVER_ID (writes during the move wait, none is lost).
    Move {
        table: String,
        tablet_index: u32,
        server_id: u64,
        #[command(flatten)]
        cluster: ClusterArg,
    },
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

async fn connect(cluster: &ClusterArg) -> anyhow::Result<Client> {
    Client::connect(&cluster.cluster).await.with_context(|| {
        format!(
            "cannot reach the insitu cluster at {} (is `insitu up` running?)",
            cluster.cluster
        )
    })
}

/// Connect and look the table up: what every per-table command starts with.
async fn open(
    cluster: &ClusterArg,
    table: &str,
) -> anyhow::Result<(Client, insitu_client::TableInfo)> {
    let client = connect(cluster).await?;
    let info = client.open_table(table).await?;
    Ok((client, info))
}

fn not_found(key: &str, table: &str) -> anyhow::Error {
    NotFound(format!("no object with key {key:?} in table {table}")).into()
}

pub fn run(command: Command) -> anyhow::Result<()> {
    runtime()?.block_on(run_async(command))
}

async fn run_async(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Table(TableCmd::Create {
            name,
            tablets,
            cluster,
        }) => {
            let client = connect(&cluster).await?;
            let info = client.create_table(&name, tablets).await?;
            println!(
                "created table {} (id {}) with {} tablets",
                info.name,
                info.id,
                info.tablets.len()
            );
        }
        Command::Table(TableCmd::List { cluster }) => {
            let client = connect(&cluster).await?;
            let tables = client.list_tables().await?;
            if tables.is_empty() {
                println!("no tables");
            }
            for t in tables {
                let mut servers: Vec<u64> = t.tablets.iter().map(|x| x.server_id).collect();
                servers.sort_unstable();
                servers.dedup();
                println!(
                    "{}\tid {}\t{} tablets\tservers {:?}",
                    t.name,
                    t.id,
                    t.tablets.len(),
                    servers
                );
            }
        }
        Command::Table(TableCmd::Drop { name, cluster }) => {
            let client = connect(&cluster).await?;
            client.drop_table(&name).await?;
            println!("dropped table {name}");
        }
        Command::Tablet(TabletCmd::Move {
            table,
            tablet_index,
            server_id,
            cluster,
        }) => {
            let client = connect(&cluster).await?;
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
            println!(
                "moved tablet {tablet_index} of {table} to server {server_id} in {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
        }
        Command::Put {
            table,
            key,
            value,
            cluster,
        } => {
            let (client, t) = open(&cluster, &table).await?;
            let version = client.write(t.id, key.as_bytes(), value.as_bytes()).await?;
            println!("ok (version {version})");
        }
        Command::Get {
            table,
            key,
            cluster,
        } => {
            let (client, t) = open(&cluster, &table).await?;
            match client.read(t.id, key.as_bytes()).await? {
                Some((value, _version)) => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&value)?;
                    out.write_all(b"\n")?;
                }
                None => return Err(not_found(&key, &table)),
            }
        }
        Command::Del {
            table,
            key,
            cluster,
        } => {
            let (client, t) = open(&cluster, &table).await?;
            match client.remove(t.id, key.as_bytes()).await? {
                Some(version) => println!("removed (version {version})"),
                None => return Err(not_found(&key, &table)),
            }
        }
        Command::Scan {
            table,
            limit,
            cluster,
        } => {
            let (client, t) = open(&cluster, &table).await?;
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
        Command::Load {
            table,
            file,
            batch,
            cluster,
        } => {
            anyhow::ensure!(
                (1..=100_000).contains(&batch),
                "--batch must be between 1 and 100000"
            );
            let (client, t) = open(&cluster, &table).await?;
            load(&client, t.id, &file, batch).await?;
        }
        Command::Status { cluster } => status(&cluster).await?,
        Command::Up(_)
        | Command::Coordinator(_)
        | Command::Server(_)
        | Command::Bench(_)
        | Command::Count(_)
        | Command::Agg(_)
        | Command::Update(_)
        | Command::Train(_) => {
            unreachable!("dispatched in main")
        }
    }
    Ok(())
}

/// Parse one input line into (key, value). CSV `key,value` (value may hold
/// further commas, and may be quoted) or a JSON object with "key" and "value".
fn parse_line(line: &str, json: bool) -> anyhow::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.trim().is_empty() {
        return Ok(None);
    }
    if json {
        let v: serde_json::Value = serde_json::from_str(line).context("not valid JSON")?;
        let field = |name: &str| -> anyhow::Result<Vec<u8>> {
            match v.get(name) {
                Some(serde_json::Value::String(s)) => Ok(s.as_bytes().to_vec()),
                Some(serde_json::Value::Null) | None => bail!("missing \"{name}\""),
                Some(other) => Ok(other.to_string().into_bytes()),
            }
        };
        return Ok(Some((field("key")?, field("value")?)));
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(line.as_bytes());
    let record = match reader.byte_records().next() {
        Some(r) => r.context("not valid CSV")?,
        None => return Ok(None),
    };
    if record.len() < 2 {
        bail!("expected `key,value`, found {} field(s)", record.len());
    }
    let key = record[0].to_vec();
    // Everything after the first field is the value, commas included.
    let value = if record.len() == 2 {
        record[1].to_vec()
    } else {
        record.iter().skip(1).collect::<Vec<_>>().join(&b","[..])
    };
    Ok(Some((key, value)))
}

async fn load(client: &Client, table: u64, path: &Path, batch: usize) -> anyhow::Result<()> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let total_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    let json = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("json" | "jsonl" | "ndjson")
    );
    let bar = ProgressBar::new(total_bytes);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut reader = std::io::BufReader::new(file);
    let mut line = String::new();
    let mut pending: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(batch);
    let (mut loaded, mut line_no) = (0u64, 0u64);
    let started = Instant::now();
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .with_context(|| format!("reading {} line {}", path.display(), line_no + 1))?;
        if n > 0 {
            line_no += 1;
            bar.inc(n as u64);
            if let Some(kv) = parse_line(&line, json)
                .with_context(|| format!("{} line {line_no}", path.display()))?
            {
                pending.push(kv);
            }
        }
        if pending.len() >= batch || (n == 0 && !pending.is_empty()) {
            let results = client.multi_write(table, &pending).await?;
            for (i, r) in results.into_iter().enumerate() {
                if let Err(e) = r {
                    bail!(
                        "writing key {:?}: {e}",
                        String::from_utf8_lossy(&pending[i].0)
                    );
                }
            }
            loaded += pending.len() as u64;
            pending.clear();
            bar.set_message(format!("{loaded} objects"));
        }
        if n == 0 {
            break;
        }
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "loaded {loaded} objects in {secs:.2} s ({:.0} objects/s)",
        loaded as f64 / secs.max(1e-9)
    );
    Ok(())
}

async fn status(cluster: &ClusterArg) -> anyhow::Result<()> {
    let client = connect(cluster).await?;
    let servers = client.list_servers().await?;
    let tables = client.list_tables().await?;
    println!(
        "coordinator {}: {} servers, {} tables",
        cluster.cluster,
        servers.len(),
        tables.len()
    );
    println!(
        "{:>6} {:>6} {:<22} {:>8} {:>12} {:>12} {:>12}",
        "server", "shard", "address", "tablets", "objects", "live MiB", "used MiB"
    );
    for s in servers {
        for (i, addr) in s.shard_addrs.iter().enumerate() {
            match client.shard_stats(addr).await {
                Ok(st) => {
                    let objects: u64 = st.tablets.iter().map(|t| t.objects).sum();
                    println!(
                        "{:>6} {:>6} {:<22} {:>8} {:>12} {:>12.1} {:>12.1}",
                        s.id,
                        i,
                        addr,
                        st.tablets.len(),
                        objects,
                        st.live_bytes as f64 / 1048576.0,
                        st.segment_bytes as f64 / 1048576.0
                    );
                }
                Err(e) => println!("{:>6} {:>6} {:<22} unreachable: {e}", s.id, i, addr),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_line;

    #[test]
    fn csv_lines_keep_commas_in_values() {
        assert_eq!(
            parse_line("k,v\n", false).unwrap(),
            Some((b"k".to_vec(), b"v".to_vec()))
        );
        assert_eq!(
            parse_line("k,a,b", false).unwrap(),
            Some((b"k".to_vec(), b"a,b".to_vec()))
        );
        assert_eq!(
            parse_line("\"k,1\",\"x y\"", false).unwrap(),
            Some((b"k,1".to_vec(), b"x y".to_vec()))
        );
        assert_eq!(parse_line("   \n", false).unwrap(), None);
        assert!(parse_line("onlykey", false).is_err());
    }

    #[test]
    fn json_lines_need_key_and_value() {
        assert_eq!(
            parse_line(r#"{"key":"a","value":"b"}"#, true).unwrap(),
            Some((b"a".to_vec(), b"b".to_vec()))
        );
        assert_eq!(
            parse_line(r#"{"key":"a","value":7}"#, true).unwrap(),
            Some((b"a".to_vec(), b"7".to_vec()))
        );
        assert!(parse_line(r#"{"key":"a"}"#, true).is_err());
        assert!(parse_line("{not json", true).is_err());
    }
}
