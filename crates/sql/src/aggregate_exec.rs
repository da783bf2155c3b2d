//! Running a pushed-down aggregate: the physical node (one request for the
//! merged partials, one batch out), the finishing of partial states into
//! DataFusion's output values, and the planner hook that turns an
//! [`InsituAggregateNode`] into that node.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use insitu_protocol::query::{AggState, GroupPartial, QueryOutput, Scalar};

use crate::aggregate::{Finish, InsituAggregateNode};

/// The physical form of [`InsituAggregateNode`].
#[derive(Debug)]
pub struct InsituAggregateExec {
    /// The logical node: source, plan, recipes.
    node: InsituAggregateNode,
    /// The output schema (the replaced Aggregate's).
    schema: SchemaRef,
    /// DataFusion's cached plan properties (one partition, bounded).
    properties: Arc<PlanProperties>,
}

impl InsituAggregateExec {
    pub fn new(node: InsituAggregateNode) -> Self {
        let schema: SchemaRef = Arc::new(node.schema.as_arrow().clone());
        let properties = crate::leaf::properties(schema.clone(), EmissionType::Final);
        Self {
            node,
            schema,
            properties,
        }
    }
}

impl DisplayAs for InsituAggregateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "InsituAggregateExec: table={}, {}",
            self.node.source.name(),
            self.node.text
        )
    }
}

