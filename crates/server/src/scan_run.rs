//! The scan driver shared by pushdown scans (`scan.rs`) and typed queries
//! (`query.rs`): which objects of one tablet, in what chunks, with the
//! tablet checks, yields, restarts and holds described in `scan.rs`.

use std::time::{Duration, Instant};

use insitu_engine::{EngineError, ObjectRef, ScanToken};
use insitu_protocol::Status;
use insitu_protocol::plan::{self, Source};

use crate::handler::engine_status;
use crate::hold::{Hold, HoldKind};
use crate::shard::ShardState;

/// Work between two yields to the event loop.
pub(crate) const CHUNK: Duration = Duration::from_millis(1);
/// Index entries / integer keys visited between two clock checks.
const KEYS_PER_STEP: usize = 8192;
/// Restarts (tablet changed between chunks) before a scan gives up with
/// `Retry`. The first restart takes a hold, after which the tablet cannot
/// change, so more restarts mean the hold was lost (tablet re-created).
const MAX_RESTARTS: u32 = 3;

pub(crate) type Refusal = (Status, String);

/// What a scan feeds every object of the tablet to.
pub(crate) trait ObjectSink {
    fn object(&mut self, key: &[u8], value: &[u8]);
    /// Forget everything seen (the scan restarts).
    fn reset(&mut self);
    /// Nothing more is wanted: the scan may stop early (checked between steps).
    fn done(&self) -> bool {
        false
    }
}

impl<K: insitu_compute::kernel::Kernel, const F: bool> ObjectSink
    for insitu_compute::kernel::Visit<'_, K, F>
{
    #[inline(always)]
    fn object(&mut self, key: &[u8], value: &[u8]) {
        insitu_compute::kernel::Visit::object(self, key, value)
    }
    fn reset(&mut self) {
        insitu_compute::kernel::Visit::reset(self)
    }
}

/// Check that this shard serves the tablet the request names.
pub(crate) fn check_tablet(
    state: &ShardState,
    table: u64,
    start_hash: u64,
    end_hash: u64,
    map_version: u64,
    write: bool,
) -> Result<(), Refusal> {
    let tablets = state.tablets.borrow();
    let Some(meta) = tablets.get(&(table, start_hash)) else {
        return Err((
            Status::UnknownTablet,
            format!("tablet {table}/{start_hash:#x} is not on this shard"),
        ));
    };
    let engine = state.engine.borrow();
    match engine.tablet_for(table, start_hash) {
        Some(r) if r.start == start_hash && r.end == end_hash => {}
        Some(r) => {
            return Err((
                Status::StaleMap,
                format!(
                    "tablet range is {:#x}..={:#x}, not {start_hash:#x}..={end_hash:#x}",
                    r.start, r.end
                ),
            ));
        }
        None => {
            return Err((
                Status::UnknownTablet,
                format!("tablet {table}/{start_hash:#x} is not on this shard"),
            ));
        }
    }
    if meta.map_version != map_version {
        return Err((
            Status::StaleMap,
            format!(
                "tablet placed by map version {}, request names {map_version}",
                meta.map_version
            ),
        ));
    }
    if meta.moved_out {
        return Err((Status::UnknownTablet, "tablet has moved".into()));
    }
    // An update holds writes itself (`write_holds` counts it), so only a move
    // (frozen) stops it here.
    if !meta.serves_reads() || (write && meta.frozen) {
        return Err((Status::Retry, "tablet is being moved".into()));
    }
    Ok(())
}

pub(crate) fn show_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) if s.chars().all(|c| !c.is_control()) => format!("{s:?}"),
        _ if key.len() == 8 => format!(
            "{} (8-byte integer key)",
            u64::from_le_bytes(key.try_into().expect("8 bytes"))
        ),
        _ => {
            let hex: String = key.iter().take(32).map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}")
        }
    }
}

/// The scan proper, for one kernel: chunks, yields, checks, restarts.
pub(crate) struct Run<'a> {
    /// The tablet held still (an update's from its start; a scan's after its
    /// first restart); released when the run ends.
    pub hold: Option<Hold<'a>>,
    pub state: &'a ShardState,
    pub table: u64,
    pub start_hash: u64,
    pub end_hash: u64,
    pub map_version: u64,
    /// Where the objects come from.
    pub source: &'a Source,
    /// Whether the run writes (an update): a frozen (moving) tablet refuses it.
    pub write: bool,
    pub restarts: u32,
    /// The index order of an `Index` scan (dropped on restart).
    pub index_snap: std::cell::RefCell<Option<insitu_engine::IndexSnapshot>>,
    /// A read at a snapshot: the engine's clock (Unix ms) at it, pinned
    /// for each step so expiry is judged at the snapshot's instant
    /// (`versions::clock_ms_at`). None: the engine's own clock.
    pub clock_ms: Option<u64>,
}

