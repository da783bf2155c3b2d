//! What the engine's unit tests share: an engine of a given size with its
//! tablets already created.

use crate::{Engine, EngineConfig, HashRange};

/// An engine of `segments` segments of `segment_bytes`, values up to
/// `max_value_bytes`, keys up to 64 bytes, one full-range tablet per table.
pub(crate) fn engine_with(
    segment_bytes: usize,
    segments: usize,
    max_value_bytes: usize,
    tables: &[u64],
) -> Engine {
    let config = EngineConfig {
        segment_bytes,
        memory_budget_bytes: segments * segment_bytes,
        max_value_bytes,
    };
    let mut e = Engine::with_max_key_bytes(config, 64).expect("config");
    for &table in tables {
        e.create_tablet(table, HashRange::FULL).expect("tablet");
    }
    e
}
