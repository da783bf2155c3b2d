//! insitu's storage engine: log-structured memory with a per-tablet hash index.
//!
//! No networking here. One `Engine` is owned by one shard (one core's event
//! loop), so nothing in this crate locks: `&mut self` is the only guard.
//!
//! Layout and invariants are described in ARCHITECTURE.md ("Storage engine").
//! Modules, bottom up:
//! - `entry`: the byte format of one log entry (checksummed, self-describing);
//! - `segment`: fixed-size append-only buffers and the memory budget;
//! - `index`: the per-tablet hash index entry (key hash + log reference);
//! - `tablet`: one tablet's segments, index and running statistics;
//! - `slack`: the room a head keeps for one tombstone of its tablet's keys;
//! - `cleaner`: cost-benefit compaction and the tombstone rule;
//! - `cleaner_pass`: incremental passes carried out in slices after writes;
//! - `replay`: rebuilding a tablet's contents from untrusted segment bytes
//!   (and `Engine::replay`, which installs them).
//!
//! The `Engine` methods are grouped by concern, one file each:
//! - `config`, `error`, `stats`: the public types (re-exported here);
//! - `routing`: (table, key hash) -> tablet, key/value checks, and the tablet
//!   set (create, drop, split, list);
//! - `room`: budget policy: making room in a head (incremental cleaning,
//!   cleaning when the budget is full, OutOfMemory) and memory figures;
//! - `ops`: point operations, the write path and reject rules;
//! - `visit`: log / index / key-list visits, `extract`, raw segments;
//! - `scan`: resumable chunked scans with staleness tokens;
//! - `hashscan`: resumable walks in key-hash order (enumeration, chunked
//!   migration copies);
//! - `records`: side records kept durably in a tablet's log beside its
//!   objects, invisible to every object operation;
//! - `expiry`: the clock, expired objects as absent, and the sweep that
//!   finds them for removal.
//!
//! This file holds the `Engine` struct, its constructor and the crate's
//! public surface.
//!
//! API CONTRACT: the server crate is written against the public items below.
//! Implementations may add items, but must not change these signatures
//! without updating every caller.

pub use insitu_keyhash::{HashRange, key_hash};

pub type TableId = u64;

/// Highest version the engine ever issues or accepts. A tablet whose counter
/// would pass it refuses writes (`VersionExhausted`) instead of saturating:
/// a saturated counter would hand out one version twice, and chunked scans
/// detect concurrent writes by the counter changing. One below `u64::MAX`, so
/// the counter after the last version (`MAX_VERSION + 1`) still fits.
pub const MAX_VERSION: u64 = u64::MAX - 1;

/// Largest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 64 * 1024;

/// A live object, borrowed from the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectRef<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub version: u64,
    /// When the object stops existing, in Unix milliseconds; 0: never.
    /// Every read and visit of the engine skips an object whose deadline
    /// has passed (`expiry.rs`), so callers see this only on live objects
    /// (but for `read_expired_too`, and under a pinned clock, `pin_clock`).
    pub expires_at_ms: u64,
}

impl ObjectRef<'_> {
    /// Whether the object's deadline is at or before `now_ms`.
    #[inline(always)]
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms != 0 && self.expires_at_ms <= now_ms
    }
}

mod changes;
mod cleaner;
mod cleaner_pass;
mod compact;
mod config;
mod entry;
mod error;
mod expiry;
mod hashscan;
mod index;
mod logview;
mod ops;
mod pack;
mod promise;
mod reaper;
mod records;
mod replay;
mod replay_steps;
mod room;
mod routing;
mod scan;
mod segment;
mod slack;
mod split;
mod stats;
mod tablet;
#[cfg(test)]
mod test_engine;
mod visit;

