//! Aggregate pushdown: a logical optimizer rule that replaces
//! `Aggregate(group by columns; count/sum/min/max/avg)` directly over an
//! insitu table scan (with its pushed filters, through projections) by an
//! [`InsituAggregateNode`], which asks the servers for merged per-group
//! partials and finishes them into exactly the values and types DataFusion's
//! own Aggregate would produce. When any part does not fit, the rule leaves
//! the plan alone and DataFusion aggregates the scanned rows itself.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow_schema::DataType;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{Column, DFSchemaRef, Result};
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{
    Aggregate, Expr, Extension, LogicalPlan, TableScan, UserDefinedLogicalNodeCore,
};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use insitu_protocol::query::{AggFunc, AggSpec, QueryOutput, QueryPlan};
use insitu_protocol::schema::ColumnType;

use crate::provider::InsituTable;
use crate::source::TableSource;
use crate::translate::{filters_to_preds, value_program};
use insitu_rows::arrow::arrow_type;

/// How one output column is finished from the merged partials.
#[derive(Clone, Debug, PartialEq)]
pub enum Finish {
    /// Group key number `i` (a column of type `ty`).
    Key(usize, ColumnType),
    /// `count(*)` / `count(x)`: the state's count, as Int64.
    Count(usize),
    /// `sum`: NULL on no rows; exact sums are at `scale` and rescaled to
    /// the output type's scale.
    Sum {
        agg: usize,
        scale: Option<u8>,
    },
    /// `avg`: sum / count (decimal: truncated like DataFusion's).
    Avg {
        agg: usize,
        scale: Option<u8>,
    },
    /// `min` / `max` of a bare column of type `ty`.
    Min(usize, ColumnType),
    Max(usize, ColumnType),
}

/// The pushed-down aggregate: one plan for all tablets and the recipe for
/// each output column.
#[derive(Clone, Debug)]
pub struct InsituAggregateNode {
    /// Where the plan runs.
    pub source: Arc<dyn TableSource>,
    /// An `Aggregate` plan (filter, group-by columns, partial aggregates).
    pub plan: QueryPlan,
    /// The secondary index each tablet finds its candidate rows with.
    pub probe: Option<insitu_protocol::query::IndexProbe>,
    /// Output column recipes, in output order.
    pub finish: Vec<Finish>,
    /// The replaced Aggregate's schema, kept exactly.
    pub schema: DFSchemaRef,
    /// The pushed filters and aggregates as SQL text, for EXPLAIN.
    pub text: String,
}

impl InsituAggregateNode {
    /// Identity for Eq/Hash/Ord: the table and what is asked of it.
    fn identity(&self) -> String {
        format!(
            "{} {:?} {:?} {:?}",
            self.source.name(),
            self.plan,
            self.probe,
            self.finish
        )
    }
}

impl PartialEq for InsituAggregateNode {
    fn eq(&self, other: &Self) -> bool {
        self.identity() == other.identity() && self.schema == other.schema
    }
}

impl Eq for InsituAggregateNode {}

impl PartialOrd for InsituAggregateNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.identity().cmp(&other.identity()))
    }
}

impl Hash for InsituAggregateNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.identity().hash(state);
    }
}

impl UserDefinedLogicalNodeCore for InsituAggregateNode {
    fn name(&self) -> &str {
        "InsituAggregate"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "InsituAggregate: table={}, {}",
            self.source.name(),
            self.text
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, _inputs: Vec<LogicalPlan>) -> Result<Self> {
        Ok(self.clone())
    }
}

/// The optimizer rule (see the module comment).
#[derive(Debug, Default)]
pub struct AggregatePushdown;

impl OptimizerRule for AggregatePushdown {
    fn name(&self) -> &str {
        "insitu_aggregate_pushdown"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(agg) = &plan else {
            return Ok(Transformed::no(plan));
        };
        match pushdown(agg) {
            Some(node) => Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                node: Arc::new(node),
            }))),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// The node replacing `agg`, or None when it cannot be pushed exactly.
fn pushdown(agg: &Aggregate) -> Option<InsituAggregateNode> {
    // Walk down through projections to the scan, remembering them to
    // rewrite the aggregate's expressions in terms of the table's columns.
    let mut projections = vec![];
    let mut input = agg.input.as_ref();
    let scan: &TableScan = loop {
        match input {
            LogicalPlan::Projection(p) => {
                projections.push(p);
                input = p.input.as_ref();
            }
            LogicalPlan::TableScan(s) => break s,
            _ => return None,
        }
    };
    if scan.fetch.is_some() {
        return None;
    }
    let provider = source_as_provider(&scan.source).ok()?;
    let table = provider.downcast_ref::<InsituTable>()?;
    let source = table.source().clone();
    let schema = source.schema();
    let filter = filters_to_preds(&scan.filters, schema).ok()?;

    let to_table = |e: &Expr| -> Option<Expr> {
        let mut e = e.clone();
        for p in &projections {
            e = substitute(e, p.schema.as_ref(), &p.expr)?;
        }
        Some(e)
    };

    let out_fields = agg.schema.fields();
    let mut group_by = vec![];
    let mut finish = vec![];
    for (i, g) in agg.group_expr.iter().enumerate() {
        let Expr::Column(c) = to_table(g)?.unalias_nested().data else {
            return None;
        };
        let idx = schema.column_index(&c.name)?;
        let ty = schema.columns[idx].ty;
        if out_fields.get(i)?.data_type() != &arrow_type(ty) {
            return None;
        }
        group_by.push(idx as u16);
        finish.push(Finish::Key(i, ty));
    }
    let mut aggs = vec![];
    for (j, a) in agg.aggr_expr.iter().enumerate() {
        let out_type = out_fields.get(agg.group_expr.len() + j)?.data_type();
        let Expr::AggregateFunction(f) = to_table(a)?.unalias_nested().data else {
            return None;
        };
        let (spec, fin) = agg_spec(&f, aggs.len(), out_type, schema)?;
        aggs.push(spec);
        finish.push(fin);
    }
    let text = format!(
        "group_by=[{}], aggs=[{}]{}",
        agg.group_expr
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        agg.aggr_expr
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        if scan.filters.is_empty() {
            String::new()
        } else {
            format!(
                ", pushed_filter=[{}]",
                scan.filters
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join(" AND ")
            )
        }
    );
    let probe = crate::probe::choose(&scan.filters, schema, source.indexes());
    let text = match &probe {
        Some(p) => format!("{text}, index=[{}]", crate::probe::describe(p, schema)),
        None => text,
    };
    Some(InsituAggregateNode {
        source,
        plan: QueryPlan {
            filter,
            output: QueryOutput::Aggregate { group_by, aggs },
        },
        probe,
        finish,
        schema: agg.schema.clone(),
        text,
    })
}

