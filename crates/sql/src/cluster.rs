//! The cluster's typed tables as SQL tables: every plan runs through the
//! Rust client (`Client::query`), which fans it out to the tablets, pages
//! through large answers and merges partial aggregates.

use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use insitu_client::{Client, QueryAnswer};
use insitu_protocol::query::{GroupPartial, IndexProbe, QueryPlan};
use insitu_protocol::schema::Schema;

use crate::source::TableSource;

/// One typed table of a cluster.
#[derive(Clone)]
pub struct ClusterTable {
    client: Client,
    /// The table's id (what the client routes by).
    id: u64,
    name: String,
    schema: Schema,
    /// Columns with a secondary index, as the coordinator listed them.
    indexes: Vec<u16>,
}

impl std::fmt::Debug for ClusterTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterTable({} #{})", self.name, self.id)
    }
}

impl TableSource for ClusterTable {
    fn name(&self) -> &str {
        &self.name
    }

    fn schema(&self) -> &Schema {
        &self.schema
    }

    fn rows(
        &self,
        plan: QueryPlan,
    ) -> BoxStream<'static, Result<arrow_array::RecordBatch, String>> {
        self.rows_with(plan, None)
    }

    fn indexes(&self) -> &[u16] {
        &self.indexes
    }

    fn rows_probed(
        &self,
        plan: QueryPlan,
        probe: IndexProbe,
    ) -> BoxStream<'static, Result<arrow_array::RecordBatch, String>> {
        self.rows_with(plan, Some(probe))
    }

    fn aggregate(&self, plan: QueryPlan) -> BoxFuture<'static, Result<Vec<GroupPartial>, String>> {
        self.aggregate_with(plan, None)
    }

    fn aggregate_probed(
        &self,
        plan: QueryPlan,
        probe: IndexProbe,
    ) -> BoxFuture<'static, Result<Vec<GroupPartial>, String>> {
        self.aggregate_with(plan, Some(probe))
    }
}

impl ClusterTable {
    fn aggregate_with(
        &self,
        plan: QueryPlan,
        probe: Option<IndexProbe>,
    ) -> BoxFuture<'static, Result<Vec<GroupPartial>, String>> {
        let (client, id) = (self.client.clone(), self.id);
        Box::pin(async move {
            match client
                .query_with(id, &plan, probe.as_ref())
                .await
                .map_err(|e| e.to_string())?
                .answer
            {
                QueryAnswer::Groups(g) => Ok(g),
                QueryAnswer::Rows(_) => Err("the servers answered an aggregate with rows".into()),
            }
        })
    }
}

impl ClusterTable {
    fn rows_with(
        &self,
        plan: QueryPlan,
        probe: Option<IndexProbe>,
    ) -> BoxStream<'static, Result<arrow_array::RecordBatch, String>> {
        let (client, id) = (self.client.clone(), self.id);
        futures::stream::once(async move { client.query_with(id, &plan, probe.as_ref()).await })
            .flat_map(|r| match r {
                Ok(out) => match out.answer {
                    QueryAnswer::Rows(batches) => {
                        futures::stream::iter(batches.into_iter().map(Ok)).boxed()
                    }
                    QueryAnswer::Groups(_) => futures::stream::iter([Err(
                        "the servers answered a rows query with groups".to_string(),
                    )])
                    .boxed(),
                },
                Err(e) => futures::stream::iter([Err(e.to_string())]).boxed(),
            })
            .boxed()
    }
}

/// Every typed table of the cluster (untyped tables have no columns to query).
pub async fn cluster_tables(
    client: &Client,
) -> Result<Vec<Arc<dyn TableSource>>, insitu_client::ClientError> {
    let tables = client.list_tables().await?;
    Ok(tables
        .into_iter()
        .filter_map(|t| {
            let schema = t.schema?;
            Some(Arc::new(ClusterTable {
                client: client.clone(),
                id: t.id,
                name: t.name,
                schema,
                indexes: t.indexes,
            }) as Arc<dyn TableSource>)
        })
        .collect())
}

/// A SQL session over every typed table of the cluster `client` reaches.
pub async fn cluster_context(
    client: &Client,
) -> Result<datafusion::prelude::SessionContext, crate::SqlError> {
    let tables = cluster_tables(client)
        .await
        .map_err(|e| crate::SqlError::Execution(format!("listing the cluster's tables: {e}")))?;
    crate::context(tables).await
}