pub use changes::{Changes, MAX_CHANGES};
pub use config::{EngineConfig, RejectRules};
pub use error::EngineError;
pub use expiry::{ClockPin, ExpiredObject, ExpiringFigures, ExpirySweep};
pub use hashscan::{ExtractChunk, ExtractCursor, HashScanWork, SortedHashes};
pub use logview::SegmentView;
pub use promise::{GroupSize, HeadPromise};
pub use records::{Record, RecordId};
pub use replay_steps::{ReplayBuild, ReplayResolver};
pub use scan::{IndexSnapshot, ScanToken};
pub use segment::TransientCharge;
pub use stats::{CleanStats, CorruptEntry, MemoryStats, ReplayReport, TabletStats};

use routing::Route;
use segment::Budget;
use tablet::Tablet;

/// Most bytes an entry header takes (it is variable-width: 10 bytes for a
/// 30-byte key, a 100-byte value and a version below 2^24); the entry
/// layout is documented in `entry.rs`.
pub const ENTRY_HEADER_BYTES_MAX: usize = entry::MAX_HEADER_BYTES;

/// Bytes a live object of these lengths at `version` adds to `live_bytes`.
pub const fn object_entry_bytes(key_len: usize, value_len: usize, version: u64) -> usize {
    entry::entry_bytes(key_len, value_len, version)
}

/// `object_entry_bytes` of an object with a deadline (`expires_at_ms`, Unix
/// ms; 0: none, the same as `object_entry_bytes`).
pub const fn object_entry_bytes_expiring(
    key_len: usize,
    value_len: usize,
    version: u64,
    expires_at_ms: u64,
) -> usize {
    entry::entry_bytes_expiring(key_len, value_len, version, expires_at_ms)
}

/// Most bytes one entry with this key and value length takes in the log,
/// whatever its version: for sizing `Engine::reserve_head`. The value length
/// of a write is its value's, of a tombstone (a remove) or an increment 8, of
/// a side record its payload's + 9, of a record removal 17.
pub const fn max_entry_bytes(key_len: usize, value_len: usize) -> usize {
    entry::max_entry_bytes(key_len, value_len)
}

/// Bytes of one tablet's hash index once it holds `objects` objects (charged
/// to the memory budget like segments). While the index grows, the old and
/// the new table exist together: a budget must leave room for 1.5 times this.
pub fn index_bytes_for(objects: usize) -> usize {
    index::bytes_for_objects(objects)
}

/// The storage engine of one shard: many tablets, each with its own log
/// segments and its own hash index.
pub struct Engine {
    config: EngineConfig,
    max_key_bytes: usize,
    budget: Budget,
    /// Tablets by slot; routes point into it.
    tablets: Vec<Option<Tablet>>,
    free_tablet_slots: Vec<usize>,
    /// Per table, its tablets sorted by range start: one hash probe and a
    /// (usually one-element) binary search per operation.
    routes: hashbrown::HashMap<TableId, Vec<Route>>,
    /// No incremental cleaning before the clock reaches this (after a pass
    /// that freed nothing, e.g. when entries are too large to pack better).
    incremental_backoff_clock: u64,
    /// The incremental cleaning pass in progress: a slice of it runs after
    /// each write (`cleaner_pass.rs`), so no call carries a whole pass.
    clean_pass: Option<cleaner_pass::Pass>,
    cleaner_totals: CleanStats,
    /// Work of hash-order walks (`hashscan.rs`), for tests and statistics.
    work: hashscan::WorkCounters,
    /// The pinned clock (Unix ms) if a test set one; else the system's.
    manual_clock_ms: Option<u64>,
    /// The clock a read at a snapshot judges expiry by, for the length of
    /// one synchronous step (`Engine::pin_clock`); it outranks the others.
    /// A `Cell` so a step that holds the engine shared can pin it.
    clock_pin: std::cell::Cell<Option<u64>>,
    /// Where the next expiry sweep resumes (`expiry.rs`).
    expiry_cursor: expiry::SweepCursor,
}

impl Engine {
    /// Fails with `BadTablet` if the config is inconsistent (an entry of
    /// maximum size would not fit in a segment, or the budget is below one segment).
    pub fn new(config: EngineConfig) -> Result<Engine, EngineError> {
        Engine::with_max_key_bytes(config, MAX_KEY_BYTES)
    }

