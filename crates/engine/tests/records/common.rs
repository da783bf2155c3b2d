//! Helpers shared by the side-record tests (`records.rs`,
//! `records_placement.rs`).

#![allow(dead_code)] // each test file uses part of it

use crate::shared::segment_copies;
use std::collections::BTreeMap;

use insitu_engine::{Engine, EngineConfig, HashRange, Record, RecordId, ReplayReport};

pub const T: u64 = 11;
pub const SEG: usize = 4096;
pub const MAX_VALUE: usize = 512;
pub use crate::shared::ANY;

pub fn config(budget_segments: usize) -> EngineConfig {
    EngineConfig {
        segment_bytes: SEG,
        memory_budget_bytes: budget_segments * SEG,
        max_value_bytes: MAX_VALUE,
    }
}

pub fn engine_with(budget_segments: usize) -> Engine {
    let mut e = Engine::with_max_key_bytes(config(budget_segments), 64).expect("config");
    e.create_tablet(T, HashRange::FULL).expect("tablet");
    e
}

pub fn engine() -> Engine {
    engine_with(1024)
}

pub fn rid(class: u8, id: u64) -> RecordId {
    RecordId { class, id }
}

pub fn rec(id: RecordId, anchor: &[u8], payload: &[u8]) -> Record {
    Record {
        id,
        anchor: anchor.to_vec(),
        payload: payload.to_vec(),
    }
}

pub fn anchor(i: u64) -> Vec<u8> {
    format!("anchor-{i}").into_bytes()
}

/// Replay the tablet starting at `start` from its own segments into a fresh engine.
pub fn replayed(e: &Engine, start: u64) -> (Engine, ReplayReport) {
    let range = e.tablet_stats(T, start).expect("tablet").range;
    let segments = segment_copies(e, T, start);
    let mut fresh = Engine::with_max_key_bytes(e.config().clone(), 64).expect("config");
    let report = fresh
        .replay(T, range, segments.iter().map(|s| &s[..]))
        .expect("replay");
    assert!(report.corrupt.is_empty(), "{:?}", report.corrupt);
    fresh.check_invariants();
    (fresh, report)
}

/// Overwrite fillers 0..n: the segments holding their older versions go sparse.
pub fn churn(e: &mut Engine, n: u32, round: u8) {
    for i in 0..n {
        e.write(T, format!("filler-{i}").as_bytes(), &[round; 200], &ANY)
            .expect("churn");
    }
}

pub fn check_records(e: &Engine, start: u64, want: &BTreeMap<RecordId, (Vec<u8>, Vec<u8>)>) {
    let want: Vec<Record> = want.iter().map(|(&id, (a, p))| rec(id, a, p)).collect();
    assert_eq!(e.records(T, start), want);
    assert_eq!(e.record_count(T, start), want.len());
    for r in &want {
        assert_eq!(e.record(T, &r.anchor, r.id), Some(&r.payload[..]));
    }
}
