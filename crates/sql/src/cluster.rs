//! The cluster's typed tables as SQL tables: every plan runs through the
//! Rust client (`Client::query_at`), which fans it out to the tablets, pages
//! through large answers and merges partial aggregates; a session may read
//! every table as of one snapshot timestamp (`cluster_tables_at`,
//! `Listing::tables_at`).

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use insitu_client::{Client, ClientError, QueryAnswer, TableInfo};
use insitu_protocol::plan::RowAction;
use insitu_protocol::query::{GroupPartial, IndexProbe, Pred, QueryPlan};
use insitu_protocol::schema::Schema;

use crate::source::TableSource;

/// The first client error a session's scans met, kept with its kind:
/// DataFusion carries a scan's error as text, and a caller may need to know
/// what it was (a snapshot too old to read is retried on a new one, a
/// timeout is a timeout).
#[derive(Clone, Default, Debug)]
pub struct FirstError(Arc<Mutex<Option<ClientError>>>);

impl FirstError {
    /// Keep `e` if it is the first; its text for DataFusion.
    fn record(&self, e: ClientError) -> String {
        let text = e.to_string();
        if let Ok(mut first) = self.0.lock() {
            first.get_or_insert(e);
        }
        text
    }

    /// The first error recorded (and forget it).
    pub fn take(&self) -> Option<ClientError> {
        self.0.lock().ok().and_then(|mut first| first.take())
    }
}

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
    /// 0: read the rows as they are; else as of this snapshot timestamp
    /// (every table of one session at the same one: a consistent view).
    snapshot_ts: u64,
    /// Where a failed query's client error is kept.
    errors: FirstError,
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

    fn update(
        &self,
        filter: Vec<Pred>,
        set: Vec<(u16, RowAction)>,
    ) -> BoxFuture<'static, Result<u64, String>> {
        let (client, id, snapshot_ts) = (self.client.clone(), self.id, self.snapshot_ts);
        let (schema, errors) = (self.schema.clone(), self.errors.clone());
        Box::pin(async move {
            if snapshot_ts != 0 {
                return Err(format!(
                    "this session reads a snapshot (timestamp {snapshot_ts}); an UPDATE changes the newest rows: run it without --snapshot/--at"
                ));
            }
            client
                .update_rows(id, &schema, filter, set)
                .await
                .map_err(|e| errors.record(e))
        })
    }

    fn delete(&self, filter: Vec<Pred>) -> BoxFuture<'static, Result<u64, String>> {
        let (client, id, snapshot_ts) = (self.client.clone(), self.id, self.snapshot_ts);
        let (schema, errors) = (self.schema.clone(), self.errors.clone());
        Box::pin(async move {
            if snapshot_ts != 0 {
                return Err(format!(
                    "this session reads a snapshot (timestamp {snapshot_ts}); a DELETE changes the newest rows: run it without --snapshot/--at"
                ));
            }
            client
                .delete_rows(id, &schema, filter)
                .await
                .map_err(|e| errors.record(e))
        })
    }
}

