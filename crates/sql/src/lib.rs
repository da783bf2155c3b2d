//! SQL on typed insitu tables, with Apache DataFusion.
//!
//! A query is parsed and planned by DataFusion over [`InsituTable`]s; their
//! scans push the filters the servers evaluate exactly, the projection and
//! the limit into one `QueryPlan` per table, run on every tablet through a
//! [`TableSource`]; `ORDER BY .. LIMIT k` becomes a per-tablet top-k
//! (`topk.rs`) and aggregates per-tablet partial aggregates
//! (`aggregate.rs`). Joins, sorts and everything else run in DataFusion on
//! the client. `UPDATE` and `DELETE` run on the servers (`update.rs`, `write_exec.rs`).

pub mod aggregate;
pub mod aggregate_exec;
pub mod cluster;
pub mod exec;
pub mod format;
mod leaf;
pub mod probe;
pub mod provider;
pub mod shell;
pub mod source;
pub mod statement;
pub mod topk;
pub mod translate;
pub mod update;
pub mod write_exec;

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

/// The DataFusion this crate is built on (for callers that register their own tables).
pub use datafusion;
pub use format::{Format, write_batches};
pub use provider::InsituTable;
pub use source::{TableSource, arrow_schema};

/// Why a SQL statement failed.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    /// The text is not SQL DataFusion parses.
    #[error("SQL syntax error: {0}")]
    Syntax(String),
    /// Unknown table or column, wrong types, unsupported construct.
    #[error("SQL planning error: {0}")]
    Plan(String),
    /// The query failed while running (including on the servers).
    #[error("query failed: {0}")]
    Execution(String),
}

/// A DataFusion session with one table per source (named by the source),
/// the aggregate pushdown rule and its planner, and the top-k pushdown rule.
///
/// Decimal literals: `0.05` is read as DECIMAL(2,2), as in the SQL standard
/// (and DuckDB), not as a float, so that comparing a decimal column with it
/// stays exact (and can be pushed to the servers).
pub async fn context(tables: Vec<Arc<dyn TableSource>>) -> Result<SessionContext, SqlError> {
    let state = SessionStateBuilder::new()
        .with_config(config())
        .with_default_features()
        .with_optimizer_rule(Arc::new(aggregate::AggregatePushdown))
        .with_physical_optimizer_rule(Arc::new(topk::TopKPushdown))
        .with_query_planner(Arc::new(aggregate_exec::InsituQueryPlanner))
        .build();
    let ctx = SessionContext::new_with_state(state);
    for t in tables {
        let name = t.name().to_string();
        ctx.register_table(name.as_str(), Arc::new(InsituTable::new(t)))
            .map_err(|e| SqlError::Plan(format!("registering table {name}: {e}")))?;
    }
    Ok(ctx)
}

/// The session settings every insitu SQL session uses (see `context`).
fn config() -> SessionConfig {
    let mut config = SessionConfig::new();
    config.options_mut().sql_parser.parse_float_as_decimal = true;
    config
}

/// A session with insitu's SQL settings but no insitu tables: the same SQL
/// with the same meaning over data already in this process (the benchmarks'
/// "read everything, then query on the client" side).
pub fn local_context() -> SessionContext {
    SessionContext::new_with_config(config())
}

/// Run one SQL statement; its result schema and batches.
pub async fn query(
    ctx: &SessionContext,
    sql: &str,
) -> Result<(SchemaRef, Vec<RecordBatch>), SqlError> {
    let df = ctx.sql(sql).await.map_err(classify)?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    // A statement refused while DataFusion plans it physically (an UPDATE
    // the servers cannot apply exactly, say) is a planning error, not a
    // failure of the query's run: `classify` tells them apart.
    let batches = df.collect().await.map_err(classify_run)?;
    Ok((schema, batches))
}

/// Run one SQL statement and collect its result.
pub async fn run_sql(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>, SqlError> {
    query(ctx, sql).await.map(|(_, b)| b)
}

/// DataFusion's message without its backtrace.
fn message(e: &DataFusionError) -> String {
    e.strip_backtrace()
}

/// An error from running a planned statement: a planning refusal met on
/// the way (physical planning happens here) stays one; everything else is
/// a failure of the run.
fn classify_run(e: DataFusionError) -> SqlError {
    match e.find_root() {
        DataFusionError::Plan(_) | DataFusionError::SchemaError(..) => SqlError::Plan(message(&e)),
        _ => SqlError::Execution(message(&e)),
    }
}

/// An error from parsing/planning, sorted by kind.
fn classify(e: DataFusionError) -> SqlError {
    match e.find_root() {
        DataFusionError::SQL(..) => SqlError::Syntax(message(&e)),
        DataFusionError::Execution(_)
        | DataFusionError::External(_)
        | DataFusionError::ArrowError(..) => SqlError::Execution(message(&e)),
        _ => SqlError::Plan(message(&e)),
    }
}
