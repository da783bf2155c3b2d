//! `insitu txn`: run a small script of get/put/del/add lines as one
//! transaction (all or nothing, serializable), for scripting and tests.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, bail};
use bytes::Bytes;
use insitu_client::{ClientError, Status};
use insitu_protocol::query::Scalar;
use insitu_protocol::schema::Schema;

use crate::ClusterArg;
use crate::data::{connect, runtime};

/// Most lines a script may have. Why: a transaction holds its keys locked
/// on the servers while it commits (and the server's per-participant limit
/// is 10 000 keys); a script is for a few keys, bulk writes have `load`.
const MAX_SCRIPT_LINES: usize = 10_000;

#[derive(clap::Args)]
#[command(after_help = "\
SCRIPT lines (one operation each; blank lines and lines starting with # are skipped):
  get TABLE KEY           print the value (or (nil)) once the transaction commits
  put TABLE KEY VALUE     write VALUE (the rest of the line) under KEY
  del TABLE KEY           remove KEY
  add TABLE KEY DELTA     treat the value as a decimal integer (absent = 0) and add DELTA
  insert TABLE ROW        write ROW, CSV in the column order of typed table TABLE (an empty
                          field is NULL); a row with an existing key replaces it

Reads see the transaction's own writes. On a conflict with another transaction the whole
script runs again (up to the client's timeout); nothing is written unless all of it commits.
A script of `get` lines only reads every key at one snapshot: it sees each transaction
whole or not at all, and never conflicts with writers.

Typed tables take `insert` lines only; the other operations are for untyped tables.

Example, a transfer:
  printf 'add accounts alice -10\\nadd accounts bob 10\\n' | insitu txn")]
pub struct TxnArgs {
    /// The script file; `-` (the default) reads it from standard input.
    #[arg(default_value = "-")]
    script: PathBuf,
}

/// One line of a script.
#[derive(Clone, Debug, PartialEq)]
enum Op {
    Get {
        table: String,
        key: String,
    },
    Put {
        table: String,
        key: String,
        value: String,
    },
    Del {
        table: String,
        key: String,
    },
    Add {
        table: String,
        key: String,
        delta: i64,
    },
    /// A row of a typed table, as CSV text (checked against the schema
    /// once the table is open).
    Insert {
        table: String,
        row: String,
    },
}

impl Op {
    fn table(&self) -> &str {
        match self {
            Op::Get { table, .. }
            | Op::Put { table, .. }
            | Op::Del { table, .. }
            | Op::Add { table, .. }
            | Op::Insert { table, .. } => table,
        }
    }
}

/// Parse a script; errors name the line.
fn parse(script: &str) -> anyhow::Result<Vec<Op>> {
    let mut ops = Vec::new();
    for (n, line) in script.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if ops.len() == MAX_SCRIPT_LINES {
            bail!("the script has more than {MAX_SCRIPT_LINES} operations");
        }
        let mut words = line
            .splitn(4, char::is_whitespace)
            .filter(|w| !w.is_empty());
        let (verb, table, key) = (words.next(), words.next(), words.next());
        let rest = words.next().map(str::trim_end);
        let at = || format!("line {}: {line:?}", n + 1);
        if verb == Some("insert") {
            // The row is the rest of the line after the table, as written.
            let Some(table) = table else {
                bail!("{}: `insert` needs TABLE ROW", at());
            };
            let row = line["insert".len()..].trim_start()[table.len()..].trim();
            if row.is_empty() {
                bail!("{}: `insert` needs a row after the table", at());
            }
            ops.push(Op::Insert {
                table: table.to_string(),
                row: row.to_string(),
            });
            continue;
        }
        let (Some(verb), Some(table), Some(key)) = (verb, table, key) else {
            bail!(
                "{}: expected `VERB TABLE KEY ...` (see `insitu txn --help`)",
                at()
            );
        };
        let (table, key) = (table.to_string(), key.to_string());
        let op = match (verb, rest) {
            ("get", None) => Op::Get { table, key },
            ("del", None) => Op::Del { table, key },
            ("put", Some(value)) => Op::Put {
                table,
                key,
                value: value.to_string(),
            },
            ("add", Some(delta)) => Op::Add {
                table,
                key,
                delta: delta
                    .parse()
                    .with_context(|| format!("{}: DELTA must be an integer", at()))?,
            },
            ("get" | "del", Some(_)) => bail!("{}: `{verb}` takes TABLE KEY only", at()),
            ("put" | "add", None) => bail!("{}: `{verb}` needs a value after the key", at()),
            _ => bail!(
                "{}: unknown operation {verb:?} (get, put, del, add, insert)",
                at()
            ),
        };
        ops.push(op);
    }
    if ops.is_empty() {
        bail!("the script has no operations (see `insitu txn --help`)");
    }
    Ok(ops)
}

/// The value `add` reads: decimal text (absent = 0).
fn as_integer(key: &str, value: Option<&Bytes>) -> Result<i64, ClientError> {
    let Some(v) = value else { return Ok(0) };
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| {
            ClientError::Status(
                Status::BadRequest,
                format!("`add` on key {key:?}: its value is not a decimal integer"),
            )
        })
}

