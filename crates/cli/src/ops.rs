//! `insitu count | agg | update | train logreg`: data operations computed on
//! the storage servers. The small expression language of `--where` (parsed
//! by `insitu_compute::expr`, shared with the Python client):
//!
//! Fields name a little-endian number at a byte offset of a raw value:
//! `i32@4`, `i64@0`, `f64@8`, `u8@16` (a byte); or a value of a JSON
//! document by its path: `$.age`, `$.address.city`, `$.tags[0]`,
//! `$["first name"]`. Expressions:
//!
//! ```text
//! expr  := and ("or" and)*
//! and   := unary ("and" unary)*
//! unary := "not" unary | "(" expr ")" | field cmp number
//!        | field "between" number "and" number
//!        | path cmp (number | 'string' | true | false)
//!        | path "between" number "and" number
//! cmp   := "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
//! ```
//! e.g. `i64@0 > 5 and (f64@8 between 1.5 and 2 or not i32@16 = 3)`, or
//! `$.age > 30 and $.name <> 'bob'` (a value without a number at `$.age`
//! matches neither `$.age > 30` nor `not $.age > 30`: SQL's NULL).

use std::time::Instant;

use anyhow::{Context, bail};
use insitu_client::{Client, Selection};
use insitu_compute::AggExt;
use insitu_protocol::Number;
use insitu_protocol::plan::{AggPartial, Field, KeyRange, PointLayout, UpdateAction};

use crate::ClusterArg;

/// When an operation reads one snapshot of the table.
#[derive(clap::Args)]
pub struct SnapshotArgs {
    /// Read every tablet at one timestamp, so the answer is the table at one
    /// instant as transactions committed it (the default when the table has
    /// more than one tablet; typed and untyped tables). Costs one timestamp
    /// from the coordinator, and retries if a server has just begun keeping
    /// versions.
    #[arg(long, conflicts_with = "no_snapshot")]
    pub at_snapshot: bool,
    /// Read each tablet as it is when its scan runs (no timestamp): a little
    /// faster, but a transaction committed mid-operation may be counted on
    /// one tablet and not another.
    #[arg(long)]
    pub no_snapshot: bool,
}

impl SnapshotArgs {
    fn mode(&self) -> insitu_client::AtSnapshot {
        match (self.at_snapshot, self.no_snapshot) {
            (true, _) => insitu_client::AtSnapshot::On,
            (_, true) => insitu_client::AtSnapshot::Off,
            _ => insitu_client::AtSnapshot::Auto,
        }
    }
}

#[derive(clap::Args)]
pub struct CountArgs {
    /// The table (see `insitu table list`).
    pub table: String,
    /// Only objects matching this expression. Typed tables: columns compared with = <> < <= > >=,
    /// BETWEEN, IN (..), IS [NOT] NULL, LIKE/ILIKE 'pattern', ~ 'regex', joined by AND, OR, NOT and
    /// parentheses, e.g. `l_discount > 0.05 and l_shipmode in ('MAIL', 'SHIP')`. Untyped tables:
    /// fields TYPE@BYTE_OFFSET of the value (i32, i64, f64 or u8, little-endian) compared with
    /// = != < <= > >= or `between A and B`, e.g. `i64@0 > 5 and not u8@8 = 0`; or JSON paths
    /// ($.age, $.address.city, $.tags[0], $["first name"]) compared with a number, a 'string',
    /// true or false, e.g. `$.age > 30 and $.name <> 'bob'` (a value without one there matches
    /// neither a comparison nor its `not`, like SQL's NULL).
    #[arg(long = "where")]
    pub filter: Option<String>,
    #[command(flatten)]
    pub keys: KeyRangeArgs,
    #[command(flatten)]
    pub snapshot: SnapshotArgs,
}

