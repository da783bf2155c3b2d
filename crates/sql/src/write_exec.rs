//! The physical `UPDATE` and `DELETE` of an insitu table: the translated
//! statement, run on the servers when the plan is executed (so `EXPLAIN
//! UPDATE ..` / `EXPLAIN DELETE ..` change nothing), answering one row,
//! `count`: the rows written or removed.

use std::fmt;
use std::sync::Arc;

use arrow_array::{RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use insitu_protocol::plan::RowAction;
use insitu_protocol::query::Pred;

use crate::source::TableSource;

/// Which statement.
#[derive(Debug, Clone)]
pub enum Dml {
    /// `UPDATE`: the translated SET.
    Update(Vec<(u16, RowAction)>),
    Delete,
}

/// A translated `UPDATE` or `DELETE`, run by the servers when executed.
#[derive(Debug)]
pub struct WriteExec {
    /// Where it runs.
    source: Arc<dyn TableSource>,
    /// The translated WHERE (ANDed conjuncts).
    filter: Vec<Pred>,
    dml: Dml,
    /// The statement's parts as SQL text, for EXPLAIN.
    text: String,
    /// One column, `count` (UInt64), as DataFusion's DML plans answer.
    schema: SchemaRef,
    /// DataFusion's cached plan properties (one partition, bounded).
    properties: Arc<PlanProperties>,
}

impl WriteExec {
    pub fn new(source: Arc<dyn TableSource>, filter: Vec<Pred>, dml: Dml, text: String) -> Self {
        let schema = Arc::new(ArrowSchema::new(vec![Field::new(
            "count",
            DataType::UInt64,
            false,
        )]));
        let properties = crate::leaf::properties(schema.clone(), EmissionType::Final);
        WriteExec {
            source,
            filter,
            dml,
            text,
            schema,
            properties,
        }
    }

    fn statement(&self) -> &'static str {
        match self.dml {
            Dml::Update(_) => "UPDATE",
            Dml::Delete => "DELETE",
        }
    }
}

impl DisplayAs for WriteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "InsituWriteExec: {} table={}, {} ({} filter steps, run by the servers)",
            self.statement(),
            self.source.name(),
            self.text,
            self.filter.len()
        )
    }
}

impl ExecutionPlan for WriteExec {
    crate::leaf::leaf_methods!("InsituWriteExec");

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        crate::leaf::one_partition("InsituWriteExec", partition)?;
        let run = match &self.dml {
            Dml::Update(set) => self.source.update(self.filter.clone(), set.clone()),
            Dml::Delete => self.source.delete(self.filter.clone()),
        };
        let (schema, table) = (self.schema.clone(), self.source.name().to_string());
        let statement = self.statement();
        let stream = futures::stream::once(async move {
            let n = run.await.map_err(|e| {
                DataFusionError::Execution(format!("{statement} of table {table}: {e}"))
            })?;
            RecordBatch::try_new(schema, vec![Arc::new(UInt64Array::from(vec![n]))])
                .map_err(|e| DataFusionError::Execution(e.to_string()))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}
