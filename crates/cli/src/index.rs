//! `insitu index create|drop|list`: secondary indexes of typed tables.
//!
//! `create` declares the index at the coordinator, then has every tablet
//! build it at once (a probe of it), so the first query does not pay for
//! the build.

use std::time::Instant;

use anyhow::Context;
use clap::Subcommand;
use insitu_protocol::query::{AggFunc, AggSpec, IndexProbe, QueryOutput, QueryPlan, Scalar};
use insitu_protocol::schema::ColumnType;

use crate::ClusterArg;

#[derive(Subcommand)]
pub enum IndexCmd {
    /// Index COLUMN of typed table TABLE: queries with `COLUMN = v`, `COLUMN IN (...)` or a
    /// range bounded on both sides find their rows through it instead of scanning (see
    /// `EXPLAIN` in `insitu sql`). Kept up to date on every write; built now on every tablet.
    Create { table: String, column: String },
    /// Remove the index on COLUMN of TABLE.
    Drop { table: String, column: String },
    /// List the indexed columns of every typed table.
    List,
}

pub fn run(cmd: IndexCmd, cluster: &ClusterArg) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(async {
        let client = crate::data::connect(cluster).await?;
        match cmd {
            IndexCmd::Create { table, column } => {
                client.set_index(&table, &column, true).await?;
                let info = client.open_table(&table).await?;
                let schema = info.schema.context("a typed table has a schema")?;
                let col = schema
                    .columns
                    .iter()
                    .position(|c| c.name == column)
                    .context("the coordinator accepted the column")?;
                // Any value of the column's type: the probe builds the index.
                let value = match schema.columns[col].ty {
                    ColumnType::Utf8 => Scalar::Str(String::new()),
                    ColumnType::Date32 => Scalar::Date(0),
                    ColumnType::Bool => Scalar::Bool(false),
                    _ => Scalar::Int(0),
                };
                let probe = IndexProbe::Eq {
                    col: col as u16,
                    values: vec![value],
                };
                let plan = QueryPlan {
                    filter: Vec::new(),
                    output: QueryOutput::Aggregate {
                        group_by: Vec::new(),
                        aggs: vec![AggSpec {
                            func: AggFunc::CountStar,
                            arg: Vec::new(),
                        }],
                    },
                };
                let started = Instant::now();
                let out = client
                    .query_with(info.id, &plan, Some(&probe))
                    .await
                    .context("building the index")?;
                crate::outln!(
                    "created index on {table}.{column} (built on {} tablets in {:.0} ms)",
                    out.tablets,
                    started.elapsed().as_secs_f64() * 1e3
                )?;
            }
            IndexCmd::Drop { table, column } => {
                client.set_index(&table, &column, false).await?;
                crate::outln!("dropped index on {table}.{column}")?;
            }
            IndexCmd::List => {
                let mut any = false;
                for t in client.list_tables().await? {
                    let Some(schema) = &t.schema else { continue };
                    for &c in &t.indexes {
                        let name = schema.columns.get(c as usize).map_or("?", |c| &c.name);
                        crate::outln!("{}\t{name}", t.name)?;
                        any = true;
                    }
                }
                if !any {
                    crate::outln!("no indexes")?;
                }
            }
        }
        Ok(())
    })
}