/// `--from-key` / `--to-key`: a bytewise key range (untyped tables), shared
/// by `count` and `delete`.
#[derive(clap::Args)]
pub struct KeyRangeArgs {
    /// Only keys >= this (bytewise; untyped tables).
    #[arg(long)]
    pub from_key: Option<String>,
    /// Only keys < this (bytewise; untyped tables).
    #[arg(long)]
    pub to_key: Option<String>,
}

impl KeyRangeArgs {
    /// The range given, if either end was.
    fn range(&self) -> Option<KeyRange> {
        (self.from_key.is_some() || self.to_key.is_some()).then(|| KeyRange {
            start: self.from_key.clone().unwrap_or_default().into_bytes(),
            end: self.to_key.clone().map(String::into_bytes),
        })
    }

    /// Refused on a typed table, whose keys are columns.
    fn refuse_typed(&self) -> anyhow::Result<()> {
        if self.range().is_some() {
            bail!(
                "--from-key/--to-key are for untyped tables; on a typed table filter the key columns with --where"
            );
        }
        Ok(())
    }
}

#[derive(clap::Args)]
pub struct AggArgs {
    /// The table (see `insitu table list`).
    pub table: String,
    /// sum, min, max, avg or count.
    pub func: String,
    /// The column of a typed table (e.g. `l_quantity`), or the field of an
    /// untyped one (e.g. `i64@0`), or a JSON path of an untyped one (e.g.
    /// `$.age`: the JSON numbers there; values without one are skipped).
    pub field: String,
    /// Only objects matching this expression (see `insitu count --help`).
    #[arg(long = "where")]
    pub filter: Option<String>,
    #[command(flatten)]
    pub snapshot: SnapshotArgs,
}

#[derive(clap::Args)]
pub struct UpdateArgs {
    /// The table (see `insitu table list`).
    pub table: String,
    /// The column of a typed table to change (e.g. `l_discount`; not a key
    /// column), or the field of an untyped one (e.g. `i64@0`). A JSON path
    /// (`$.age`) is not supported: update such values with get and put.
    pub field: String,
    /// Add this number to the field. Typed tables: a whole number for an
    /// integer column (days for a date column), at most the column's digits
    /// after the point for a decimal, any number for a float; a NULL stays NULL.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "set")]
    pub add: Option<String>,
    /// Set the field to this number. Typed tables: a value of the column's
    /// type (a number, text, a date YYYY-MM-DD, true/false), or NULL.
    #[arg(long, allow_hyphen_values = true)]
    pub set: Option<String>,
    /// Only objects matching this expression (see `insitu count --help`).
    #[arg(long = "where")]
    pub filter: Option<String>,
}

#[derive(clap::Args)]
pub struct DeleteArgs {
    /// The table (see `insitu table list`).
    pub table: String,
    /// Only objects (rows) matching this expression (see `insitu count --help`).
    #[arg(long = "where")]
    pub filter: Option<String>,
    #[command(flatten)]
    pub keys: KeyRangeArgs,
    /// Remove every object of the table: required when no --where,
    /// --from-key or --to-key narrows the removal, so a forgotten filter
    /// never empties a table.
    #[arg(long)]
    pub all: bool,
}

#[derive(clap::Subcommand)]
pub enum TrainCmd {
    /// Logistic regression by batch gradient descent, each gradient computed
    /// on the servers. Points: `--dims` little-endian f32 at byte 0, then a
    /// label byte (0 or 1) at byte 4*dims (override with --label-offset).
    Logreg {
        /// The table of points (see `insitu table list`).
        table: String,
        /// Features per point (f32 each).
        #[arg(long)]
        dims: u32,
        /// Gradient-descent steps (one pass over the table each).
        #[arg(long, default_value_t = 10)]
        iterations: u32,
        /// Learning rate (step size).
        #[arg(long, default_value_t = 0.5)]
        rate: f64,
        /// Byte offset of the vector.
        #[arg(long, default_value_t = 0)]
        offset: u32,
        /// Byte offset of the label (default: right after the vector).
        #[arg(long)]
        label_offset: Option<u32>,
    },
}

