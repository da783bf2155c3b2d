//! Secondary indexes of typed tables, one per (tablet, column), kept by the
//! shard that owns the tablet (the seed's SLIK, co-located with the data:
//! a lookup is one request per tablet, all sent at once).
//!
//! An index is a sorted set of (column value, key hash): a point or range
//! probe finds the key hashes of the candidate rows, and the query reads
//! those objects through the hash index and applies its whole filter to
//! each (so a stale or superset candidate list can never change an answer).
//!
//! **Built on first use.** The coordinator only stores which columns are
//! declared indexed; a shard builds a tablet's index the first time a query
//! probes it (one walk of the tablet's log with the cleaner held off and a
//! yield every ~1 ms), so a moved, recovered or restarted tablet needs no
//! index transfer. While an index is being built, probes of it scan instead.
//!
//! **Kept exact on every write.** Before the build starts the shard asks the
//! engine to record the hash of every key written or removed in the tablet
//! (`Engine::watch`; the engine records in its two mutation points, so no
//! write path can be missed). Before any probe is answered, and every
//! `KEEP_UP` otherwise, the recorded hashes are applied: every index entry
//! of the hash is removed and the objects now holding it are indexed again.
//! A row visited by the build and changed later is thus corrected, and a
//! probe sees every write acknowledged before it. A split, drop or re-create
//! makes a new tablet instance (generation), whose index is built afresh; a
//! change log that overflowed (`MAX_CHANGES`) also rebuilds.
//!
//! **Bounded.** An index's memory is estimated and charged to the engine's
//! budget (a refused charge drops the tablet's indexes: probes then scan);
//! a probe matching more than `MAX_CANDIDATES` rows scans instead (the index
//! is not selective there); catching up and building yield every ~1 ms.

mod keys;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use insitu_engine::TransientCharge;
use insitu_protocol::Status;
use insitu_protocol::query::IndexProbe;
use insitu_protocol::schema::Schema;
use insitu_rows::{RowLayout, RowRef};

use crate::scan_run::{CHUNK, Refusal, engine_refusal};
use crate::shard::ShardState;
pub use keys::indexable;
use keys::{IKey, MapBoth, key_of_row, probe_ranges};

/// Most candidate rows a probe may return from one tablet; a probe that
/// matches more is not selective and the query walks the log instead.
pub const MAX_CANDIDATES: usize = 100_000;
/// How often the shard applies recorded changes without a probe asking.
pub const KEEP_UP: Duration = Duration::from_millis(100);
/// Changed hashes applied between two clock checks.
const HASHES_PER_STEP: usize = 1024;
/// Estimated bytes per index entry beyond a text value's bytes: the set's
/// (value, hash) node share and the per-hash list.
const ENTRY_BYTES: usize = 96;
/// Charge the budget in steps of this much, not per entry.
const CHARGE_STEP: u64 = 1 << 20;

/// One column's index on one tablet.
struct ColumnIndex {
    col: u16,
    entries: BTreeSet<(IKey, u64)>,
    /// The values indexed under each hash, so a changed hash's entries can
    /// be found and removed.
    by_hash: HashMap<u64, Vec<IKey>>,
    /// Still being built: probes must not trust it yet.
    building: bool,
}

impl ColumnIndex {
    fn insert(&mut self, key: IKey, hash: u64) -> usize {
        let bytes = ENTRY_BYTES + key.bytes();
        self.entries.insert((key.clone(), hash));
        self.by_hash.entry(hash).or_default().push(key);
        bytes
    }

    fn forget(&mut self, hash: u64) {
        for key in self.by_hash.remove(&hash).unwrap_or_default() {
            self.entries.remove(&(key, hash));
        }
    }
}

/// The indexes of one tablet.
struct TabletIndexes {
    /// The tablet instance they index (see `Engine::tablet_generation`).
    generation: u64,
    /// The schema rows are read with (a query naming another rebuilds).
    schema: Schema,
    layout: RowLayout,
    columns: Vec<ColumnIndex>,
    /// Changed hashes taken from the engine, not yet applied.
    pending: VecDeque<u64>,
    /// Estimated bytes of every column's entries.
    bytes: u64,
    /// The budget charge covering `bytes` (re-taken in CHARGE_STEP steps).
    charge: Option<TransientCharge>,
}

impl TabletIndexes {
    /// Forget every entry of `hash`, before its objects are indexed again.
    fn forget(&mut self, hash: u64) {
        for c in &mut self.columns {
            c.forget(hash);
        }
    }

    /// Index `value`, an object with `hash`, in every column.
    fn index(&mut self, hash: u64, value: &[u8]) {
        let Ok(row) = RowRef::new(&self.layout, value) else {
            return; // a row not of this schema is never a candidate
        };
        for c in &mut self.columns {
            if let Some(k) = key_of_row(&row, c.col as usize) {
                self.bytes += c.insert(k, hash) as u64;
            }
        }
    }
}