/// `e` with every column of a projection's output replaced by the
/// projection's expression for it.
fn substitute(e: Expr, schema: &datafusion::common::DFSchema, exprs: &[Expr]) -> Option<Expr> {
    let mut map: HashMap<Column, Expr> = HashMap::new();
    for (i, x) in exprs.iter().enumerate() {
        let (q, f) = schema.qualified_field(i);
        map.insert(Column::from((q, f)), x.clone().unalias_nested().data);
    }
    e.transform(|x| match &x {
        Expr::Column(c) => match map.get(c) {
            Some(r) => Ok(Transformed::yes(r.clone())),
            None => Ok(Transformed::no(x)),
        },
        _ => Ok(Transformed::no(x)),
    })
    .data()
    .ok()
}

/// One aggregate function as a partial spec and its finishing recipe, when
/// the result is exactly DataFusion's.
fn agg_spec(
    f: &AggregateFunction,
    n: usize,
    out: &DataType,
    schema: &insitu_protocol::schema::Schema,
) -> Option<(AggSpec, Finish)> {
    let p = &f.params;
    if p.distinct || p.filter.is_some() || !p.order_by.is_empty() || p.null_treatment.is_some() {
        return None;
    }
    let name = f.func.name().to_ascii_lowercase();
    let [arg] = p.args.as_slice() else {
        return None;
    };
    if name == "count" {
        if *out != DataType::Int64 {
            return None;
        }
        // count(*) is planned as count(<non-NULL literal>).
        if let Expr::Literal(v, _) = arg {
            if v.is_null() {
                return None;
            }
            let spec = AggSpec {
                func: AggFunc::CountStar,
                arg: vec![],
            };
            return Some((spec, Finish::Count(n)));
        }
        let prog = value_program(arg, schema).ok()?;
        let spec = AggSpec {
            func: AggFunc::Count,
            arg: prog.ops,
        };
        return Some((spec, Finish::Count(n)));
    }
    if name == "min" || name == "max" {
        // Bare columns only: their value and type are the output's.
        let prog = value_program(arg, schema).ok()?;
        let ty = prog.column?;
        if !matches!(arg, Expr::Column(_)) || *out != arrow_type(ty) {
            return None;
        }
        let (func, fin) = if name == "min" {
            (AggFunc::Min, Finish::Min(n, ty))
        } else {
            (AggFunc::Max, Finish::Max(n, ty))
        };
        return Some((
            AggSpec {
                func,
                arg: prog.ops,
            },
            fin,
        ));
    }
    if name == "sum" {
        let prog = value_program(arg, schema).ok()?;
        let float_ok = prog.column.is_none_or(|t| t == ColumnType::Float64);
        let ok = match (prog.scale, out) {
            (Some(0), DataType::Int64) => prog.integer,
            (Some(s), DataType::Decimal128(_, t)) => !prog.integer && *t >= 0 && s <= *t as u8,
            (None, DataType::Float64) => float_ok,
            _ => false,
        };
        if !ok {
            return None;
        }
        let spec = AggSpec {
            func: AggFunc::Sum,
            arg: prog.ops,
        };
        return Some((
            spec,
            Finish::Sum {
                agg: n,
                scale: prog.scale,
            },
        ));
    }
    if name == "avg" {
        // DataFusion averages integers as floats: `avg(CAST(x AS Float64))`.
        let inner = match arg {
            Expr::Cast(c) if c.field.data_type() == &DataType::Float64 => c.expr.as_ref(),
            other => other,
        };
        let prog = value_program(inner, schema).ok()?;
        let ok = match (prog.scale, out) {
            (Some(0), DataType::Float64) => prog.integer,
            (Some(s), DataType::Decimal128(_, t)) => {
                !prog.integer && *t >= 0 && s <= *t as u8 && std::ptr::eq(inner, arg)
            }
            (None, DataType::Float64) => prog.column.is_none_or(|t| t == ColumnType::Float64),
            _ => false,
        };
        if !ok {
            return None;
        }
        let spec = AggSpec {
            func: AggFunc::Avg,
            arg: prog.ops,
        };
        return Some((
            spec,
            Finish::Avg {
                agg: n,
                scale: prog.scale,
            },
        ));
    }
    None
}
