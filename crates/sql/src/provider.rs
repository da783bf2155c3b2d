//! `InsituTable`: DataFusion's view of a typed insitu table. Filters the
//! servers evaluate exactly are pushed down (`Exact`, so DataFusion drops
//! them from its own plan), along with the projection and the limit.

use std::sync::Arc;

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use insitu_protocol::plan::MAX_PRED_OPS;
use insitu_protocol::query::{QueryOutput, QueryPlan};

use crate::exec::InsituScanExec;
use crate::source::{TableSource, arrow_schema};
use crate::translate::{filter_to_preds, filters_to_preds};
use crate::write_exec::{Dml, WriteExec};

/// A typed insitu table registered with DataFusion.
#[derive(Debug)]
pub struct InsituTable {
    /// The cluster side of the table.
    source: Arc<dyn TableSource>,
    /// `arrow_schema(source.schema())`, computed once.
    schema: SchemaRef,
}

impl InsituTable {
    pub fn new(source: Arc<dyn TableSource>) -> Self {
        let schema = arrow_schema(source.schema());
        Self { source, schema }
    }

    /// The cluster side of the table.
    pub fn source(&self) -> &Arc<dyn TableSource> {
        &self.source
    }
}

#[async_trait]
impl TableProvider for InsituTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // Every filter pushed joins one program (ANDed); keep the whole
        // program within the servers' limit: once it would overflow, the
        // remaining filters stay in DataFusion.
        let mut steps = 0usize;
        Ok(filters
            .iter()
            .map(|f| match filter_to_preds(f, self.source.schema()) {
                Ok(p) if steps + p.len() < MAX_PRED_OPS => {
                    steps += p.len() + 1;
                    TableProviderFilterPushDown::Exact
                }
                _ => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    /// `UPDATE .. SET .. WHERE ..`, run by the servers (`update.rs`): every
    /// assignment and every WHERE conjunct must translate exactly, else the
    /// statement is refused with the reason (nothing is read out and
    /// written back by the client).
    async fn update(
        &self,
        _state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = self.source.schema();
        let refused =
            |e: String| DataFusionError::Plan(format!("UPDATE {}: {e}", self.source.name()));
        let set = crate::update::assignments_to_set(&assignments, schema).map_err(refused)?;
        let filter = filters_to_preds(&filters, schema).map_err(|e| {
            refused(format!(
                "the servers cannot evaluate this WHERE clause exactly ({e})"
            ))
        })?;
        let mut text: Vec<String> = assignments
            .iter()
            .map(|(n, e)| format!("{n} = {e}"))
            .collect();
        text.sort();
        let text = format!("set=[{}]{}", text.join(", "), filter_text(&filters));
        Ok(Arc::new(WriteExec::new(
            self.source.clone(),
            filter,
            Dml::Update(set),
            text,
        )))
    }

    /// `DELETE FROM .. WHERE ..`, run by the servers: every WHERE conjunct
    /// must translate exactly, else the statement is refused.
    async fn delete_from(
        &self,
        _state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let filter = filters_to_preds(&filters, self.source.schema()).map_err(|e| {
            DataFusionError::Plan(format!(
                "DELETE {}: the servers cannot evaluate this WHERE clause exactly ({e})",
                self.source.name()
            ))
        })?;
        let text = match filter_text(&filters) {
            f if f.is_empty() => "all rows".to_string(),
            f => f.trim_start_matches(", ").to_string(),
        };
        Ok(Arc::new(WriteExec::new(
            self.source.clone(),
            filter,
            Dml::Delete,
            text,
        )))
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = self.source.schema();
        let filter = filters_to_preds(filters, schema).map_err(|e| {
            DataFusionError::Plan(format!(
                "a filter accepted for table {} no longer translates: {e}",
                self.source.name()
            ))
        })?;
        let all: Vec<usize> = (0..schema.columns.len()).collect();
        let wanted = projection.unwrap_or(&all);
        // With no column wanted (count(*)), ask for the first key column and
        // drop it: the row count is what matters.
        let drop_columns = wanted.is_empty();
        let asked: Vec<u16> = if drop_columns {
            vec![*schema.key.first().ok_or_else(|| {
                DataFusionError::Plan(format!("table {} has no key", self.source.name()))
            })?]
        } else {
            wanted.iter().map(|&i| i as u16).collect()
        };
        let out_schema = Arc::new(self.schema.project(wanted)?);
        let plan = QueryPlan {
            filter,
            output: QueryOutput::Rows {
                columns: asked.clone(),
                order_by: vec![],
                limit: limit.map(|l| l as u64),
            },
        };
        let names = asked
            .iter()
            .map(|&i| schema.columns[i as usize].name.clone())
            .collect();
        let probe = crate::probe::choose(filters, schema, self.source.indexes());
        Ok(Arc::new(InsituScanExec::new(
            self.source.clone(),
            (plan, probe),
            out_schema,
            drop_columns,
            limit,
            filters.iter().map(|f| f.to_string()).collect(),
            names,
        )))
    }
}

/// `, filter=[a AND b]` for EXPLAIN, or nothing without filters.
fn filter_text(filters: &[Expr]) -> String {
    if filters.is_empty() {
        return String::new();
    }
    let f: Vec<String> = filters.iter().map(|f| f.to_string()).collect();
    format!(", filter=[{}]", f.join(" AND "))
}