pub fn run(args: TxnArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let mut script = String::new();
    if args.script.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut script)
            .context("cannot read the script from standard input")?;
    } else {
        script = std::fs::read_to_string(&args.script)
            .with_context(|| format!("cannot read {}", args.script.display()))?;
    }
    let ops = parse(&script)?;
    runtime()?.block_on(async {
        let client = connect(cluster).await?;
        let mut tables: HashMap<String, u64> = HashMap::new();
        let mut rows: Vec<Option<Vec<Scalar>>> = Vec::with_capacity(ops.len());
        let mut schemas: HashMap<String, Schema> = HashMap::new();
        // Each table is looked up once, however many lines name it.
        let mut infos: HashMap<String, insitu_client::TableInfo> = HashMap::new();
        for (n, op) in ops.iter().enumerate() {
            let name = op.table();
            let info = match infos.get(name) {
                Some(info) => info,
                None => {
                    let info = match client.open_table(name).await {
                        Ok(info) => info,
                        Err(e) if e.status() == Some(Status::UnknownTable) => {
                            bail!("unknown table {name:?} (`insitu table list` shows the tables)")
                        }
                        Err(e) => return Err(e.into()),
                    };
                    infos.entry(name.to_string()).or_insert(info)
                }
            };
            rows.push(match (op, &info.schema) {
                (Op::Insert { row, .. }, Some(schema)) => {
                    let row = crate::typed::row_from_csv(schema, row)
                        .with_context(|| format!("operation {}: insert into {name:?}", n + 1))?;
                    schemas.insert(name.to_string(), schema.clone());
                    Some(row)
                }
                (Op::Insert { .. }, None) => bail!(
                    "table {name:?} is untyped: write to it with `put {name} KEY VALUE` lines"
                ),
                (_, Some(_)) => bail!(
                    "table {name:?} is typed: it takes `insert {name} ROW` lines (get, put, \
                     del and add are for untyped tables)"
                ),
                (_, None) => None,
            });
            tables.insert(name.to_string(), info.id);
        }
        let rows = &rows;
        let schemas = &schemas;
        let printed = if ops.iter().all(|op| matches!(op, Op::Get { .. })) {
            read_only(&client, &ops, &tables).await?
        } else {
            read_write(&client, &ops, &tables, rows, schemas).await?
        };
        for line in printed {
            crate::outln!("{line}")?;
        }
        Ok(())
    })
}

fn show(v: Option<Bytes>) -> String {
    match v {
        Some(v) => String::from_utf8_lossy(&v).into_owned(),
        None => "(nil)".to_string(),
    }
}

/// A script of `get` lines only: read at one snapshot (nothing to
/// validate or lock, so it never aborts).
async fn read_only(
    client: &insitu_client::Client,
    ops: &[Op],
    tables: &HashMap<String, u64>,
) -> anyhow::Result<Vec<String>> {
    let printed = client
        .read_only(|snap| async move {
            let mut printed = Vec::new();
            for op in ops {
                if let Op::Get { key, .. } = op {
                    printed.push(show(snap.read(tables[op.table()], key).await?));
                }
            }
            Ok(printed)
        })
        .await
        .context("the reads at a snapshot failed")?;
    Ok(printed)
}

async fn read_write(
    client: &insitu_client::Client,
    ops: &[Op],
    tables: &HashMap<String, u64>,
    rows: &[Option<Vec<Scalar>>],
    schemas: &HashMap<String, Schema>,
) -> anyhow::Result<Vec<String>> {
    let printed = client
            .transaction(|mut tx| {
                let (ops, tables) = (ops, tables);
                async move {
                    let mut printed = Vec::new();
                    for (op, row) in ops.iter().zip(rows) {
                        let id = tables[op.table()];
                        match op {
                            Op::Insert { table, .. } => {
                                // Parsed against the schema before the transaction began.
                                let row = row.as_deref().unwrap_or_default();
                                tx.write_row(id, &schemas[table], row)?;
                            }
                            Op::Get { key, .. } => {
                                printed.push(show(tx.read(id, key).await?));
                            }
                            Op::Put { key, value, .. } => tx.write(id, key, value),
                            Op::Del { key, .. } => tx.remove(id, key),
                            Op::Add { key, delta, .. } => {
                                let v = tx.read(id, key).await?;
                                let n = as_integer(key, v.as_ref())?;
                                let sum = n.checked_add(*delta).ok_or_else(|| {
                                    ClientError::Status(
                                        Status::BadRequest,
                                        format!("`add` on key {key:?}: {n} + {delta} overflows a 64-bit integer"),
                                    )
                                })?;
                                tx.write(id, key, sum.to_string());
                            }
                        }
                    }
                    Ok((tx, printed))
                }
            })
            .await
            .context("the transaction did not commit")?;
    Ok(printed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_parse_and_errors_name_the_line() {
        let ops =
            parse("# transfer\nadd a x -10\n\nput a y hello world\nget a y\ndel a z\n").unwrap();
        assert_eq!(
            ops,
            vec![
                Op::Add {
                    table: "a".into(),
                    key: "x".into(),
                    delta: -10
                },
                Op::Put {
                    table: "a".into(),
                    key: "y".into(),
                    value: "hello world".into()
                },
                Op::Get {
                    table: "a".into(),
                    key: "y".into()
                },
                Op::Del {
                    table: "a".into(),
                    key: "z".into()
                },
            ]
        );
        let e = parse("get a b\nfrob a b\n").unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("unknown operation"),
            "{e}"
        );
        let e = parse("add a b x\n").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("integer"), "{e}");
        assert!(parse("put a b\n").is_err());
        // An insert's row is the rest of the line, commas and spaces kept.
        assert_eq!(
            parse("insert users 4,\"van der Berg, j\",,1.5\n").unwrap(),
            vec![Op::Insert {
                table: "users".into(),
                row: "4,\"van der Berg, j\",,1.5".into()
            }]
        );
        assert!(parse("insert users\n").is_err());
        assert!(parse("insert\n").is_err());
        assert!(parse("get a b c\n").is_err());
        assert!(parse("\n# nothing\n").is_err());
    }
}
