//! Top-k pushdown: `ORDER BY ... LIMIT k` over an insitu scan asks each
//! tablet for only its first `k` rows in that order (the servers sort as
//! they scan, keeping `k` rows; the client merges the tablets' lists and
//! cuts them to `k`), instead of every row that passes the filter.
//!
//! A physical optimizer rule, run after DataFusion's own: it finds a
//! `SortExec` with a fetch (DataFusion's TopK) whose input reaches an
//! `InsituScanExec` through operators that keep every row and the schema
//! (repartitioning, cooperative yielding), and gives the
//! scan the sort keys and `k`. The `SortExec` stays: it orders the at most
//! `k` rows that arrive, with DataFusion's own comparison, so the pushed
//! order only has to choose the same rows, not deliver them in order.
//!
//! Why each refusal (the plan is then left alone, and is still right):
//! - a key that is not a bare column of the scan: the servers sort by
//!   stored columns only;
//! - a float64 key: the servers compare floats by IEEE order, where NaN is
//!   unordered, but DataFusion orders NaN above every number, so the two
//!   could choose different rows;
//! - a scan that already has a limit or an order, or answers only a row
//!   count: its rows are not the ones the sort would choose from;
//! - `k` = 0 or over `MAX_TOP_K` (the most a tablet may sort).

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use insitu_protocol::query::{MAX_TOP_K, QueryOutput, SortKey};
use insitu_protocol::schema::ColumnType;

use crate::exec::InsituScanExec;

/// A node's new child has other properties (a top-k scan's are the same,
/// but recomputing is what is right for any node on the way).
const RECOMPUTE: ReplaceChildrenOptions =
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);

/// The rule (registered by `crate::context`).
#[derive(Debug, Default)]
pub struct TopKPushdown;

impl PhysicalOptimizerRule for TopKPushdown {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|node| {
            let Some(sort) = node.downcast_ref::<SortExec>() else {
                return Ok(Transformed::no(node));
            };
            let Some(k) = sort.fetch() else {
                return Ok(Transformed::no(node));
            };
            match push(sort.input(), sort.expr(), k)? {
                Some(input) => {
                    let sort = Arc::clone(&node).replace_children(vec![input], RECOMPUTE)?;
                    Ok(Transformed::yes(sort))
                }
                None => Ok(Transformed::no(node)),
            }
        })
        .data()
    }

    fn name(&self) -> &str {
        "insitu_top_k_pushdown"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `node` with the top-k pushed into the insitu scan under it, or None when
/// it cannot be (see the file comment).
fn push(
    node: &Arc<dyn ExecutionPlan>,
    ordering: &LexOrdering,
    k: usize,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(scan) = node.downcast_ref::<InsituScanExec>() {
        let Some(keys) = sort_keys(ordering, scan) else {
            return Ok(None);
        };
        return Ok(scan
            .with_top_k(keys, k)
            .map(|s| Arc::new(s) as Arc<dyn ExecutionPlan>));
    }
    // Operators that pass every row on under the same schema, so the sort's
    // column numbers still name the scan's columns.
    let keeps_rows = node.is::<RepartitionExec>() || node.is::<CooperativeExec>();
    let children = node.children();
    if !keeps_rows || children.len() != 1 {
        return Ok(None);
    }
    match push(children[0], ordering, k)? {
        Some(child) => Ok(Some(
            Arc::clone(node).replace_children(vec![child], RECOMPUTE)?,
        )),
        None => Ok(None),
    }
}

/// The servers' sort keys for `ordering` over `scan`'s output columns.
fn sort_keys(ordering: &LexOrdering, scan: &InsituScanExec) -> Option<Vec<SortKey>> {
    let QueryOutput::Rows { columns, .. } = &scan.plan().output else {
        return None;
    };
    let schema = scan.source().schema();
    ordering
        .iter()
        .map(|e| {
            let c = e.expr.downcast_ref::<Column>()?;
            let col = *columns.get(c.index())?;
            if schema.columns.get(col as usize)?.ty == ColumnType::Float64 {
                return None;
            }
            Some(SortKey {
                col,
                descending: e.options.descending,
                nulls_first: e.options.nulls_first,
            })
        })
        .collect()
}

/// Whether `k` rows may be asked of each tablet.
pub(crate) fn k_fits(k: usize) -> bool {
    k > 0 && (k as u64) <= MAX_TOP_K
}