impl Run<'_> {
    pub fn check(&self) -> Result<(), Refusal> {
        check_tablet(
            self.state,
            self.table,
            self.start_hash,
            self.end_hash,
            self.map_version,
            self.write,
        )
    }

    fn token(&self) -> Result<ScanToken, Refusal> {
        self.state
            .engine
            .borrow()
            .scan_token(self.table, self.start_hash)
            .map_err(engine_refusal)
    }

    pub async fn scan<V: ObjectSink>(&mut self, v: &mut V) -> Result<(), Refusal> {
        self.check()?;
        'attempt: loop {
            let token = self.token()?;
            let mut chunk_start = Instant::now();
            // Position: segment index (Log), entries visited (Index), next key (IntKeys).
            let mut pos: u64 = match *self.source {
                Source::IntKeys { from, .. } => from,
                _ => 0,
            };
            loop {
                let done = self.step(v, &mut pos, CHUNK)?;
                if done || v.done() {
                    break 'attempt;
                }
                if chunk_start.elapsed() >= CHUNK {
                    tokio::task::yield_now().await;
                    self.check()?;
                    if self.token()? != token {
                        self.restart().await?;
                        self.index_snap.borrow_mut().take();
                        v.reset();
                        continue 'attempt;
                    }
                    chunk_start = Instant::now();
                }
            }
        }
        self.check()
    }

    /// The tablet changed during a yield: hold it still for the next attempt.
    pub async fn restart(&mut self) -> Result<(), Refusal> {
        self.restarts += 1;
        if self.restarts > MAX_RESTARTS {
            return Err((
                Status::Retry,
                format!(
                    "tablet {}/{:#x} changed during the scan {} times; retry",
                    self.table, self.start_hash, self.restarts
                ),
            ));
        }
        if self.hold.is_none() {
            self.hold =
                Some(Hold::take(self.state, self.table, self.start_hash, HoldKind::Scan).await?);
        }
        if let Some(hold) = self.hold.as_mut() {
            hold.hold_cleaner()?;
        }
        // Waiting for the hold may have taken a while: is the tablet still ours?
        self.check()
    }

    /// One step of work (a segment, or up to KEYS_PER_STEP entries / keys).
    #[inline]
    fn step<V: ObjectSink>(
        &self,
        v: &mut V,
        pos: &mut u64,
        budget: Duration,
    ) -> Result<bool, Refusal> {
        let engine = self.state.engine.borrow();
        let _then = self.clock_ms.map(|ms| engine.pin_clock(ms));
        let (table, start) = (self.table, self.start_hash);
        match *self.source {
            Source::Log => {
                let more = engine
                    .scan_log_segment(table, start, *pos as usize, |o: ObjectRef<'_>| {
                        v.object(o.key, o.value)
                    })
                    .map_err(engine_refusal)?;
                *pos += 1;
                Ok(!more)
            }
            Source::Index => {
                // The index's order is fixed at the first step (a snapshot of
                // log references, valid while the scan token is unchanged).
                let mut snap = self.index_snap.borrow_mut();
                if snap.is_none() {
                    *snap = Some(
                        engine
                            .index_snapshot(table, start)
                            .map_err(engine_refusal)?,
                    );
                }
                let snap = snap.as_ref().expect("just taken");
                let (n, done) = engine
                    .scan_index_snapshot(table, start, snap, *pos as usize, budget, |o| {
                        v.object(o.key, o.value)
                    })
                    .map_err(engine_refusal)?;
                *pos += n as u64;
                Ok(done)
            }
            Source::IntKeys { to, .. } => {
                let end = to.min(pos.saturating_add(KEYS_PER_STEP as u64));
                let keys: Vec<[u8; 8]> = (*pos..end).map(plan::int_key).collect();
                engine
                    .lookup_many(table, start, keys.iter().map(|k| &k[..]), |_, found| {
                        if let Some(o) = found {
                            v.object(o.key, o.value)
                        }
                    })
                    .map_err(engine_refusal)?;
                *pos = end;
                Ok(end >= to)
            }
        }
    }
}

pub(crate) fn engine_refusal(e: EngineError) -> Refusal {
    (engine_status(&e), e.to_string())
}