impl ClusterTable {
    fn aggregate_with(
        &self,
        plan: QueryPlan,
        probe: Option<IndexProbe>,
    ) -> BoxFuture<'static, Result<Vec<GroupPartial>, String>> {
        let (client, id, snapshot_ts) = (self.client.clone(), self.id, self.snapshot_ts);
        let errors = self.errors.clone();
        Box::pin(async move {
            match client
                .query_at(id, &plan, probe.as_ref(), snapshot_ts)
                .await
                .map_err(|e| errors.record(e))?
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
        let (client, id, snapshot_ts) = (self.client.clone(), self.id, self.snapshot_ts);
        let errors = self.errors.clone();
        futures::stream::once(async move {
            client
                .query_at(id, &plan, probe.as_ref(), snapshot_ts)
                .await
        })
        .flat_map(move |r| match r {
            Ok(out) => match out.answer {
                QueryAnswer::Rows(batches) => {
                    futures::stream::iter(batches.into_iter().map(Ok)).boxed()
                }
                QueryAnswer::Groups(_) => futures::stream::iter([Err(
                    "the servers answered a rows query with groups".to_string(),
                )])
                .boxed(),
            },
            Err(e) => futures::stream::iter([Err(errors.record(e))]).boxed(),
        })
        .boxed()
    }
}

/// Every typed table of the cluster (untyped tables have no columns to query).
pub async fn cluster_tables(client: &Client) -> Result<Vec<Arc<dyn TableSource>>, ClientError> {
    cluster_tables_at(client, 0, &FirstError::default()).await
}

/// Every typed table of the cluster, read as of snapshot timestamp
/// `snapshot_ts` (0: as the rows are). A query over them sees one instant
/// of every table, while writes and transactions go on. A client error a
/// scan meets is kept in `errors`.
pub async fn cluster_tables_at(
    client: &Client,
    snapshot_ts: u64,
    errors: &FirstError,
) -> Result<Vec<Arc<dyn TableSource>>, ClientError> {
    Ok(Listing::fetch(client)
        .await?
        .tables_at(client, snapshot_ts, errors))
}

/// The cluster's tables as one coordinator call listed them. Why keep it: a
/// statement decides whether it reads a snapshot (`snapshot_by_default`)
/// and builds its session (`tables_at`) from the same listing, one round
/// trip instead of two, and a retry at a newer timestamp lists nothing
/// again (a table's columns cannot change under a name; one created or
/// dropped meanwhile is seen, or refused, by the next statement).
pub struct Listing {
    /// Every table, typed or not, as the coordinator listed it.
    tables: Vec<TableInfo>,
}

impl Listing {
    /// List the cluster's tables (one coordinator call).
    pub async fn fetch(client: &Client) -> Result<Self, ClientError> {
        Ok(Listing {
            tables: client.list_tables().await?,
        })
    }

    /// Every typed table listed, as SQL tables read as of `snapshot_ts`
    /// (0: as the rows are); a client error a scan meets is kept in `errors`.
    pub fn tables_at(
        &self,
        client: &Client,
        snapshot_ts: u64,
        errors: &FirstError,
    ) -> Vec<Arc<dyn TableSource>> {
        self.tables
            .iter()
            .filter_map(|t| {
                let schema = t.schema.clone()?;
                Some(Arc::new(ClusterTable {
                    client: client.clone(),
                    id: t.id,
                    name: t.name.clone(),
                    schema,
                    indexes: t.indexes.clone(),
                    snapshot_ts,
                    errors: errors.clone(),
                }) as Arc<dyn TableSource>)
            })
            .collect()
    }

    /// Whether `sql` reads one snapshot when none is asked for or refused,
    /// as `count` and `agg` do: a query (`reads_only`) while some typed
    /// table has more than one tablet (one tablet is read at one instant
    /// anyway; the tables the query names are not resolved here, so any
    /// multi-tablet typed table counts).
    pub fn snapshot_by_default(&self, sql: &str) -> bool {
        reads_only(sql)
            && self
                .tables
                .iter()
                .any(|t| t.schema.is_some() && t.tablets.len() > 1)
    }
}

/// Whether `sql` is one statement that only reads (a query: SELECT, WITH,
/// VALUES). Anything else, or text that does not parse (its run reports
/// why), is not: an UPDATE or DELETE changes the newest rows and is refused
/// at a snapshot.
pub fn reads_only(sql: &str) -> bool {
    use datafusion::sql::parser::{DFParser, Statement};
    use datafusion::sql::sqlparser::ast::Statement as Sql;
    match DFParser::parse_sql(sql) {
        Ok(statements) if statements.len() == 1 => {
            matches!(&statements[0], Statement::Statement(s) if matches!(**s, Sql::Query(_)))
        }
        _ => false,
    }
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

#[cfg(test)]
mod tests {
    use super::reads_only;

    /// Only one statement that reads takes a snapshot by default: a write,
    /// an EXPLAIN, two statements or text that does not parse do not.
    #[test]
    fn only_a_single_query_reads_only() {
        for sql in [
            "select 1",
            "SELECT count(*) FROM lineitem WHERE l_quantity < 24",
            "with t as (select 1 as a) select a from t",
            "values (1), (2)",
        ] {
            assert!(reads_only(sql), "{sql}");
        }
        for sql in [
            "update t set a = 1",
            "delete from t where a = 1",
            "explain select 1",
            "select 1; select 2",
            "selec 1",
            "",
        ] {
            assert!(!reads_only(sql), "{sql}");
        }
    }
}
