//! insitu's benchmarks as library functions; the `insitu bench ...` commands run them.

// `serde_json::json!` recurses once per key, and the engine report has more
// keys than the default limit (128) allows.
#![recursion_limit = "256"]

pub mod aggregate;
pub mod count;
pub mod engine;
mod engine_stall;
pub mod gradient;
pub mod interference;
mod json_report;
pub mod kv;
mod kv_durable;
pub mod kv_plot;
mod kv_procs;
mod kv_report;
mod kv_stamped;
mod kv_writes;
pub mod loadgen;
pub mod pushdown_cluster;
pub mod recovery;
pub mod resp;
pub mod resp_bench;
mod resp_cluster;
pub mod resp_plot;
pub mod tpch;
pub mod txn;
mod txn_bank;
mod txn_pg;
