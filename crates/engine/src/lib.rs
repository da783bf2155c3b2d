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
//! - `cleaner`: cost-benefit compaction and the tombstone rule;
//! - `replay`: rebuilding a tablet's contents from untrusted segment bytes.
//!
//! This file holds the public API and the policy that joins them: routing
//! (table, key hash) to a tablet, reject rules, and making room in a head
//! (incremental cleaning, cleaning when the budget is full, OutOfMemory).
//!
//! API CONTRACT: the server crate is written against the public items below.
//! Implementations may add items, but must not change these signatures
//! without updating every caller.

pub use insitu_keyhash::{HashRange, key_hash};

pub type TableId = u64;

/// Largest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 64 * 1024;

/// How an engine is sized.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Bytes per log segment. Every entry must fit in one segment, so this
    /// must exceed `max_value_bytes + MAX_KEY_BYTES + entry header`.
    pub segment_bytes: usize,
    /// Total bytes of segments this engine may hold (the memory budget).
    pub memory_budget_bytes: usize,
    /// Largest value accepted, in bytes.
    pub max_value_bytes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            segment_bytes: 2 * 1024 * 1024,
            memory_budget_bytes: 1 << 30,
            max_value_bytes: 1024 * 1024,
        }
    }
}

/// Conditions under which a write / remove / increment is refused
/// (RAMCloud's reject rules). All false = unconditional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectRules {
    /// Refuse if the object exists.
    pub exists: bool,
    /// Refuse if the object does not exist.
    pub doesnt_exist: bool,
    /// Refuse if the object exists and its version <= `given_version`.
    pub version_le_given: bool,
    /// Refuse if the object exists and its version != `given_version`.
    pub version_ne_given: bool,
    pub given_version: u64,
}

/// Why an operation failed. Every variant maps to a wire status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineError {
    /// No tablet of this engine covers the key's hash (the client's map is stale).
    UnknownTablet,
    /// The budget is spent even after cleaning.
    OutOfMemory,
    KeyTooLarge {
        len: usize,
        max: usize,
    },
    ValueTooLarge {
        len: usize,
        max: usize,
    },
    EmptyKey,
    /// A reject rule fired; `version` is the current version (0 if absent).
    ObjectExists {
        version: u64,
    },
    ObjectDoesntExist,
    WrongVersion {
        version: u64,
    },
    /// Increment on a value that is not 8 bytes.
    NotANumber {
        len: usize,
    },
    /// create_tablet / split: the range overlaps an existing tablet, or is invalid.
    BadTablet(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::UnknownTablet => write!(f, "no tablet here covers this key"),
            EngineError::OutOfMemory => write!(
                f,
                "out of memory: the memory budget is full even after cleaning"
            ),
            EngineError::KeyTooLarge { len, max } => {
                write!(f, "key of {len} bytes exceeds the maximum of {max}")
            }
            EngineError::ValueTooLarge { len, max } => {
                write!(f, "value of {len} bytes exceeds the maximum of {max}")
            }
            EngineError::EmptyKey => write!(f, "empty key: keys must be at least one byte"),
            EngineError::ObjectExists { version } => write!(f, "object exists (version {version})"),
            EngineError::ObjectDoesntExist => write!(f, "object does not exist"),
            EngineError::WrongVersion { version } => {
                write!(f, "version check failed (current version {version})")
            }
            EngineError::NotANumber { len } => {
                write!(f, "value is {len} bytes, not an 8-byte number")
            }
            EngineError::BadTablet(why) => write!(f, "bad tablet: {why}"),
        }
    }
}

impl std::error::Error for EngineError {}

/// A live object, borrowed from the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectRef<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub version: u64,
}

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
    /// Entries read (objects and tombstones), valid ones only.
    pub entries_read: u64,
    pub corrupt: Vec<CorruptEntry>,
}

mod cleaner;
mod entry;
mod index;
mod replay;
mod scan;
mod segment;
mod tablet;

pub use scan::{IndexSnapshot, ScanToken};

use cleaner::Goal;
use segment::{Budget, Purpose};
use tablet::Tablet;

/// Bytes of an entry header; the entry layout is documented in `entry.rs`.
pub const ENTRY_HEADER_BYTES: usize = entry::HEADER_BYTES;

/// Bytes a live object of these lengths adds to `live_bytes`.
pub const fn object_entry_bytes(key_len: usize, value_len: usize) -> usize {
    entry::entry_bytes(key_len, value_len)
}

