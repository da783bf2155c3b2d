//! The client commands on typed tables: `insert`, `load` of CSV and Parquet
//! files, and `count` / `agg` naming columns, with `--where` in the typed
//! expression language of `insitu_query::parse_where`.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use insitu_client::{AtSnapshot, Client, QueryAnswer};
use insitu_protocol::query::{AggFunc, AggSpec, QueryOutput, QueryPlan, Scalar, ValueOp};
use insitu_protocol::schema::Schema;
use insitu_rows::ColumnMap;
use insitu_rows::text::parse_value;

/// One row from CSV fields in schema order (an empty field is NULL).
fn row_from_fields(schema: &Schema, fields: &[&str]) -> anyhow::Result<Vec<Scalar>> {
    if fields.len() != schema.columns.len() {
        bail!(
            "{} values for {} columns ({})",
            fields.len(),
            schema.columns.len(),
            schema
        );
    }
    schema
        .columns
        .iter()
        .zip(fields)
        .map(|(c, f)| {
            let text = (!f.is_empty()).then_some(*f);
            parse_value(text, c).map_err(anyhow::Error::from)
        })
        .collect()
}

/// One row from a line of CSV in the schema's column order.
pub fn row_from_csv(schema: &Schema, text: &str) -> anyhow::Result<Vec<Scalar>> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(text.as_bytes());
    let record = reader
        .records()
        .next()
        .context("an empty row")?
        .context("not CSV")?;
    let fields: Vec<&str> = record.iter().collect();
    row_from_fields(schema, &fields)
}

/// `insitu insert TABLE ROW...`: each ROW is CSV in the schema's column order.
pub async fn insert(
    client: &Client,
    table: u64,
    schema: &Schema,
    rows: &[String],
) -> anyhow::Result<()> {
    let mut values = Vec::with_capacity(rows.len());
    for (i, text) in rows.iter().enumerate() {
        values.push(row_from_csv(schema, text).with_context(|| format!("row {}", i + 1))?);
    }
    let results = client.put_rows(table, &values).await?;
    let mut failed = 0;
    for (i, r) in results.into_iter().enumerate() {
        if let Err(e) = r {
            failed += 1;
            eprintln!("row {}: {e}", i + 1);
        }
    }
    if failed > 0 {
        bail!("{failed} of {} rows were not written", values.len());
    }
    crate::outln!("inserted {} rows", values.len())?;
    Ok(())
}

fn bar(len: u64, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let template = format!("{{bar:40}} {{pos}}/{{len}} {unit} {{msg}} ({{eta}})");
    bar.set_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// `insitu load TABLE FILE` on a typed table: CSV with a header line naming
/// the columns (in any order; a missing nullable column is NULL), or
/// Parquet (`.parquet`), its columns matched by name.
pub async fn load(
    client: &Client,
    table: u64,
    schema: &Schema,
    path: &Path,
    batch: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut load = Load {
        client,
        table,
        schema,
        path,
        batch,
        pending: Vec::with_capacity(batch),
        first: 1,
    };
    let loaded = if path.extension().and_then(|e| e.to_str()) == Some("parquet") {
        load.parquet(file).await?
    } else {
        load.csv(file).await?
    };
    let secs = started.elapsed().as_secs_f64();
    crate::outln!(
        "loaded {loaded} rows in {secs:.1} s ({:.0} rows/s)",
        loaded as f64 / secs.max(1e-9)
    )?;
    Ok(())
}

/// A `load` in progress, whichever the file's format: where its rows go, the
/// file they come from (named in errors), and the batch not yet sent.
struct Load<'a> {
    client: &'a Client,
    table: u64,
    schema: &'a Schema,
    path: &'a Path,
    /// Rows per write.
    batch: usize,
    /// Rows read and not yet written.
    pending: Vec<Vec<Scalar>>,
    /// The input row number (1-based) of `pending[0]`, for errors.
    first: u64,
}

