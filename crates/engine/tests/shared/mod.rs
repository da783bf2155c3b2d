//! What the engine's integration tests share: an engine with its tablets
//! created, and owned copies of a tablet's segments (to replay or damage).

#![allow(dead_code)] // each test file uses part of it

use insitu_engine::{Engine, EngineConfig, HashRange, RejectRules, TableId};

/// Reject rules that reject nothing.
pub const ANY: RejectRules = RejectRules {
    exists: false,
    doesnt_exist: false,
    version_le_given: false,
    version_ne_given: false,
    given_version: 0,
};

/// An engine of `budget_bytes` in segments of `segment_bytes`, values up to
/// `max_value_bytes`, keys up to 64 bytes, one full-range tablet per table.
pub fn engine_of(
    segment_bytes: usize,
    budget_bytes: usize,
    max_value_bytes: usize,
    tables: &[TableId],
) -> Engine {
    let config = EngineConfig {
        segment_bytes,
        memory_budget_bytes: budget_bytes,
        max_value_bytes,
    };
    let mut e = Engine::with_max_key_bytes(config, 64).expect("config");
    for &table in tables {
        e.create_tablet(table, HashRange::FULL).expect("tablet");
    }
    e
}

/// Owned copies of the segments of `table`'s tablet starting at `start`.
pub fn segment_copies(e: &Engine, table: TableId, start: u64) -> Vec<Vec<u8>> {
    e.segments(table, start)
        .expect("segments")
        .iter()
        .map(|s| s.to_vec())
        .collect()
}