/// A shard's secondary indexes, by (table, tablet start).
#[derive(Default)]
pub struct SecondaryIndexes {
    tablets: HashMap<(u64, u64), TabletIndexes>,
}

/// Candidate key hashes for `probe` on the tablet (table, start), building
/// or catching up its index first. `Ok(None)`: the index cannot answer
/// this probe (not indexable, literal of another type, being built, not
/// selective, no memory): the caller walks the log.
pub async fn candidates(
    state: &ShardState,
    table: u64,
    start: u64,
    schema: &Schema,
    probe: &IndexProbe,
) -> Result<Option<Vec<u64>>, Refusal> {
    let col = probe.col();
    let Some(column) = schema.columns.get(col as usize) else {
        return Err((
            Status::BadRequest,
            format!("index probe on column {col}, which the schema does not have"),
        ));
    };
    if !indexable(column.ty) {
        return Ok(None);
    }
    let Some(ranges) = probe_ranges(column.ty, probe) else {
        return Ok(None);
    };
    let generation = state
        .engine
        .borrow()
        .tablet_generation(table, start)
        .map_err(engine_refusal)?;
    let ready = {
        let all = state.sindex.borrow();
        all.tablets.get(&(table, start)).and_then(|t| {
            let c = t.columns.iter().find(|c| c.col == col)?;
            Some(t.generation == generation && t.schema == *schema && !c.building)
        })
    };
    match ready {
        Some(true) => {}
        // Another request is building it: scan this time.
        Some(false) if is_building(state, table, start, col) => return Ok(None),
        _ => {
            if !build(state, table, start, schema, col).await? {
                return Ok(None);
            }
        }
    }
    if !catch_up(state, table, start).await? {
        return Ok(None);
    }
    let all = state.sindex.borrow();
    let Some(t) = all.tablets.get(&(table, start)) else {
        return Ok(None);
    };
    let Some(c) = t.columns.iter().find(|c| c.col == col && !c.building) else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (lo, hi) in ranges {
        for (_, hash) in c.entries.range((lo, hi).map_both()) {
            if out.len() >= MAX_CANDIDATES {
                return Ok(None);
            }
            out.push(*hash);
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(Some(out))
}

fn is_building(state: &ShardState, table: u64, start: u64, col: u16) -> bool {
    state
        .sindex
        .borrow()
        .tablets
        .get(&(table, start))
        .is_some_and(|t| t.columns.iter().any(|c| c.col == col && c.building))
}

/// Keeps the cleaner off a tablet while a build walks its log by position.
struct CleanerHold<'a> {
    state: &'a ShardState,
    table: u64,
    start: u64,
    /// The instance held: a re-created tablet's holds are not ours to release.
    generation: u64,
}

impl Drop for CleanerHold<'_> {
    fn drop(&mut self) {
        let mut engine = self.state.engine.borrow_mut();
        if engine.tablet_generation(self.table, self.start).ok() == Some(self.generation) {
            let _ = engine.hold_cleaner(self.table, self.start, false);
        }
    }
}

/// Build column `col`'s index of the tablet (and start the tablet's set
/// afresh if it is missing, of another instance or schema). Returns false
/// when the budget refused its memory (the tablet's indexes are dropped).
async fn build(
    state: &ShardState,
    table: u64,
    start: u64,
    schema: &Schema,
    col: u16,
) -> Result<bool, Refusal> {
    {
        let mut engine = state.engine.borrow_mut();
        let generation = engine
            .tablet_generation(table, start)
            .map_err(engine_refusal)?;
        let mut all = state.sindex.borrow_mut();
        let fresh = all
            .tablets
            .get(&(table, start))
            .is_none_or(|t| t.generation != generation || t.schema != *schema);
        if fresh {
            // Changes are recorded from here on: anything the walk below
            // sees in an older state is corrected when they are applied.
            engine.watch(table, start).map_err(engine_refusal)?;
            all.tablets.insert(
                (table, start),
                TabletIndexes {
                    generation,
                    schema: schema.clone(),
                    layout: RowLayout::new(schema),
                    columns: Vec::new(),
                    pending: VecDeque::new(),
                    bytes: 0,
                    charge: None,
                },
            );
        }
        let t = all.tablets.get_mut(&(table, start)).expect("just ensured");
        t.columns.retain(|c| c.col != col);
        t.columns.push(ColumnIndex {
            col,
            entries: BTreeSet::new(),
            by_hash: HashMap::new(),
            building: true,
        });
        engine
            .hold_cleaner(table, start, true)
            .map_err(engine_refusal)?;
    }
    let generation = state
        .engine
        .borrow()
        .tablet_generation(table, start)
        .map_err(engine_refusal)?;
    let hold = CleanerHold {
        state,
        table,
        start,
        generation,
    };
    // Walk the log segment by segment; positions hold because the cleaner
    // is held off (new segments only append to the order).
    let mut segment = 0usize;
    let mut chunk_start = Instant::now();
    loop {
        let more = {
            let engine = state.engine.borrow();
            let mut all = state.sindex.borrow_mut();
            let Some(t) = all.tablets.get_mut(&(table, start)) else {
                return Ok(false);
            };
            let layout = &t.layout;
            let Some(c) = t.columns.iter_mut().find(|c| c.col == col) else {
                return Ok(false);
            };
            let mut added = 0u64;
            let more = engine
                .scan_log_segment(table, start, segment, |o| {
                    if let Ok(row) = RowRef::new(layout, o.value)
                        && let Some(k) = key_of_row(&row, col as usize)
                    {
                        added += c.insert(k, insitu_engine::key_hash(table, o.key)) as u64;
                    }
                })
                .map_err(engine_refusal)?;
            t.bytes += added;
            more
        };
        if !more {
            break;
        }
        segment += 1;
        if chunk_start.elapsed() >= CHUNK {
            tokio::task::yield_now().await;
            recharge(state, table, start)?;
            let generation = state
                .engine
                .borrow()
                .tablet_generation(table, start)
                .map_err(engine_refusal)?;
            let same = state
                .sindex
                .borrow()
                .tablets
                .get(&(table, start))
                .is_some_and(|t| t.generation == generation);
            if !same {
                return Ok(false);
            }
            chunk_start = Instant::now();
        }
    }
    drop(hold);
    if !recharge(state, table, start)? {
        return Ok(false);
    }
    if let Some(t) = state.sindex.borrow_mut().tablets.get_mut(&(table, start))
        && let Some(c) = t.columns.iter_mut().find(|c| c.col == col)
    {
        c.building = false;
    }
    Ok(true)
}