/// Parse a field like `i64@0` (see `insitu_compute::expr`).
pub fn parse_field(s: &str) -> anyhow::Result<Field> {
    insitu_compute::expr::parse_field(s).map_err(anyhow::Error::msg)
}

/// Parse a number: an integer stays an integer, anything else is an f64.
pub fn parse_number(s: &str) -> anyhow::Result<Number> {
    insitu_compute::expr::parse_number(s).map_err(anyhow::Error::msg)
}

fn selection(filter: &Option<String>) -> anyhow::Result<Selection> {
    use insitu_compute::expr::parse_where;
    Ok(match filter {
        None => Selection::all(),
        Some(f) => Selection::filter(
            parse_where(f).map_err(|e| anyhow::anyhow!("bad --where expression {f:?}: {e}"))?,
        ),
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

async fn open(cluster: &ClusterArg, table: &str) -> anyhow::Result<(Client, u64)> {
    let (client, info) = crate::data::open(cluster, table).await?;
    warn_lost(&info);
    Ok((client, info.id))
}

/// Say on stderr that an answer over table `info` leaves out objects that
/// were lost with a server (tablets marked lost, until `ack-loss`).
fn warn_lost(info: &insitu_client::TableInfo) {
    let lost: Vec<u64> = info
        .tablets
        .iter()
        .map(|t| t.lost_from)
        .filter(|&from| from != 0)
        .collect();
    if lost.is_empty() {
        return;
    }
    let mut with: Vec<String> = lost
        .iter()
        .map(|&f| insitu_protocol::lost_with(f))
        .collect();
    with.sort();
    with.dedup();
    eprintln!(
        "warning: {} of the {} tablets of table {:?} lost their objects with {} (it held them in memory only); this answer covers what was written there since. `insitu table ack-loss {}` acknowledges the loss",
        lost.len(),
        info.tablets.len(),
        info.name,
        with.join(", "),
        info.name
    );
}

fn show(n: Number) -> String {
    match n {
        Number::I64(v) => v.to_string(),
        Number::F64(v) => v.to_string(),
    }
}

pub fn count(a: CountArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let rt = runtime()?;
    if let Some((client, (id, schema, indexes))) = typed_table(&rt, cluster, &a.table)? {
        a.keys.refuse_typed()?;
        let table = crate::typed::Typed {
            id,
            schema: &schema,
            indexes: &indexes,
        };
        let at = a.snapshot.mode();
        return rt.block_on(async { crate::typed::count(&client, table, &a.filter, at).await });
    }
    let mut sel = selection(&a.filter)?;
    sel.at_snapshot = a.snapshot.mode();
    sel.key_range = a.keys.range();
    rt.block_on(async {
        let (client, id) = open(cluster, &a.table).await?;
        let n = client.count(id, &sel).await?;
        crate::outln!("{n}")?;
        Ok(())
    })
}

/// A typed table's id, schema and indexed columns.
type TypedInfo = (u64, insitu_protocol::schema::Schema, Vec<u16>);

/// The client and the typed table `table`, if it is a typed table. The
/// client must be used on `rt`: its connections' tasks (the coordinator's
/// among them) run there and end with it, so a client carried into another
/// runtime finds its coordinator connection closed at its first call.
fn typed_table(
    rt: &tokio::runtime::Runtime,
    cluster: &ClusterArg,
    table: &str,
) -> anyhow::Result<Option<(Client, TypedInfo)>> {
    rt.block_on(async {
        let (client, info) = crate::data::open(cluster, table).await?;
        warn_lost(&info);
        Ok(info
            .schema
            .clone()
            .map(|s| (client, (info.id, s, info.indexes.clone()))))
    })
}

pub fn agg(a: AggArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let rt = runtime()?;
    if let Some((client, (id, schema, indexes))) = typed_table(&rt, cluster, &a.table)? {
        let func = a.func.to_ascii_lowercase();
        let table = crate::typed::Typed {
            id,
            schema: &schema,
            indexes: &indexes,
        };
        return rt.block_on(async {
            let at = (&a.filter, a.snapshot.mode());
            crate::typed::agg(&client, table, &func, &a.field, at).await
        });
    }
    if a.field.trim_start().starts_with('$') {
        return agg_json(a, cluster);
    }
    let field = parse_field(&a.field).map_err(|e| {
        anyhow::anyhow!(
            "{e}\n(table {:?} is untyped: its values are bytes, and a field names a number at a byte offset of them, e.g. i64@0, or a JSON path names a number in a JSON value, e.g. $.age)",
            a.table
        )
    })?;
    let (func, sel) = untyped_agg_setup(&a)?;
    rt.block_on(async {
        let (client, id) = open(cluster, &a.table).await?;
        // An untyped table's values are opaque bytes: say what the field
        // reads, so text summed as integers is not taken for a real sum.
        eprintln!(
            "(untyped table: {} reads {} bytes at offset {} of each value as a little-endian {})",
            a.field,
            field.width(),
            field.offset(),
            match field {
                Field::I32(_) => "32-bit integer",
                Field::I64(_) => "64-bit integer",
                Field::F64(_) => "64-bit float",
                Field::U8(_) => "byte",
            }
        );
        let r = client.aggregate(id, field, &sel).await?;
        let float = field.is_float();
        // The sum is exact: i128 for integer fields.
        let out = agg_line(&func, r, r.sum(float).to_string(), r.avg(float));
        crate::outln!("{out}")?;
        Ok(())
    })
}

/// `agg` of the JSON numbers at a path of an untyped table's values.
fn agg_json(a: AggArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let path = insitu_compute::parse_path(&a.field).map_err(anyhow::Error::msg)?;
    let (func, sel) = untyped_agg_setup(&a)?;
    runtime()?.block_on(async {
        let (client, id) = open(cluster, &a.table).await?;
        eprintln!(
            "(untyped table: {path} reads the JSON number at that path; values without it are skipped)"
        );
        let r = client.aggregate_json(id, path, &sel).await?;
        // The sum is exact while every number is an integer.
        let out = agg_line(&func, r, r.mixed_sum().to_string(), r.mixed_avg());
        crate::outln!("{out}")?;
        Ok(())
    })
}

/// The aggregate `a` names (lower-cased) and its selection, as of the
/// snapshot asked for: the checks shared by `agg` of a byte field and of a
/// JSON path, so both refuse the same input with the same message.
fn untyped_agg_setup(a: &AggArgs) -> anyhow::Result<(String, Selection)> {
    let func = a.func.to_ascii_lowercase();
    if !["sum", "min", "max", "avg", "count"].contains(&func.as_str()) {
        bail!(
            "unknown aggregate {:?}: use sum, min, max, avg or count",
            a.func
        );
    }
    let mut sel = selection(&a.filter)?;
    sel.at_snapshot = a.snapshot.mode();
    Ok((func, sel))
}

/// What untyped `agg` prints for `func` of `r`; the sum and the average
/// are the caller's, as byte fields and JSON numbers add up differently.
fn agg_line(func: &str, r: AggPartial, sum: String, avg: Option<f64>) -> String {
    match func {
        "sum" => sum,
        "count" => r.count.to_string(),
        "avg" => avg.map_or("null".into(), |v| v.to_string()),
        "min" => r.min.map_or("null".into(), show),
        _ => r.max.map_or("null".into(), show),
    }
}

pub fn update(a: UpdateArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let rt = runtime()?;
    if let Some((client, (id, schema, indexes))) = typed_table(&rt, cluster, &a.table)? {
        let table = crate::typed::Typed {
            id,
            schema: &schema,
            indexes: &indexes,
        };
        let action = (a.add.as_deref(), a.set.as_deref());
        return rt.block_on(async {
            crate::typed::update(&client, table, &a.field, action, &a.filter).await
        });
    }
    if a.field.trim_start().starts_with('$') {
        bail!(
            "update of a JSON path is not supported: {} (updates change numbers at byte offsets of untyped values, e.g. i64@0; change a JSON value with get and put)",
            a.field
        );
    }
    let field = parse_field(&a.field)?;
    let action = match (&a.add, &a.set) {
        (Some(x), None) => UpdateAction::Add(parse_number(x).with_context(|| "bad --add")?),
        (None, Some(x)) => UpdateAction::Set(parse_number(x).with_context(|| "bad --set")?),
        _ => bail!("give --add X or --set X"),
    };
    // The same check the client and the servers run, before connecting.
    insitu_compute::check_action(field, action).map_err(|e| anyhow::anyhow!("bad update: {e}"))?;
    let sel = selection(&a.filter)?;
    rt.block_on(async {
        let (client, id) = open(cluster, &a.table).await?;
        let n = client.update(id, field, action, &sel).await?;
        crate::outln!("updated {n} objects")?;
        Ok(())
    })
}

pub fn train(cmd: TrainCmd, cluster: &ClusterArg) -> anyhow::Result<()> {
    let TrainCmd::Logreg {
        table,
        dims,
        iterations,
        rate,
        offset,
        label_offset,
    } = cmd;
    anyhow::ensure!(
        (1..=insitu_protocol::plan::MAX_DIMS).contains(&dims),
        "--dims must be in 1..={}",
        insitu_protocol::plan::MAX_DIMS
    );
    let layout = PointLayout {
        offset,
        dims,
        label_offset: label_offset.unwrap_or(offset + 4 * dims),
    };
    runtime()?.block_on(async {
        let (client, id) = open(cluster, &table).await?;
        let started = Instant::now();
        let m = client.train_logreg(id, layout, iterations, rate).await?;
        for (i, l) in m.losses.iter().enumerate() {
            crate::outln!("iteration {:>4}  mean log-loss {l:.6}", i + 1)?;
        }
        crate::outln!("trained in {:.1} ms", started.elapsed().as_secs_f64() * 1e3)?;
        crate::outln!("bias {}", m.bias)?;
        let w: Vec<String> = m.weights.iter().map(|w| w.to_string()).collect();
        crate::outln!("weights {}", w.join(" "))?;
        Ok(())
    })
}

pub fn delete(a: DeleteArgs, cluster: &ClusterArg) -> anyhow::Result<()> {
    let narrowed = a.filter.is_some() || a.keys.range().is_some();
    if !narrowed && !a.all {
        bail!(
            "this would remove every object of {:?}: give --where (or --from-key/--to-key), or --all to mean it",
            a.table
        );
    }
    let started = Instant::now();
    let rt = runtime()?;
    if let Some((client, (id, schema, _))) = typed_table(&rt, cluster, &a.table)? {
        a.keys.refuse_typed()?;
        let filter = match &a.filter {
            None => Vec::new(),
            Some(f) => insitu_query::parse_where(&schema, f)
                .map_err(|e| anyhow::anyhow!("bad --where expression {f:?}: {e}"))?,
        };
        return rt.block_on(async {
            let n = client.delete_rows(id, &schema, filter).await?;
            crate::outln!("deleted {n} rows")?;
            eprintln!("({:.1} ms)", started.elapsed().as_secs_f64() * 1e3);
            Ok(())
        });
    }
    let mut sel = selection(&a.filter)?;
    sel.key_range = a.keys.range();
    rt.block_on(async {
        let (client, id) = open(cluster, &a.table).await?;
        let n = client.remove_where(id, &sel).await?;
        crate::outln!("deleted {n} objects")?;
        eprintln!("({:.1} ms)", started.elapsed().as_secs_f64() * 1e3);
        Ok(())
    })
}