impl ExecutionPlan for InsituAggregateExec {
    crate::leaf::leaf_methods!("InsituAggregateExec");

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        crate::leaf::one_partition("InsituAggregateExec", partition)?;
        let fut = match &self.node.probe {
            Some(probe) => self
                .node
                .source
                .aggregate_probed(self.node.plan.clone(), probe.clone()),
            None => self.node.source.aggregate(self.node.plan.clone()),
        };
        let (schema, finish) = (self.schema.clone(), self.node.finish.clone());
        let table = self.node.source.name().to_string();
        let n_keys = match &self.node.plan.output {
            QueryOutput::Aggregate { group_by, .. } => group_by.len(),
            QueryOutput::Rows { .. } => 0,
        };
        let stream = futures::stream::once(async move {
            let groups = fut.await.map_err(|e| {
                DataFusionError::Execution(format!("aggregate on table {table}: {e}"))
            })?;
            finish_batch(&schema, &finish, n_keys, groups)
                .map_err(|e| DataFusionError::Execution(format!("aggregate on table {table}: {e}")))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}

/// One batch of the final values of every group.
pub fn finish_batch(
    schema: &SchemaRef,
    finish: &[Finish],
    n_keys: usize,
    mut groups: Vec<GroupPartial>,
) -> Result<RecordBatch, String> {
    let n_aggs = finish.len() - n_keys;
    if groups.is_empty() && n_keys == 0 {
        // No GROUP BY: one row even over no rows (count 0, others NULL).
        groups.push(GroupPartial {
            key: vec![],
            states: (0..n_aggs).map(|_| AggState::empty()).collect(),
        });
    }
    for g in &groups {
        if g.key.len() != n_keys || g.states.len() != n_aggs {
            return Err(format!(
                "a group with {} keys and {} states, expected {n_keys} and {n_aggs}",
                g.key.len(),
                g.states.len()
            ));
        }
    }
    let mut columns = Vec::with_capacity(finish.len());
    for (f, field) in finish.iter().zip(schema.fields()) {
        let dt = field.data_type();
        let values = groups
            .iter()
            .map(|g| final_value(f, g, dt))
            .collect::<Result<Vec<_>, String>>()?;
        let array = if values.is_empty() {
            arrow_array::new_empty_array(dt)
        } else {
            ScalarValue::iter_to_array(values).map_err(|e| e.to_string())?
        };
        columns.push(array);
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

/// One output value of one group.
fn final_value(f: &Finish, g: &GroupPartial, dt: &DataType) -> Result<ScalarValue, String> {
    let state = |i: usize| &g.states[i];
    match f {
        Finish::Key(i, _) => scalar_value(&g.key[*i], dt),
        Finish::Count(a) => Ok(ScalarValue::Int64(Some(
            i64::try_from(state(*a).count).map_err(|_| "count overflows int64")?,
        ))),
        Finish::Min(a, _) => scalar_value(&state(*a).min, dt),
        Finish::Max(a, _) => scalar_value(&state(*a).max, dt),
        Finish::Sum { agg, scale } => {
            let st = state(*agg);
            if st.count == 0 {
                return null_of(dt);
            }
            match (scale, dt) {
                (Some(_), DataType::Int64) => Ok(ScalarValue::Int64(Some(
                    i64::try_from(st.sum_int).map_err(|_| "sum overflows int64")?,
                ))),
                (Some(s), DataType::Decimal128(p, t)) => {
                    let v = rescale_up(st.sum_int, *s, *t)?;
                    decimal(v, *p, *t)
                }
                (None, DataType::Float64) => Ok(ScalarValue::Float64(Some(st.sum_float))),
                _ => Err(format!("sum as {dt}")),
            }
        }
        Finish::Avg { agg, scale } => {
            let st = state(*agg);
            if st.count == 0 {
                return null_of(dt);
            }
            let count = st.count as i128;
            match (scale, dt) {
                (Some(_), DataType::Float64) => Ok(ScalarValue::Float64(Some(
                    st.sum_int as f64 / st.count as f64,
                ))),
                (None, DataType::Float64) => {
                    Ok(ScalarValue::Float64(Some(st.sum_float / st.count as f64)))
                }
                (Some(s), DataType::Decimal128(p, t)) => {
                    // DataFusion: sum scaled to the output scale, then
                    // divided by the count, truncating toward zero.
                    let v = rescale_up(st.sum_int, *s, *t)? / count;
                    decimal(v, *p, *t)
                }
                _ => Err(format!("avg as {dt}")),
            }
        }
    }
}

fn null_of(dt: &DataType) -> Result<ScalarValue, String> {
    ScalarValue::try_from(dt).map_err(|e| e.to_string())
}

/// `v` at scale `from` as the same number at scale `to >= from`.
fn rescale_up(v: i128, from: u8, to: i8) -> Result<i128, String> {
    let up = (to as i32) - (from as i32);
    if up < 0 {
        return Err(format!("scale {from} above the output scale {to}"));
    }
    10i128
        .checked_pow(up as u32)
        .and_then(|m| v.checked_mul(m))
        .ok_or_else(|| "decimal overflow".to_string())
}

fn decimal(v: i128, p: u8, s: i8) -> Result<ScalarValue, String> {
    let limit = 10i128.checked_pow(p as u32).unwrap_or(i128::MAX);
    if v.unsigned_abs() >= limit.unsigned_abs() {
        return Err(format!("{v} overflows decimal({p},{s})"));
    }
    Ok(ScalarValue::Decimal128(Some(v), p, s))
}

/// A value from the servers as DataFusion's scalar of type `dt`.
fn scalar_value(v: &Scalar, dt: &DataType) -> Result<ScalarValue, String> {
    let bad = || format!("the servers returned {v:?} for a {dt} value");
    Ok(match (v, dt) {
        (Scalar::Null, _) => return null_of(dt),
        (Scalar::Int(i), DataType::Int32) => {
            ScalarValue::Int32(Some(i32::try_from(*i).map_err(|_| bad())?))
        }
        (Scalar::Int(i), DataType::Int64) => ScalarValue::Int64(Some(*i)),
        (Scalar::Float(f), DataType::Float64) => ScalarValue::Float64(Some(*f)),
        (Scalar::Decimal { value, scale }, DataType::Decimal128(p, s)) => {
            decimal(rescale_up(*value as i128, *scale, *s)?, *p, *s)?
        }
        (Scalar::Date(d), DataType::Date32) => ScalarValue::Date32(Some(*d)),
        (Scalar::Str(s), DataType::Utf8) => ScalarValue::Utf8(Some(s.clone())),
        (Scalar::Bool(b), DataType::Boolean) => ScalarValue::Boolean(Some(*b)),
        _ => return Err(bad()),
    })
}

/// Plans [`InsituAggregateNode`]s.
#[derive(Debug, Default)]
pub struct InsituExtensionPlanner;

#[async_trait]
impl ExtensionPlanner for InsituExtensionPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        _physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        Ok(node
            .as_any()
            .downcast_ref::<InsituAggregateNode>()
            .map(|n| Arc::new(InsituAggregateExec::new(n.clone())) as Arc<dyn ExecutionPlan>))
    }
}

/// DataFusion's default physical planner plus [`InsituExtensionPlanner`].
#[derive(Debug, Default)]
pub struct InsituQueryPlanner;

#[async_trait]
impl QueryPlanner for InsituQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(InsituExtensionPlanner)])
            .create_physical_plan(logical_plan, session)
            .await
    }
}
