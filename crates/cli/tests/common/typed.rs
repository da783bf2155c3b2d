//! What the typed-table tests share: a typed table made through the client,
//! and a plan that returns rows.

use insitu_client::Client;
use insitu_protocol::query::{QueryOutput, QueryPlan};

use super::Cluster;

/// A client of `cluster` and the id of a new typed table `name` of
/// `tablets` tablets, with `schema` (text form) keyed on `key`.
pub fn typed_table(
    cluster: &Cluster,
    rt: &tokio::runtime::Runtime,
    name: &str,
    tablets: u32,
    schema: &str,
    key: &str,
) -> (Client, u64) {
    let client = rt.block_on(Client::connect(&cluster.addr())).unwrap();
    let schema = insitu_rows::text::parse_schema(schema, key).unwrap();
    let t = rt
        .block_on(client.create_table_with(name, tablets, Some(schema)))
        .unwrap()
        .id;
    (client, t)
}

/// A plan with no filter returning `columns` in table order, at most `limit` rows.
pub fn rows_plan(columns: Vec<u16>, limit: Option<u64>) -> QueryPlan {
    QueryPlan {
        filter: Vec::new(),
        output: QueryOutput::Rows {
            columns,
            order_by: Vec::new(),
            limit,
        },
    }
}
