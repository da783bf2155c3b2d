//! Objects with a deadline: the engine's clock, the rule that an expired
//! object is absent, and the sweep that finds expired objects so their
//! owner can remove them.
//!
//! An object may carry a deadline in Unix milliseconds (`entry.rs`, flag
//! bit 6). From the deadline on it is absent to every read, visit, scan and
//! reject rule of the engine: the check is made where an object is handed
//! out, so an expired object is never returned even if nobody removed it.
//! Its bytes stay in the log until it is removed like any other object: a
//! tombstone, then the cleaner reclaims both.
//!
//! Why removal is a tombstone and not the cleaner dropping the entry: an
//! older version of the key may sit in a segment not yet cleaned (dead in
//! memory, but present on the backups). A crash would replay it, and with
//! the newest entry gone it would win: the key would come back with an old
//! value. A tombstone outranks it, as for any remove. Why the engine does
//! not write those tombstones itself: the shard owns what a remove means
//! beyond the log (replication's wait, snapshot versions, transaction
//! locks, metrics), so the sweep only names what is due and the shard
//! removes each through [`Engine::expire`].
//!
//! Why a sweep over segments and not a queue of deadlines: a queue costs
//! memory per expiring object outside the budget's accounting, and must be
//! rebuilt by every replay, split and move. Each segment instead counts its
//! live expiring objects and keeps a lower bound of their deadlines
//! (`Segment::expiring`, `earliest_expiry_ms`), so the sweep reads only
//! segments that hold something due, and a resumable cursor bounds the
//! bytes it reads per call.
//!
//! The clock is the system's (Unix ms), read only when an object with a
//! deadline is met; a test may pin it (`set_clock_ms`). Replay never reads
//! it: a replayed tablet holds exactly what its log says, expired or not.

use crate::entry::{self, KIND_OBJECT};
use crate::{Engine, EngineError, ObjectRef, TableId};

/// The engine's clock: Unix milliseconds now, or the pinned time.
pub(crate) fn system_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A pinned clock (`Engine::pin_clock`); dropping it unpins.
#[must_use = "the clock is pinned only while the guard lives"]
pub struct ClockPin<'a> {
    engine: &'a Engine,
    /// The pin this one replaced, put back on drop.
    outer: Option<u64>,
}

impl Drop for ClockPin<'_> {
    fn drop(&mut self) {
        self.engine.clock_pin.set(self.outer);
    }
}

/// Where the sweep resumes: a tablet slot, a position in its segment order,
/// the tablet instance and segment id found there (if either changed, the
/// position restarts at offset 0: an offset is an entry boundary only in
/// the segment it was taken in) and the offset of the next entry.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SweepCursor {
    tablet: usize,
    position: usize,
    /// `Tablet::generation`: a tablet dropped and re-created in the same
    /// slot numbers its segments from 1 again.
    generation: u64,
    segment_id: u64,
    offset: usize,
    /// The smallest deadline seen in the segment so far, for its recount.
    earliest: u64,
}

/// An expired object the sweep found: remove it with [`Engine::expire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredObject {
    pub table: TableId,
    pub key: Vec<u8>,
    /// The version found; `expire` removes only this version.
    pub version: u64,
}

/// The live objects with a deadline in one tablet (`Engine::expiring_figures`):
/// what Redis's `INFO` reports as `expires=` and, with the clock, `avg_ttl`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpiringFigures {
    /// How many, expired or not (an expired one counts until it is removed).
    pub objects: u64,
    /// The sum of their deadlines (Unix ms): divided by `objects`, their
    /// mean deadline.
    pub deadline_sum_ms: u128,
}

/// What one sweep call did.
#[derive(Clone, Debug, Default)]
pub struct ExpirySweep {
    /// Expired live objects found, in log order.
    pub expired: Vec<ExpiredObject>,
    /// Entry bytes read (segments skipped by their counts read none).
    pub bytes_read: u64,
    /// True when the sweep went past the last tablet and starts over next
    /// time. A call that resumed in the middle of a tablet and wrapped has
    /// not read that tablet's earlier segments (nor the resumed segment's
    /// earlier entries, which may have fallen due since it read them): only
    /// the next call, starting at a tablet's first segment, covers them. A
    /// due object is named at most one round late; it is absent to every
    /// read meanwhile.
    pub wrapped: bool,
}

impl ObjectRef<'_> {
    /// Whether the object's deadline has passed on the engine's clock (the
    /// clock is read only for an object with a deadline).
    #[inline(always)]
    pub(crate) fn is_expired_now(&self, engine: &Engine) -> bool {
        self.expires_at_ms != 0 && self.expires_at_ms <= engine.now_ms()
    }
}

impl Engine {
    /// Unix milliseconds on the engine's clock: what decides expiry.
    #[inline]
    pub fn now_ms(&self) -> u64 {
        match self.clock_pin.get() {
            Some(pinned) => pinned,
            None => self.manual_clock_ms.unwrap_or_else(system_now_ms),
        }
    }

