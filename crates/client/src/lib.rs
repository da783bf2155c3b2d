//! The insitu client library.
//!
//! [`Client`] (async) and [`BlockingClient`] talk to the coordinator for
//! tables and tablet maps, and straight to the storage shards for data: each
//! key is routed by `insitu_keyhash::key_hash(table, key)` to the shard that
//! owns its tablet, with the retry policy documented on [`Client`].
//! Multi-operations are grouped per shard, split to fit a frame (see
//! [`multi`]) and sent in parallel.

mod admin;
pub mod blocking;
pub mod client;
pub mod cursor;
pub mod error;
pub mod multi;
pub mod ops;
mod oracle;
mod point;
pub mod routing;
pub mod rpc;
pub mod snapshot;
pub mod txn;
mod txn_decide;
pub mod typed;

pub use blocking::{BlockingClient, BlockingSnapshot, BlockingTableCursor, BlockingTransaction};
pub use client::{Client, ClientConfig, Found, PerItem};
pub use cursor::{Object, TableCursor};
pub use error::ClientError;
pub use insitu_auth::{Credentials, Token};
pub use insitu_protocol::{RejectRules, ServerInfo, ShardStats, Status, TableInfo, TabletInfo};
pub use insitu_tls::ClientTls;
pub use multi::MAX_ITEMS_PER_REQUEST;
pub use ops::{AtSnapshot, MAX_SNAPSHOT_RETRIES, PlanOutcome, Selection, TrainedModel};
pub use rpc::{Reply, RpcConn, RpcError};
pub use snapshot::Snapshot;
pub use txn::{Transaction, is_retryable};
pub use typed::{QueryAnswer, QueryOutcome};
