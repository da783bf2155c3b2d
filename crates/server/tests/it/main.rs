//! The storage server's integration tests, one module per concern: real
//! servers in-process or on loopback (`common`), fake peers
//! (`replication_fakes`).
//!
//! One test binary, not one per file: each linked the server, client and
//! helpers again (60 MB each), which was minutes of a cold CI build. Two
//! files stay binaries of their own (`snapshot_move_no_oracle.rs`,
//! `txn_no_room.rs`): they inject faults through an environment variable,
//! which every test of a shared process would see. Run one module with
//! `cargo test -p insitu-server --test it txn::`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../replication_fakes/mod.rs"]
mod replication_fakes;

mod backup_service;
mod connections;
mod expiry;
mod holds;
mod json_snapshot;
mod mark_lost;
mod mutated_requests;
mod query_overflow;
mod query_pages;
mod recover;
mod replication;
mod resp;
mod resp_cluster;
mod resp_limits;
mod resp_mutants;
mod resp_redis;
mod shard_stats;
mod sindex;
mod snapshot;
mod snapshot_expiry;
mod snapshot_move;
mod snapshot_plain;
mod stamped_batch;
mod txn;
mod txn_direct;
mod txn_full_budget;
mod txn_gone_table;
mod txn_records;
mod typed_snapshot;
mod update_memory;
