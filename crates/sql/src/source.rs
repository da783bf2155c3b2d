//! The boundary between the SQL front end and the cluster: a typed table that
//! runs query plans on all its tablets. The cluster client implements it; the
//! tests implement it over rows in memory.

use arrow_array::RecordBatch;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use insitu_protocol::plan::RowAction;
use insitu_protocol::query::{GroupPartial, IndexProbe, Pred, QueryPlan};
use insitu_protocol::schema::Schema;

pub use insitu_rows::arrow::arrow_schema;

/// A typed table the SQL engine can scan and aggregate.
pub trait TableSource: Send + Sync + std::fmt::Debug {
    /// The table's name (as SQL names it).
    fn name(&self) -> &str;
    /// The table's schema.
    fn schema(&self) -> &Schema;
    /// Run a `Rows` plan on every tablet; a stream of Arrow batches whose
    /// schema is the projection (columns in plan order) of
    /// `arrow_schema(schema)`.
    fn rows(&self, plan: QueryPlan) -> BoxStream<'static, Result<RecordBatch, String>>;
    /// Columns with a secondary index (ascending): the planner may probe
    /// one of them (`rows_probed`).
    fn indexes(&self) -> &[u16] {
        &[]
    }
    /// `rows`, with each tablet's candidate rows found through the index
    /// `probe` names. The answer is the same as `rows(plan)`'s (the plan's
    /// filter still decides), so a source without indexes just runs `rows`.
    fn rows_probed(
        &self,
        plan: QueryPlan,
        probe: IndexProbe,
    ) -> BoxStream<'static, Result<RecordBatch, String>> {
        let _ = probe;
        self.rows(plan)
    }
    /// Run an `Aggregate` plan on every tablet and merge the partials: one
    /// `GroupPartial` per group.
    fn aggregate(&self, plan: QueryPlan) -> BoxFuture<'static, Result<Vec<GroupPartial>, String>>;
    /// `aggregate`, with each tablet's candidate rows found through the
    /// index `probe` names (the same answer; see `rows_probed`).
    fn aggregate_probed(
        &self,
        plan: QueryPlan,
        probe: IndexProbe,
    ) -> BoxFuture<'static, Result<Vec<GroupPartial>, String>> {
        let _ = probe;
        self.aggregate(plan)
    }
    /// Change the columns `set` names of every row `filter` passes, on the
    /// servers (`Op::UpdateRows`); the rows written. A source that cannot
    /// write refuses.
    fn update(
        &self,
        filter: Vec<Pred>,
        set: Vec<(u16, RowAction)>,
    ) -> BoxFuture<'static, Result<u64, String>> {
        let _ = (filter, set);
        let name = self.name().to_string();
        Box::pin(async move { Err(format!("table {name} does not take updates")) })
    }

    /// Remove every row `filter` passes, on the servers
    /// (`Op::RemoveRows`); the rows removed. A source that cannot write
    /// refuses.
    fn delete(&self, filter: Vec<Pred>) -> BoxFuture<'static, Result<u64, String>> {
        let _ = filter;
        let name = self.name().to_string();
        Box::pin(async move { Err(format!("table {name} does not take deletes")) })
    }
}