impl Load<'_> {
    /// Send the pending rows; any refused row fails the load, naming it. The
    /// next batch starts after input row `read` (the rows read so far).
    async fn flush(&mut self, read: u64) -> anyhow::Result<()> {
        let first = self.first;
        if !self.pending.is_empty() {
            let results = self
                .client
                .put_rows(self.table, &self.pending)
                .await
                .with_context(|| format!("writing the rows from input row {first}"))?;
            for (i, r) in results.into_iter().enumerate() {
                if let Err(e) = r {
                    bail!("input row {}: {e}", first + i as u64);
                }
            }
            self.pending.clear();
        }
        self.first = read + 1;
        Ok(())
    }

    /// `load` of CSV from `file`; returns the rows loaded.
    async fn csv(&mut self, file: std::fs::File) -> anyhow::Result<u64> {
        let path = self.path.display();
        let total = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .from_reader(file);
        let names: Vec<String> = reader
            .headers()
            .with_context(|| format!("reading the header line of {path}"))?
            .iter()
            .map(|s| s.trim().to_string())
            .collect();
        let map = ColumnMap::new(self.schema, &names)?;
        let progress = bar(total, "bytes");
        let mut n = 0u64;
        for record in reader.records() {
            let record = record.with_context(|| format!("{path} row {}", n + 1))?;
            n += 1;
            let fields: Vec<&str> = map
                .sources()
                .iter()
                .map(|at| at.and_then(|i| record.get(i)).unwrap_or(""))
                .collect();
            let row =
                row_from_fields(self.schema, &fields).with_context(|| format!("{path} row {n}"))?;
            self.pending.push(row);
            if self.pending.len() >= self.batch {
                self.flush(n).await?;
                progress.set_position(record.position().map(|p| p.byte()).unwrap_or(0));
            }
        }
        self.flush(n).await?;
        progress.finish_and_clear();
        Ok(n)
    }

    /// `load` of Parquet from `file`; returns the rows loaded. Every call
    /// into the Parquet reader goes through `parquet_step`: it panics on
    /// some damaged files.
    async fn parquet(&mut self, file: std::fs::File) -> anyhow::Result<u64> {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let path = self.path.display().to_string();
        let batch = self.batch;
        let (rows_total, map, mut reader) = parquet_step(&path, || {
            let builder = ParquetRecordBatchReaderBuilder::try_new(file)
                .with_context(|| format!("{path} is not a Parquet file"))?;
            let rows_total = builder.metadata().file_metadata().num_rows().max(0) as u64;
            let map = ColumnMap::of_arrow(self.schema, builder.schema())?;
            let reader = builder
                .with_batch_size(batch)
                .build()
                .with_context(|| format!("reading {path}"))?;
            Ok((rows_total, map, reader))
        })?;
        let progress = bar(rows_total, "rows");
        let mut n = 0u64;
        while let Some(b) = parquet_step(&path, || {
            reader
                .next()
                .transpose()
                .map_err(|e| anyhow::Error::from(e).context(format!("reading {path}")))
        })? {
            self.pending.extend(map.batch_rows(&b, n + 1)?);
            n += b.num_rows() as u64;
            self.flush(n).await?;
            progress.set_position(n);
        }
        progress.finish_and_clear();
        Ok(n)
    }
}

/// Run one step of the Parquet reader with a panic turned into an error
/// naming the file (`insitu_rows::guard`). Why: the Parquet crate (and the
/// Arrow IPC reader it uses for the schema it embeds) panics on some damaged
/// files instead of returning an error: of 20,000 random byte changes to a
/// small valid file, 6 panicked ("column start and length should not be
/// negative", ...). A user whose file is damaged gets a clear error, not a
/// crash report.
fn parquet_step<T>(path: &str, step: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let mut failed = None;
    let what = format!("{path} is damaged or not a Parquet file this reader can read");
    let outcome = insitu_rows::guard::guarded(&what, || {
        step().map_err(|e| {
            failed = Some(e);
            String::new()
        })
    });
    match (outcome, failed) {
        (Ok(v), _) => Ok(v),
        (Err(_), Some(e)) => Err(e),
        (Err(panicked), None) => bail!("{panicked}"),
    }
}

/// The aggregate of `agg FUNC COLUMN` on a typed table.
fn agg_spec(schema: &Schema, func: &str, column: &str) -> anyhow::Result<AggSpec> {
    let func = match func {
        "sum" => AggFunc::Sum,
        "min" => AggFunc::Min,
        "max" => AggFunc::Max,
        "avg" => AggFunc::Avg,
        "count" => AggFunc::Count,
        other => bail!("unknown aggregate {other:?}: use sum, min, max, avg or count"),
    };
    Ok(AggSpec {
        func,
        arg: vec![ValueOp::Col(column_of(schema, column)?)],
    })
}

