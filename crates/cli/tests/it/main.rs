//! The `insitu` command's integration tests, one module per concern (a
//! real cluster of `insitu` processes on loopback in most of them).
//!
//! One test binary, not one per file: each binary linked the whole client,
//! SQL engine and test helpers again (28 links of 20-60 MB each), which was
//! minutes of a cold CI build. The tests run as before: in parallel, each
//! starting its own processes on free ports. Run one module with
//! `cargo test -p insitu --test it delete::`.

#[path = "../common/mod.rs"]
mod common;

mod advertise;
mod auth;
mod bench_kv;
mod bench_resp;
mod cli_io;
mod closed_output;
mod cluster;
mod dead_servers;
mod delete;
mod digest;
mod durability;
mod json_paths;
mod lost;
mod metrics;
mod move_crash;
mod pushdown;
mod pushdown_exact;
mod readme;
mod restart;
mod sql;
mod tls;
mod txn;
mod txn_crash;
mod txn_crash_vote;
mod typed;
mod typed_update;
mod up;
mod update_resend;