    /// Like `new`, with keys limited to `max_key_bytes` (<= `MAX_KEY_BYTES`),
    /// so that small segments (tests, small benchmarks) are consistent.
    /// A segment must hold a version mark plus an entry of maximum size:
    /// `segment_bytes >= 2 * ENTRY_HEADER_BYTES_MAX + max_key_bytes + max(max_value_bytes, 17)`
    /// (17: a side record removal's value).
    pub fn with_max_key_bytes(
        config: EngineConfig,
        max_key_bytes: usize,
    ) -> Result<Engine, EngineError> {
        let bad = |why: String| Err(EngineError::BadTablet(why));
        if max_key_bytes == 0 || max_key_bytes > MAX_KEY_BYTES {
            return bad(format!(
                "max_key_bytes must be in 1..={MAX_KEY_BYTES}, not {max_key_bytes}"
            ));
        }
        // A record removal's value (17 bytes) is the longest fixed one.
        let largest = 2 * entry::MAX_HEADER_BYTES
            + max_key_bytes
            + config
                .max_value_bytes
                .max(entry::RECORD_REMOVED_VALUE_BYTES);
        if config.segment_bytes < largest {
            return bad(format!(
                "segment_bytes {} cannot hold a version mark plus the largest entry ({largest} bytes)",
                config.segment_bytes
            ));
        }
        if config.segment_bytes > index::MAX_SEGMENT_BYTES {
            return bad(format!(
                "segment_bytes {} exceeds {} (index slots hold 22-bit offsets)",
                config.segment_bytes,
                index::MAX_SEGMENT_BYTES
            ));
        }
        if config.memory_budget_bytes < config.segment_bytes {
            return bad(format!(
                "memory budget of {} bytes is below one segment of {}",
                config.memory_budget_bytes, config.segment_bytes
            ));
        }
        Ok(Engine {
            budget: Budget::new(config.memory_budget_bytes as u64, config.segment_bytes),
            config,
            max_key_bytes,
            tablets: Vec::new(),
            free_tablet_slots: Vec::new(),
            routes: hashbrown::HashMap::new(),
            incremental_backoff_clock: 0,
            clean_pass: None,
            cleaner_totals: CleanStats::default(),
            work: hashscan::WorkCounters::default(),
            manual_clock_ms: None,
            clock_pin: std::cell::Cell::new(None),
            expiry_cursor: expiry::SweepCursor::default(),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Largest key this engine accepts.
    pub fn max_key_bytes(&self) -> usize {
        self.max_key_bytes
    }

    /// Totals of every cleaner pass so far, automatic ones included.
    pub fn cleaner_totals(&self) -> CleanStats {
        self.cleaner_totals.clone()
    }
}

impl Engine {
    /// Recompute every tablet's figures from its log and index and compare
    /// them with the running ones; panics on a mismatch. O(data): for tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) {
        for t in self.tablets.iter().flatten() {
            t.check_consistency();
        }
        let held: u64 = self
            .tablets
            .iter()
            .flatten()
            .map(|t| t.order.len() as u64)
            .sum();
        assert_eq!(
            held * self.config.segment_bytes as u64,
            self.budget.allocated_bytes,
            "budget drifted"
        );
        let index: u64 = self
            .tablets
            .iter()
            .flatten()
            .map(|t| {
                assert_eq!(
                    t.index_charged_bytes,
                    t.index.allocation_size() as u64,
                    "index charge drifted"
                );
                // The records map is charged as index bytes (records.rs).
                t.index_charged_bytes + t.records_charged_bytes
            })
            .sum();
        assert_eq!(index, self.budget.index_bytes, "index bytes drifted");
        assert!(
            self.budget.used_bytes() <= self.budget.budget_bytes,
            "over budget"
        );
        assert!(
            self.budget.used_bytes() + self.budget.spare_bytes() <= self.budget.budget_bytes,
            "spare segment buffers beyond the budget"
        );
    }
}