/// Re-take the tablet's budget charge if its indexes grew past it. On a
/// refusal the tablet's indexes are dropped (and its changes no longer
/// recorded): false.
fn recharge(state: &ShardState, table: u64, start: u64) -> Result<bool, Refusal> {
    let mut all = state.sindex.borrow_mut();
    let Some(t) = all.tablets.get_mut(&(table, start)) else {
        return Ok(false);
    };
    let charged = t.charge.as_ref().map_or(0, |c| c.bytes());
    if t.bytes <= charged {
        return Ok(true);
    }
    let want = t.bytes.div_ceil(CHARGE_STEP) * CHARGE_STEP;
    let engine = state.engine.borrow();
    match engine.try_charge_transient(want) {
        Ok(c) => {
            t.charge = Some(c); // the old, smaller charge is released
            Ok(true)
        }
        Err(_) => {
            all.tablets.remove(&(table, start));
            drop(engine);
            let _ = state.engine.borrow_mut().unwatch(table, start);
            tracing::warn!(table, start, "no memory for a secondary index: dropped");
            Ok(false)
        }
    }
}

/// Apply every change the engine recorded for the tablet (yielding every
/// ~1 ms). False if the tablet's indexes are gone or must be rebuilt.
async fn catch_up(state: &ShardState, table: u64, start: u64) -> Result<bool, Refusal> {
    let mut chunk_start = Instant::now();
    loop {
        {
            let mut engine = state.engine.borrow_mut();
            let mut all = state.sindex.borrow_mut();
            let Some(t) = all.tablets.get_mut(&(table, start)) else {
                return Ok(false);
            };
            let changes = engine.take_changes(table, start).map_err(engine_refusal)?;
            match changes {
                Some(c) if c.generation == t.generation && !c.overflow => {
                    t.pending.extend(c.hashes)
                }
                // Not watched, another instance, or too many changes to list.
                _ => {
                    all.tablets.remove(&(table, start));
                    let _ = engine.unwatch(table, start);
                    return Ok(false);
                }
            }
            drop(engine);
            let engine = state.engine.borrow();
            for _ in 0..HASHES_PER_STEP {
                let Some(hash) = t.pending.pop_front() else {
                    break;
                };
                t.forget(hash);
                engine
                    .objects_with_hash(table, start, hash, |o| t.index(hash, o.value))
                    .map_err(engine_refusal)?;
            }
            if t.pending.is_empty() {
                drop((engine, all));
                return recharge(state, table, start);
            }
        }
        if chunk_start.elapsed() >= CHUNK {
            tokio::task::yield_now().await;
            chunk_start = Instant::now();
        }
    }
}

/// The shard's keeper: applies recorded changes every `KEEP_UP` so change
/// logs stay short even when nothing probes, and forgets the indexes of
/// tablets this shard no longer has.
pub async fn keep_up(state: Rc<ShardState>) {
    loop {
        tokio::time::sleep(KEEP_UP).await;
        let keys: Vec<(u64, u64)> = state.sindex.borrow().tablets.keys().copied().collect();
        for (table, start) in keys {
            let exists = state
                .engine
                .borrow()
                .tablet_generation(table, start)
                .is_ok();
            if !exists {
                state.sindex.borrow_mut().tablets.remove(&(table, start));
                continue;
            }
            // A refusal here only means the tablet went away meanwhile.
            let _ = catch_up(&state, table, start).await;
        }
    }
}