/// The index of column `name`, or an error listing the table's columns.
fn column_of(schema: &Schema, name: &str) -> anyhow::Result<u16> {
    let Some(col) = schema.column_index(name) else {
        bail!(
            "the table has no column {name:?} (columns: {})",
            schema
                .columns
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    Ok(col as u16)
}

/// `insitu update TABLE COLUMN --set V | --add N [--where]` on a typed
/// table: `--set` text is read as the column's type (`NULL` for NULL);
/// `--add` takes a whole number for integer columns (days for a date
/// column), a number with at most the column's digits after the point for a
/// decimal, any number for a float.
pub async fn update(
    client: &Client,
    t: Typed<'_>,
    column: &str,
    (add, set): (Option<&str>, Option<&str>),
    filter: &Option<String>,
) -> anyhow::Result<()> {
    use insitu_protocol::plan::RowAction;
    use insitu_protocol::query::Scalar;
    use insitu_protocol::schema::ColumnType;
    let col = column_of(t.schema, column)?;
    let c = &t.schema.columns[col as usize];
    let action = match (add, set) {
        (None, Some(text)) if text.trim().eq_ignore_ascii_case("null") => {
            RowAction::Set(Scalar::Null)
        }
        (None, Some(text)) => RowAction::Set(
            insitu_rows::text::parse_value(Some(text), c)
                .map_err(|e| anyhow::anyhow!("bad --set: {e}"))?,
        ),
        (Some(text), None) => {
            let t = text.trim();
            let number = |what: &str| anyhow::anyhow!("bad --add {text:?}: not {what}");
            RowAction::Add(match c.ty {
                ColumnType::Int32 | ColumnType::Int64 | ColumnType::Date32 => {
                    Scalar::Int(t.parse().map_err(|_| number("a whole number"))?)
                }
                ColumnType::Float64 => Scalar::Float(t.parse().map_err(|_| number("a number"))?),
                ColumnType::Decimal { .. } => insitu_rows::text::parse_value(Some(t), c)
                    .map_err(|e| anyhow::anyhow!("bad --add: {e}"))?,
                // Refused with the reason by the update's own check below.
                ColumnType::Utf8 | ColumnType::Bool => Scalar::Str(text.to_string()),
            })
        }
        _ => bail!("give --add X or --set X"),
    };
    let filter = parse_filter(t.schema, filter)?;
    let started = Instant::now();
    let n = client
        .update_rows(t.id, t.schema, filter, vec![(col, action)])
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    crate::outln!("updated {n} rows")?;
    eprintln!("({:.1} ms)", started.elapsed().as_secs_f64() * 1e3);
    Ok(())
}

fn parse_filter(
    schema: &Schema,
    filter: &Option<String>,
) -> anyhow::Result<Vec<insitu_protocol::query::Pred>> {
    match filter {
        None => Ok(Vec::new()),
        Some(f) => insitu_query::parse_where(schema, f)
            .map_err(|e| anyhow::anyhow!("bad --where expression {f:?}: {e}")),
    }
}

/// A typed table as `count` and `agg` need it.
#[derive(Clone, Copy)]
pub struct Typed<'a> {
    pub id: u64,
    pub schema: &'a Schema,
    /// Columns with a secondary index: a `--where` that pins one probes it.
    pub indexes: &'a [u16],
}

/// `count` / `agg` on a typed table: one aggregate, no groups, read at one
/// snapshot as `at` says; prints its value.
pub async fn aggregate(
    client: &Client,
    t: Typed<'_>,
    spec: AggSpec,
    (filter, at): (&Option<String>, AtSnapshot),
) -> anyhow::Result<()> {
    let (table, schema) = (t.id, t.schema);
    let filter = parse_filter(schema, filter)?;
    let probe = insitu_sql::probe::choose_preds(&insitu_sql::probe::conjuncts(&filter), t.indexes);
    let plan = QueryPlan {
        filter,
        output: QueryOutput::Aggregate {
            group_by: Vec::new(),
            aggs: vec![spec],
        },
    };
    let started = Instant::now();
    let out = client
        .query_snapshot(table, &plan, probe.as_ref(), at)
        .await?;
    let QueryAnswer::Groups(groups) = &out.answer else {
        bail!("the servers answered an aggregate with rows");
    };
    let batch = insitu_query::finalize_groups(schema, &plan, groups)?;
    let value = if batch.num_rows() == 0 {
        "NULL".to_string()
    } else {
        arrow_cast::display::array_value_to_string(batch.column(0), 0)?
    };
    crate::outln!("{value}")?;
    let at = match out.snapshot_ts {
        0 => String::new(),
        ts => format!(" at snapshot {ts}"),
    };
    eprintln!(
        "({} rows matched of {} on {} tablets{at}, {:.1} ms)",
        out.matched,
        out.visited,
        out.tablets,
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// `insitu count TABLE [--where]` on a typed table.
pub async fn count(
    client: &Client,
    table: Typed<'_>,
    filter: &Option<String>,
    at: AtSnapshot,
) -> anyhow::Result<()> {
    let spec = AggSpec {
        func: AggFunc::CountStar,
        arg: Vec::new(),
    };
    aggregate(client, table, spec, (filter, at)).await
}

/// `insitu agg TABLE FUNC COLUMN [--where]` on a typed table.
pub async fn agg(
    client: &Client,
    table: Typed<'_>,
    func: &str,
    column: &str,
    (filter, at): (&Option<String>, AtSnapshot),
) -> anyhow::Result<()> {
    let spec = agg_spec(table.schema, func, column)?;
    aggregate(client, table, spec, (filter, at)).await
}
