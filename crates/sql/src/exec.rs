//! The physical scan of an insitu table: at execute time it sends one
//! `Rows` plan (pushed filter, projection, limit, and for a top-k the sort
//! keys: `topk.rs`) to the table's tablets through its `TableSource` and
//! streams the Arrow batches back.

use std::fmt;
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_schema::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;
use insitu_protocol::query::{IndexProbe, QueryOutput, QueryPlan, SortKey};

use crate::source::TableSource;

/// Scan of one insitu table with its pushed-down parts.
#[derive(Debug)]
pub struct InsituScanExec {
    /// Where the plan runs.
    source: Arc<dyn TableSource>,
    /// What every tablet is asked (a `Rows` plan).
    plan: QueryPlan,
    /// The secondary index each tablet finds its candidate rows with.
    probe: Option<IndexProbe>,
    /// The batches' schema as this node outputs it.
    schema: SchemaRef,
    /// The columns asked for are dropped from each batch (only the row
    /// count is wanted, as for `count(*)`): Arrow needs a column to carry
    /// a row count over the wire.
    drop_columns: bool,
    /// Rows to stop after (the servers apply it per tablet, so the merged
    /// stream may hold more).
    limit: Option<usize>,
    /// The pushed filters as SQL text, for EXPLAIN.
    filter_text: Vec<String>,
    /// Names of the columns asked for, for EXPLAIN.
    column_names: Vec<String>,
    /// DataFusion's cached plan properties (one partition, bounded).
    properties: Arc<PlanProperties>,
}

impl InsituScanExec {
    /// A scan running `plan` on `source`, producing batches of `schema`.
    pub fn new(
        source: Arc<dyn TableSource>,
        (plan, probe): (QueryPlan, Option<IndexProbe>),
        schema: SchemaRef,
        drop_columns: bool,
        limit: Option<usize>,
        filter_text: Vec<String>,
        column_names: Vec<String>,
    ) -> Self {
        let properties = crate::leaf::properties(schema.clone(), EmissionType::Incremental);
        Self {
            source,
            plan,
            probe,
            schema,
            drop_columns,
            limit,
            filter_text,
            column_names,
            properties,
        }
    }

    /// The plan sent to the tablets.
    pub fn plan(&self) -> &QueryPlan {
        &self.plan
    }

    /// Where the plan runs.
    pub fn source(&self) -> &Arc<dyn TableSource> {
        &self.source
    }

    /// This scan asking each tablet for only its first `k` rows in the
    /// order `keys` (`topk.rs`); None when this scan's rows are not the
    /// ones a sort above it chooses from: it has a limit or an order
    /// already, or answers only a row count, or `k` is out of range.
    pub fn with_top_k(&self, keys: Vec<SortKey>, k: usize) -> Option<InsituScanExec> {
        let QueryOutput::Rows {
            columns,
            order_by,
            limit,
        } = &self.plan.output
        else {
            return None;
        };
        if self.drop_columns
            || self.limit.is_some()
            || limit.is_some()
            || !order_by.is_empty()
            || keys.is_empty()
            || !crate::topk::k_fits(k)
        {
            return None;
        }
        let plan = QueryPlan {
            filter: self.plan.filter.clone(),
            output: QueryOutput::Rows {
                columns: columns.clone(),
                order_by: keys,
                limit: Some(k as u64),
            },
        };
        Some(InsituScanExec {
            plan,
            limit: Some(k),
            source: self.source.clone(),
            probe: self.probe.clone(),
            schema: self.schema.clone(),
            drop_columns: self.drop_columns,
            filter_text: self.filter_text.clone(),
            column_names: self.column_names.clone(),
            properties: self.properties.clone(),
        })
    }
}

impl DisplayAs for InsituScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "InsituScanExec: table={}, columns=[{}]",
            self.source.name(),
            self.column_names.join(", ")
        )?;
        if self.drop_columns {
            write!(f, " (row count only)")?;
        }
        if !self.filter_text.is_empty() {
            write!(
                f,
                ", pushed_filter=[{}] ({} steps)",
                self.filter_text.join(" AND "),
                self.plan.filter.len()
            )?;
        }
        if let Some(probe) = &self.probe {
            write!(
                f,
                ", index=[{}]",
                crate::probe::describe(probe, self.source.schema())
            )?;
        }
        if let QueryOutput::Rows { order_by, .. } = &self.plan.output
            && !order_by.is_empty()
        {
            let columns = &self.source.schema().columns;
            let keys: Vec<String> = order_by
                .iter()
                .map(|k| {
                    let name = columns.get(k.col as usize).map_or("?", |c| c.name.as_str());
                    let dir = if k.descending { "DESC" } else { "ASC" };
                    let nulls = if k.nulls_first { "FIRST" } else { "LAST" };
                    format!("{name} {dir} NULLS {nulls}")
                })
                .collect();
            write!(f, ", top_k_order=[{}]", keys.join(", "))?;
        }
        if let Some(l) = self.limit {
            write!(f, ", limit={l}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for InsituScanExec {
    crate::leaf::leaf_methods!("InsituScanExec");

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        crate::leaf::one_partition("InsituScanExec", partition)?;
        let schema = self.schema.clone();
        let drop_columns = self.drop_columns;
        let table = self.source.name().to_string();
        let inner = match &self.probe {
            Some(probe) => self.source.rows_probed(self.plan.clone(), probe.clone()),
            None => self.source.rows(self.plan.clone()),
        };
        // State: the servers' stream and the rows still wanted; the stream
        // ends as soon as the limit is reached (no further page is asked).
        let stream = futures::stream::unfold((inner, self.limit), move |(mut inner, left)| {
            let (schema, table) = (schema.clone(), table.clone());
            async move {
                if left == Some(0) {
                    return None;
                }
                let item = inner.next().await?;
                let batch = match item {
                    Err(e) => {
                        let e = DataFusionError::Execution(format!("scan of table {table}: {e}"));
                        return Some((Err(e), (inner, Some(0))));
                    }
                    Ok(b) => b,
                };
                let batch = match conform(&schema, batch, drop_columns) {
                    Err(e) => return Some((Err(e), (inner, Some(0)))),
                    Ok(b) => b,
                };
                let (batch, left) = match left {
                    None => (batch, None),
                    Some(n) => {
                        let take = batch.num_rows().min(n);
                        (batch.slice(0, take), Some(n - take))
                    }
                };
                Some((Ok(batch), (inner, left)))
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}

/// `batch` under this node's schema: the same columns (types checked by
/// Arrow), or none but the row count when `drop_columns`.
fn conform(schema: &SchemaRef, batch: RecordBatch, drop_columns: bool) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let columns = if drop_columns {
        vec![]
    } else {
        batch.columns().to_vec()
    };
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options).map_err(|e| {
        DataFusionError::Execution(format!(
            "a batch from the servers does not fit the expected schema: {e}"
        ))
    })
}
