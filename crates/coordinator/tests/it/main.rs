//! The coordinator's integration tests, one module per concern: a real
//! coordinator on loopback, fake storage servers (`common`).
//!
//! One test binary, not one per file: each linked the coordinator, server and
//! helpers again, which was minutes of a cold CI build. Run one module with
//! `cargo test -p insitu-coordinator --test it failure::`.

#[path = "../common/mod.rs"]
mod common;

mod connections;
mod coordinator;
mod failure;
mod hostile_input;
mod identity;
mod moves;
mod retire;
mod stale_reads;
mod timestamps;