    /// Judge expiry at `now_ms` until the guard drops: every read, visit
    /// and scan of the engine then leaves out exactly the objects whose
    /// deadline is at or before it. For a read at a snapshot, which must
    /// see an object as the snapshot's instant saw it, however late the
    /// read runs (the server's `snapshot_read.rs`, `scan_run.rs`). Only
    /// reads should run under it: a write's reject rules would be judged
    /// at that time too. Nested pins restore the outer one.
    pub fn pin_clock(&self, now_ms: u64) -> ClockPin<'_> {
        let outer = self.clock_pin.replace(Some(now_ms));
        ClockPin {
            engine: self,
            outer,
        }
    }

    /// Pin the engine's clock at `now_ms` (`None`: the system clock again).
    /// For tests and deterministic models.
    pub fn set_clock_ms(&mut self, now_ms: Option<u64>) {
        self.manual_clock_ms = now_ms;
    }

    /// Remove `key` if its live object is at `version` and has expired:
    /// what the owner does with each object `sweep_expired` named. Appends
    /// a tombstone like `remove`. `Ok(false)`: nothing to do (the key was
    /// written, removed or given a later deadline since it was found).
    pub fn expire(
        &mut self,
        table: TableId,
        key: &[u8],
        version: u64,
    ) -> Result<bool, EngineError> {
        let (hash, slot, old) = self.locate(table, key)?;
        let Some(loc) = old else {
            return Ok(false);
        };
        let o = self.tablet(slot).object(loc);
        if o.version != version || !o.is_expired_now(self) {
            return Ok(false);
        }
        self.remove_at(slot, hash, key, loc)?;
        Ok(true)
    }

    /// Find up to `max_objects` expired live objects, reading at most about
    /// `max_bytes` of entries, resuming where the last call stopped and
    /// starting over after the last tablet. Segments with no live object
    /// due by now are skipped without being read.
    pub fn sweep_expired(&mut self, max_objects: usize, max_bytes: u64) -> ExpirySweep {
        let now = self.now_ms();
        let mut out = ExpirySweep::default();
        let mut c = self.expiry_cursor;
        // Each tablet slot is left at most once per call, so a sweep over
        // nothing due ends and no segment is read twice in one call (an
        // object is named at most once: nothing is removed until the
        // caller acts on the list).
        let tablets = self.tablets.len();
        let mut slots_left = tablets;
        while out.expired.len() < max_objects && out.bytes_read < max_bytes && slots_left > 0 {
            let Some(Some(t)) = self.tablets.get_mut(c.tablet) else {
                c = next_tablet(c, &mut out, tablets, &mut slots_left);
                continue;
            };
            let Some(&slot) = t.order.get(c.position) else {
                c = next_tablet(c, &mut out, tablets, &mut slots_left);
                continue;
            };
            let (table, generation) = (t.table, t.generation);
            let seg = &mut t.segs[slot as usize];
            if seg.id != c.segment_id || generation != c.generation {
                // A new position (or the segment there changed): from its start.
                c.segment_id = seg.id;
                c.generation = generation;
                c.offset = 0;
                c.earliest = u64::MAX;
            }
            if c.offset == 0 && (seg.expiring == 0 || seg.earliest_expiry_ms > now) {
                c.position += 1;
                c.segment_id = 0;
                continue;
            }
            let buf = &seg.buf;
            let mut at = c.offset;
            while at < buf.len() && out.expired.len() < max_objects && out.bytes_read < max_bytes {
                let h = entry::header(buf, at);
                let len = h.entry_len();
                if h.kind == KIND_OBJECT && !h.dead && h.expires_at_ms != 0 {
                    c.earliest = c.earliest.min(h.expires_at_ms);
                    if h.expires_at_ms <= now {
                        let key = entry::key_at(buf, at).to_vec();
                        out.expired.push(ExpiredObject {
                            table,
                            key,
                            version: h.version,
                        });
                    }
                }
                out.bytes_read += len as u64;
                at += len;
            }
            if at >= buf.len() {
                // The whole segment was read: its bound is now exact (the
                // due objects found count until they are removed).
                if seg.expiring > 0 {
                    seg.earliest_expiry_ms = c.earliest;
                }
                c.position += 1;
                c.segment_id = 0;
                c.offset = 0;
            } else {
                c.offset = at;
            }
        }
        self.expiry_cursor = c;
        out
    }

    /// Live objects with a deadline in the tablet at `start_hash`, expired
    /// or not (from the segments' counts: O(segments)).
    pub fn expiring_objects(&self, table: TableId, start_hash: u64) -> Result<u64, EngineError> {
        Ok(self.expiring_figures(table, start_hash)?.objects)
    }

    /// The count and deadline sum of the live objects with a deadline in
    /// the tablet at `start_hash`, expired or not until they are removed
    /// (from the segments' figures: O(segments), no entry read).
    pub fn expiring_figures(
        &self,
        table: TableId,
        start_hash: u64,
    ) -> Result<ExpiringFigures, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        Ok(t.order.iter().fold(ExpiringFigures::default(), |acc, &s| {
            let seg = &t.segs[s as usize];
            ExpiringFigures {
                objects: acc.objects + u64::from(seg.expiring),
                deadline_sum_ms: acc.deadline_sum_ms + seg.expiry_deadline_sum_ms,
            }
        }))
    }
}

/// The cursor at the next tablet slot (wrapping to the first).
fn next_tablet(
    c: SweepCursor,
    out: &mut ExpirySweep,
    tablets: usize,
    slots_left: &mut usize,
) -> SweepCursor {
    *slots_left -= 1;
    let tablet = if c.tablet + 1 >= tablets {
        out.wrapped = true;
        0
    } else {
        c.tablet + 1
    };
    SweepCursor {
        tablet,
        ..SweepCursor::default()
    }
}

#[cfg(test)]
#[path = "expiry_tests.rs"]
mod tests;