/// One routing entry: which tablet slot serves `start..=end` of a table.
#[derive(Clone, Copy, Debug)]
struct Route {
    start: u64,
    end: u64,
    slot: usize,
}

fn oom<T>(_: T) -> EngineError {
    EngineError::OutOfMemory
}

/// RAMCloud's reject-rule check against the current version (`None` = absent).
fn check_rules(rules: &RejectRules, current: Option<u64>) -> Result<(), EngineError> {
    let Some(version) = current else {
        return if rules.doesnt_exist {
            Err(EngineError::ObjectDoesntExist)
        } else {
            Ok(())
        };
    };
    if rules.exists {
        return Err(EngineError::ObjectExists { version });
    }
    if rules.version_le_given && version <= rules.given_version {
        return Err(EngineError::WrongVersion { version });
    }
    if rules.version_ne_given && version != rules.given_version {
        return Err(EngineError::WrongVersion { version });
    }
    Ok(())
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
    cleaner_totals: CleanStats,
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
    /// `segment_bytes >= 2 * ENTRY_HEADER_BYTES + max_key_bytes + max(max_value_bytes, 8)`.
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
        let largest = 2 * entry::HEADER_BYTES
            + max_key_bytes
            + config.max_value_bytes.max(entry::TOMBSTONE_VALUE_BYTES);
        if config.segment_bytes < largest {
            return bad(format!(
                "segment_bytes {} cannot hold a version mark plus the largest entry ({largest} bytes)",
                config.segment_bytes
            ));
        }
        if config.segment_bytes > u32::MAX as usize {
            return bad(format!(
                "segment_bytes {} exceeds {} (offsets are 32-bit)",
                config.segment_bytes,
                u32::MAX
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
            cleaner_totals: CleanStats::default(),
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

    // ---- internal: routing and checks ------------------------------------------

    #[inline]
    fn route(&self, table: TableId, hash: u64) -> Option<usize> {
        let routes = self.routes.get(&table)?;
        let i = routes.partition_point(|r| r.start <= hash);
        let r = routes.get(i.checked_sub(1)?)?;
        (hash <= r.end).then_some(r.slot)
    }

    fn route_exact(&self, table: TableId, start_hash: u64) -> Option<usize> {
        let routes = self.routes.get(&table)?;
        let i = routes.binary_search_by_key(&start_hash, |r| r.start).ok()?;
        Some(routes[i].slot)
    }

    #[inline]
    fn tablet(&self, slot: usize) -> &Tablet {
        self.tablets[slot]
            .as_ref()
            .expect("a routed slot holds a tablet")
    }

    #[inline]
    fn tablet_mut(&mut self, slot: usize) -> &mut Tablet {
        self.tablets[slot]
            .as_mut()
            .expect("a routed slot holds a tablet")
    }

    fn tablet_at(&self, table: TableId, start_hash: u64) -> Result<&Tablet, EngineError> {
        let slot = self
            .route_exact(table, start_hash)
            .ok_or(EngineError::UnknownTablet)?;
        Ok(self.tablet(slot))
    }

    #[inline]
    fn check_key(&self, key: &[u8]) -> Result<(), EngineError> {
        if key.is_empty() {
            return Err(EngineError::EmptyKey);
        }
        if key.len() > self.max_key_bytes {
            return Err(EngineError::KeyTooLarge {
                len: key.len(),
                max: self.max_key_bytes,
            });
        }
        Ok(())
    }

    #[inline]
    fn check_value(&self, value_len: usize) -> Result<(), EngineError> {
        if value_len > self.config.max_value_bytes {
            return Err(EngineError::ValueTooLarge {
                len: value_len,
                max: self.config.max_value_bytes,
            });
        }
        Ok(())
    }

    /// Check the key, hash it, route it: (hash, tablet slot, current log ref).
    #[inline]
    fn locate(&self, table: TableId, key: &[u8]) -> Result<(u64, usize, Option<u64>), EngineError> {
        self.check_key(key)?;
        let hash = key_hash(table, key);
        let slot = self.route(table, hash).ok_or(EngineError::UnknownTablet)?;
        Ok((hash, slot, self.tablet(slot).find(hash, key)))
    }

    fn version_at(&self, slot: usize, loc: Option<u64>) -> Option<u64> {
        loc.map(|l| self.tablet(slot).object(l).version)
    }

    // ---- internal: room, cleaning, writing ------------------------------------

    fn live_bytes_total(&self) -> u64 {
        self.tablets.iter().flatten().map(|t| t.live_bytes).sum()
    }

    fn wants_incremental_clean(&self) -> bool {
        let allocated = self.budget.allocated_bytes;
        allocated >= cleaner::INCREMENTAL_MIN_SEGMENTS * self.config.segment_bytes as u64
            && self.budget.clock >= self.incremental_backoff_clock
            && (self.live_bytes_total() as f64) < cleaner::INCREMENTAL_LOW * allocated as f64
    }

    fn run_cleaner(&mut self, goal: Goal) -> CleanStats {
        let stats = cleaner::run(&mut self.tablets, &mut self.budget, goal);
        if goal == Goal::Incremental && stats.bytes_freed == 0 {
            self.incremental_backoff_clock = self.budget.clock + self.budget.allocated_bytes / 2;
        }
        let t = &mut self.cleaner_totals;
        t.segments_cleaned += stats.segments_cleaned;
        t.entries_moved += stats.entries_moved;
        t.bytes_freed += stats.bytes_freed;
        t.tombstones_dropped += stats.tombstones_dropped;
        #[cfg(debug_assertions)]
        if stats.segments_cleaned > 0
            && self
                .tablets
                .iter()
                .flatten()
                .map(|t| t.object_count)
                .sum::<u64>()
                < 5_000
        {
            self.tablets
                .iter()
                .flatten()
                .for_each(Tablet::check_consistency);
        }
        stats
    }

    /// Make sure the head of tablet `slot` has `len` bytes free, opening a
    /// new head if needed: after incremental cleaning when utilisation is
    /// low, after cleaning for room when the budget is full, and failing with
    /// `OutOfMemory` if there is still no room. Returns whether the cleaner
    /// ran (log references held by the caller may then have moved).
    fn make_room(
        &mut self,
        slot: usize,
        len: usize,
        purpose: Purpose,
    ) -> Result<bool, EngineError> {
        if self.tablet(slot).head_room(self.config.segment_bytes) >= len {
            return Ok(false);
        }
        let mut cleaned = false;
        if self.wants_incremental_clean() {
            self.run_cleaner(Goal::Incremental);
            cleaned = true;
        }
        if !self.budget.may_allocate(purpose) {
            self.run_cleaner(Goal::Room(purpose));
            cleaned = true;
        }
        let Engine {
            tablets, budget, ..
        } = self;
        let t = tablets[slot]
            .as_mut()
            .expect("a routed slot holds a tablet");
        t.open_head(budget, purpose)?;
        debug_assert!(t.head_room(budget.segment_bytes) >= len);
        Ok(cleaned)
    }

    /// Write an object into tablet `slot`, superseding `old`. `version`
    /// `None` takes the next version; `Some(v)` installs `v` as given.
    fn put(
        &mut self,
        slot: usize,
        hash: u64,
        key: &[u8],
        value: &[u8],
        version: Option<u64>,
        old: Option<u64>,
    ) -> Result<u64, EngineError> {
        if old.is_none() {
            self.tablet_mut(slot).reserve_index(1)?;
        }
        let cleaned = self.make_room(
            slot,
            entry::entry_bytes(key.len(), value.len()),
            Purpose::Object,
        )?;
        let Engine {
            tablets, budget, ..
        } = self;
        let t = tablets[slot]
            .as_mut()
            .expect("a routed slot holds a tablet");
        let old = if cleaned { t.find(hash, key) } else { old };
        let version = match version {
            Some(v) => {
                t.raise_version(v.saturating_add(1));
                v
            }
            None => t.take_version(),
        };
        t.put(budget, hash, key, value, version, old);
        Ok(version)
    }

    fn increment(
        &mut self,
        table: TableId,
        key: &[u8],
        rules: &RejectRules,
        add: impl FnOnce([u8; 8]) -> [u8; 8],
    ) -> Result<([u8; 8], u64), EngineError> {
        self.check_value(8)?;
        let (hash, slot, old) = self.locate(table, key)?;
        check_rules(rules, self.version_at(slot, old))?;
        let current = match old {
            Some(l) => {
                let v = self.tablet(slot).object(l).value;
                <[u8; 8]>::try_from(v).map_err(|_| EngineError::NotANumber { len: v.len() })?
            }
            None => [0u8; 8], // absent counts as 0 (the same bytes for i64 and f64)
        };
        let new = add(current);
        let version = self.put(slot, hash, key, &new, None, old)?;
        Ok((new, version))
    }

    // ---- tablets -------------------------------------------------------

    /// Create an empty tablet for `range` of `table`. Fails if it overlaps an existing one.
    pub fn create_tablet(&mut self, table: TableId, range: HashRange) -> Result<(), EngineError> {
        self.add_tablet(Tablet::new(table, range, 1)).map(|_| ())
    }

    fn check_free_range(&self, table: TableId, range: HashRange) -> Result<(), EngineError> {
        if range.start > range.end {
            return Err(EngineError::BadTablet(format!(
                "empty range {:#x}..={:#x}",
                range.start, range.end
            )));
        }
        if let Some(r) = self.routes.get(&table).and_then(|rs| {
            rs.iter()
                .find(|r| r.start <= range.end && range.start <= r.end)
        }) {
            return Err(EngineError::BadTablet(format!(
                "range {:#x}..={:#x} of table {table} overlaps the tablet {:#x}..={:#x}",
                range.start, range.end, r.start, r.end
            )));
        }
        Ok(())
    }

    /// Register a built tablet (its range must be free). On failure the
    /// tablet's segments are returned to the budget.
    fn add_tablet(&mut self, t: Tablet) -> Result<usize, EngineError> {
        let (table, range) = (t.table, t.range);
        let reserved = self.check_free_range(table, range).and_then(|()| {
            self.routes.try_reserve(1).map_err(oom)?;
            if self.free_tablet_slots.is_empty() {
                self.tablets.try_reserve(1).map_err(oom)?;
            }
            match self.routes.get_mut(&table) {
                Some(rs) => rs.try_reserve(1).map_err(oom),
                None => Ok(()),
            }
        });
        if let Err(e) = reserved {
            t.release(&mut self.budget);
            return Err(e);
        }
        let slot = match self.free_tablet_slots.pop() {
            Some(s) => {
                self.tablets[s] = Some(t);
                s
            }
            None => {
                self.tablets.push(Some(t));
                self.tablets.len() - 1
            }
        };
        let routes = self.routes.entry(table).or_default();
        let at = routes.partition_point(|r| r.start < range.start);
        // A fresh table's Vec grows from empty: a 1-element allocation.
        routes.insert(
            at,
            Route {
                start: range.start,
                end: range.end,
                slot,
            },
        );
        Ok(slot)
    }

    /// Drop the tablet that starts at `start_hash`; its memory is freed. Returns whether it existed.
    pub fn drop_tablet(&mut self, table: TableId, start_hash: u64) -> bool {
        let Some(routes) = self.routes.get_mut(&table) else {
            return false;
        };
        let Ok(i) = routes.binary_search_by_key(&start_hash, |r| r.start) else {
            return false;
        };
        let slot = routes.remove(i).slot;
        if routes.is_empty() {
            self.routes.remove(&table);
        }
        if let Some(t) = self.tablets[slot].take() {
            t.release(&mut self.budget);
        }
        if self.free_tablet_slots.try_reserve(1).is_ok() {
            self.free_tablet_slots.push(slot);
        }
        true
    }

    /// Split the tablet containing `at` into `[start, at-1]` and `[at, end]`.
    /// Both halves keep every object in their range and the version counter.
    pub fn split_tablet(&mut self, table: TableId, at: u64) -> Result<(), EngineError> {
        let slot = self.route(table, at).ok_or(EngineError::UnknownTablet)?;
        let range = self.tablet(slot).range;
        if at == range.start {
            return Err(EngineError::BadTablet(format!(
                "split point {at:#x} is the start of its tablet: one half would be empty"
            )));
        }
        let lower = HashRange {
            start: range.start,
            end: at - 1,
        };
        let upper = HashRange {
            start: at,
            end: range.end,
        };
        // Copy the half with fewer objects; the other stays in place.
        let t = self.tablet(slot);
        let in_upper = t.index.iter().filter(|e| e.hash >= at).count();
        let in_lower = t.object_count as usize - in_upper;
        let (moving, staying, movers) = if in_upper <= in_lower {
            (upper, lower, in_upper)
        } else {
            (lower, upper, in_lower)
        };
        // Reserve routing room first: after the copy nothing may fail.
        self.tablets.try_reserve(1).map_err(oom)?;
        self.free_tablet_slots.try_reserve(1).map_err(oom)?;
        self.routes
            .get_mut(&table)
            .map_or(Ok(()), |rs| rs.try_reserve(1))
            .map_err(oom)?;

        let attempt = |engine: &mut Engine| {
            let Engine {
                tablets, budget, ..
            } = engine;
            let t = tablets[slot]
                .as_mut()
                .expect("a routed slot holds a tablet");
            let mut new = t.split_off(budget, moving, movers)?;
            // The moved half always gets a head: its version mark keeps the
            // counter even if it holds no object (a key removed before the
            // split must not get a lower version after a recovery).
            if new.head.is_none()
                && let Err(e) = new.open_head(budget, Purpose::Object)
            {
                // No head means no movers: nothing was moved, nothing to undo.
                new.release(budget);
                return Err(e);
            }
            Ok(new)
        };
        let new = match attempt(self) {
            Ok(n) => n,
            Err(EngineError::OutOfMemory) => {
                self.run_cleaner(Goal::Room(Purpose::Object));
                attempt(self)?
            }
            Err(e) => return Err(e),
        };
        self.tablet_mut(slot).range = staying;
        let routes = self
            .routes
            .get_mut(&table)
            .expect("the split tablet is routed");
        let i = routes
            .iter()
            .position(|r| r.slot == slot)
            .expect("the split tablet is routed");
        routes[i] = Route {
            start: staying.start,
            end: staying.end,
            slot,
        };
        self.add_tablet(new).map(|_| ())
    }

    /// Stats of every tablet, ordered by (table, range.start).
    pub fn tablets(&self) -> Vec<TabletStats> {
        let mut tables: Vec<TableId> = self.routes.keys().copied().collect();
        tables.sort_unstable();
        tables
            .iter()
            .flat_map(|t| self.routes[t].iter())
            .map(|r| self.tablet(r.slot).stats(self.config.segment_bytes))
            .collect()
    }

    /// Stats of the tablet starting at `start_hash`.
    pub fn tablet_stats(&self, table: TableId, start_hash: u64) -> Option<TabletStats> {
        self.tablet_at(table, start_hash)
            .ok()
            .map(|t| t.stats(self.config.segment_bytes))
    }

    /// The range of the tablet covering `hash`, if any.
    pub fn tablet_for(&self, table: TableId, hash: u64) -> Option<HashRange> {
        self.route(table, hash).map(|slot| self.tablet(slot).range)
    }

    pub fn memory(&self) -> MemoryStats {
        let live = self.live_bytes_total();
        let held = self.budget.allocated_bytes;
        MemoryStats {
            budget_bytes: self.budget.budget_bytes,
            segment_bytes: held,
            live_bytes: live,
            utilization: if held == 0 {
                1.0
            } else {
                live as f64 / held as f64
            },
        }
    }

    // ---- point operations ----------------------------------------------

    /// Read the live object `key` of `table`.
    /// `Err(ObjectDoesntExist)` if absent, `Err(UnknownTablet)` if no tablet covers it.
    #[inline]
    pub fn read(&self, table: TableId, key: &[u8]) -> Result<ObjectRef<'_>, EngineError> {
        self.check_key(key)?;
        let hash = key_hash(table, key);
        let slot = self.route(table, hash).ok_or(EngineError::UnknownTablet)?;
        let t = self.tablet(slot);
        t.find(hash, key)
            .map(|loc| t.object(loc))
            .ok_or(EngineError::ObjectDoesntExist)
    }

    /// Write `value` under `key`; returns the new version.
    pub fn write(
        &mut self,
        table: TableId,
        key: &[u8],
        value: &[u8],
        rules: &RejectRules,
    ) -> Result<u64, EngineError> {
        self.check_value(value.len())?;
        let (hash, slot, old) = self.locate(table, key)?;
        check_rules(rules, self.version_at(slot, old))?;
        self.put(slot, hash, key, value, None, old)
    }

    /// Remove `key` (appends a tombstone); returns the version of the removed object.
    /// Removing an absent key (unless `rules.doesnt_exist`) succeeds with version 0
    /// and writes nothing, as in RAMCloud.
    pub fn remove(
        &mut self,
        table: TableId,
        key: &[u8],
        rules: &RejectRules,
    ) -> Result<u64, EngineError> {
        let (hash, slot, old) = self.locate(table, key)?;
        let removed_version = self.version_at(slot, old);
        check_rules(rules, removed_version)?;
        let (Some(old), Some(removed_version)) = (old, removed_version) else {
            return Ok(0);
        };
        let len = entry::entry_bytes(key.len(), entry::TOMBSTONE_VALUE_BYTES);
        let cleaned = self.make_room(slot, len, Purpose::Tombstone)?;
        let Engine {
            tablets, budget, ..
        } = self;
        let t = tablets[slot]
            .as_mut()
            .expect("a routed slot holds a tablet");
        let old = if cleaned {
            t.find(hash, key).expect("cleaning keeps live objects")
        } else {
            old
        };
        let version = t.take_version();
        t.remove(budget, hash, key, version, old);
        Ok(removed_version)
    }

    /// Add `delta` to the little-endian i64 stored as the value (absent = 0);
    /// returns (new value, new version).
    pub fn increment_i64(
        &mut self,
        table: TableId,
        key: &[u8],
        delta: i64,
        rules: &RejectRules,
    ) -> Result<(i64, u64), EngineError> {
        let (bytes, version) = self.increment(table, key, rules, |b| {
            i64::from_le_bytes(b).wrapping_add(delta).to_le_bytes()
        })?;
        Ok((i64::from_le_bytes(bytes), version))
    }

    /// Same for an f64.
    pub fn increment_f64(
        &mut self,
        table: TableId,
        key: &[u8],
        delta: f64,
        rules: &RejectRules,
    ) -> Result<(f64, u64), EngineError> {
        let (bytes, version) = self.increment(table, key, rules, |b| {
            (f64::from_le_bytes(b) + delta).to_le_bytes()
        })?;
        Ok((f64::from_le_bytes(bytes), version))
    }

    /// Install an object with a given version (migration / replay destination).
    /// Ignored if the tablet already holds a version >= `version` for the key.
    /// The tablet's version counter is raised above `version`.
    pub fn install(
        &mut self,
        table: TableId,
        key: &[u8],
        value: &[u8],
        version: u64,
    ) -> Result<(), EngineError> {
        self.check_value(value.len())?;
        let (hash, slot, old) = self.locate(table, key)?;
        if self
            .version_at(slot, old)
            .is_some_and(|current| current >= version)
        {
            // The held version is already >= `version`, so the counter is above it.
            debug_assert!(self.tablet(slot).next_version > version);
            return Ok(());
        }
        self.put(slot, hash, key, value, Some(version), old)
            .map(|_| ())
    }

    /// Raise the version counter of the tablet starting at `start_hash` to at least `next_version`.
    /// A version mark is logged so that a replay of the tablet keeps it.
    pub fn raise_version(
        &mut self,
        table: TableId,
        start_hash: u64,
        next_version: u64,
    ) -> Result<(), EngineError> {
        let slot = self
            .route_exact(table, start_hash)
            .ok_or(EngineError::UnknownTablet)?;
        if next_version <= self.tablet(slot).next_version {
            return Ok(());
        }
        self.make_room(slot, entry::HEADER_BYTES, Purpose::Object)?;
        let Engine {
            tablets, budget, ..
        } = self;
        let t = tablets[slot]
            .as_mut()
            .expect("a routed slot holds a tablet");
        t.raise_version(next_version);
        t.append_mark(budget);
        Ok(())
    }

    // ---- three ways to visit a tablet ------------------------------------

    /// Walk the tablet's log segments in order, calling `f` for every live object.
    #[inline]
    pub fn for_each_log(
        &self,
        table: TableId,
        start_hash: u64,
        f: impl FnMut(ObjectRef<'_>),
    ) -> Result<(), EngineError> {
        self.tablet_at(table, start_hash)?.for_each_log(f);
        Ok(())
    }

    /// Iterate the tablet's hash index, calling `f` for every live object.
    pub fn for_each_index(
        &self,
        table: TableId,
        start_hash: u64,
        f: impl FnMut(ObjectRef<'_>),
    ) -> Result<(), EngineError> {
        self.tablet_at(table, start_hash)?.for_each_index(f);
        Ok(())
    }

    /// Look up each key of `keys` in the tablet's index; `f(key, Some(obj))`
    /// for found ones, `f(key, None)` for absent ones (or keys outside the tablet).
    /// Empty or oversize keys are absent too.
    pub fn lookup_many<'k>(
        &self,
        table: TableId,
        start_hash: u64,
        keys: impl IntoIterator<Item = &'k [u8]>,
        mut f: impl FnMut(&'k [u8], Option<ObjectRef<'_>>),
    ) -> Result<(), EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        for key in keys {
            let found = if self.check_key(key).is_ok() {
                let hash = key_hash(table, key);
                if t.range.contains(hash) {
                    t.find(hash, key).map(|loc| t.object(loc))
                } else {
                    None
                }
            } else {
                None
            };
            f(key, found);
        }
        Ok(())
    }

    /// The live objects of a tablet, for migration, in log order.
    /// Collected so the caller may mutate the engine afterwards.
    #[allow(clippy::type_complexity)] // the contract's signature
    pub fn extract(
        &self,
        table: TableId,
        start_hash: u64,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>, u64)>, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        let mut out = Vec::new();
        out.try_reserve_exact(t.object_count as usize)
            .map_err(oom)?;
        let copy = |bytes: &[u8]| -> Result<Vec<u8>, EngineError> {
            let mut v = Vec::new();
            v.try_reserve_exact(bytes.len()).map_err(oom)?;
            v.extend_from_slice(bytes);
            Ok(v)
        };
        let mut failed = None;
        t.for_each_log(|o| {
            if failed.is_some() {
                return;
            }
            match (copy(o.key), copy(o.value)) {
                (Ok(k), Ok(v)) if out.len() < out.capacity() => out.push((k, v, o.version)),
                _ => failed = Some(EngineError::OutOfMemory),
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    // ---- log, cleaner, replay -----------------------------------------------

    /// The bytes of the tablet's segments, oldest first (what a backup holds).
    pub fn segments(&self, table: TableId, start_hash: u64) -> Result<Vec<&[u8]>, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        let mut out = Vec::new();
        out.try_reserve_exact(t.order.len()).map_err(oom)?;
        out.extend(t.segment_slices());
        Ok(out)
    }

    /// One cleaner pass over every tablet: compact segments with little live
    /// data. Also runs by itself when a write finds the budget full.
    pub fn clean(&mut self) -> CleanStats {
        self.run_cleaner(Goal::Explicit)
    }

    /// Rebuild the tablet `range` of `table` (which must not exist yet) from
    /// segment byte buffers: newest version wins, tombstones respected,
    /// corrupt entries reported and never loaded.
    pub fn replay<'s>(
        &mut self,
        table: TableId,
        range: HashRange,
        segments: impl IntoIterator<Item = &'s [u8]>,
    ) -> Result<ReplayReport, EngineError> {
        self.check_free_range(table, range)?;
        let mut report = ReplayReport::default();
        let resolved = replay::resolve(
            table,
            range,
            segments,
            self.max_key_bytes,
            self.config.max_value_bytes,
            &mut report,
        )?;
        let mut t = Tablet::new(table, range, resolved.next_version);
        let built = self.build_replayed(&mut t, &resolved);
        if let Err(e) = built {
            t.release(&mut self.budget);
            return Err(e);
        }
        report.objects_loaded = resolved.objects.len() as u64;
        self.add_tablet(t)?;
        Ok(report)
    }

    fn build_replayed(
        &mut self,
        t: &mut Tablet,
        resolved: &replay::Resolved<'_>,
    ) -> Result<(), EngineError> {
        t.reserve_index(resolved.objects.len())?;
        if t.next_version > 1 {
            // Log the counter even if no object survives (see split_tablet).
            self.with_room_retry(|budget| t.open_head(budget, Purpose::Object))?;
        }
        for w in &resolved.objects {
            self.with_room_retry(|budget| t.push_new(budget, w.hash, w.key, w.value, w.version))?;
        }
        Ok(())
    }

    /// Run `f`; if the budget is full, clean the other tablets once and retry.
    fn with_room_retry(
        &mut self,
        mut f: impl FnMut(&mut Budget) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        match f(&mut self.budget) {
            Err(EngineError::OutOfMemory) => {
                self.run_cleaner(Goal::Room(Purpose::Object));
                f(&mut self.budget)
            }
            other => other,
        }
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
        assert!(
            self.budget.allocated_bytes <= self.budget.budget_bytes,
            "over budget"
        );
    }
}
