//! Figures the engine reports: per tablet, memory, cleaner passes, replay.

use crate::{HashRange, TableId};

/// Figures for one tablet, kept current on every write (not recomputed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TabletStats {
    pub table: TableId,
    pub range: HashRange,
    pub object_count: u64,
    /// Bytes of live entries (headers + keys + values) in this tablet's log.
    pub live_bytes: u64,
    /// Bytes of all segments this tablet holds (allocated size).
    pub segment_bytes: u64,
    pub segments: u64,
    /// The version the next write in this tablet will get.
    pub next_version: u64,
}

/// Engine-wide memory figures.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryStats {
    pub budget_bytes: u64,
    /// Bytes of all segments held, over all tablets.
    pub segment_bytes: u64,
    /// Bytes of every tablet's hash index allocation (counted in the budget).
    pub index_bytes: u64,
    /// Bytes of transient copies charged now (snapshots, migration buffers,
    /// key lists; counted in the budget).
    pub transient_bytes: u64,
    /// Bytes of live entries, over all tablets.
    pub live_bytes: u64,
    /// live_bytes / segment_bytes (1.0 when empty).
    pub utilization: f64,
}

/// What one cleaner pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanStats {
    pub segments_cleaned: u64,
    pub entries_moved: u64,
    pub bytes_freed: u64,
    pub tombstones_dropped: u64,
}

/// A corrupt or unreadable entry found during replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptEntry {
    /// Index of the segment in the sequence given to `replay`.
    pub segment: usize,
    /// Byte offset of the entry inside that segment.
    pub offset: usize,
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Live objects installed after newest-version-wins resolution.
    pub objects_loaded: u64,
    /// Live side records installed (newest version per record id).
    pub records_loaded: u64,
    /// Entries read (objects and tombstones in the range; side records
    /// not counted), valid ones only.
    pub entries_read: u64,
    pub corrupt: Vec<CorruptEntry>,
}
