//! Replay in steps: the same rebuild as `Engine::replay`, cut into pieces
//! so that a caller on a shard's event loop can yield between them and one
//! recovery never holds the shard for the whole tablet (a 128 MB tablet is
//! hundreds of milliseconds of work).
//!
//! 1. `Engine::replay_in_steps` checks that no tablet covers the range and
//!    returns a `ReplayResolver`, which needs no engine: `feed` resolves one
//!    segment at a time (newest version wins), and `report` tells whether a
//!    corrupt entry was found, before anything is built.
//! 2. `ReplayResolver::build` groups the winners by segment (each group is
//!    put in log order when a step reaches it) and starts a tablet off the
//!    engine's routes (its segments and index are charged to the budget at
//!    once, as they are allocated): a `ReplayBuild`.
//! 3. `ReplayBuild::step` appends at most `max_entries` winners; `finish`
//!    adds the tablet (checking the range again: something may have taken
//!    it between steps) or releases it; `abandon` releases it.
//!
//! The caller must end a `ReplayBuild` with `finish` or `abandon` with the
//! same engine: its segments are charged to that engine's budget, which a
//! drop alone cannot give back (a debug build asserts it).

use crate::replay::{Resolved, Resolver};
use crate::segment::Purpose;
use crate::tablet::Tablet;
use crate::{Engine, EngineError, HashRange, ReplayReport, TableId};

/// Step 1: segments resolved one at a time (no engine needed).
pub struct ReplayResolver<'s> {
    /// The winners so far.
    resolver: Resolver<'s>,
    /// Entries read and corrupt entries found so far.
    report: ReplayReport,
}

/// Steps 2 and 3: the tablet being rebuilt, off the engine's routes.
pub struct ReplayBuild<'s> {
    /// `None` once finished or abandoned.
    tablet: Option<Tablet>,
    /// The winners to append, in log order.
    resolved: Resolved<'s>,
    /// Objects appended so far (then records).
    objects_done: usize,
    /// Records appended so far.
    records_done: usize,
    /// Whether the records' index room was reserved (after the objects).
    records_reserved: bool,
    report: ReplayReport,
}

impl Engine {
    /// Start a replay of tablet `range` of `table` in steps (see the module
    /// comment). Refused like `replay` if a tablet covers part of the range.
    pub fn replay_in_steps<'s>(
        &self,
        table: TableId,
        range: HashRange,
    ) -> Result<ReplayResolver<'s>, EngineError> {
        self.check_free_range(table, range)?;
        Ok(ReplayResolver {
            resolver: Resolver::new(
                table,
                range,
                self.max_key_bytes,
                self.config.max_value_bytes,
            ),
            report: ReplayReport::default(),
        })
    }
}

impl<'s> ReplayResolver<'s> {
    /// Resolve the next segment's entries (a few hundred microseconds for a
    /// 2 MiB segment). `OutOfMemory` if the winners' table cannot grow.
    pub fn feed(&mut self, segment: &'s [u8]) -> Result<(), EngineError> {
        self.resolver.feed(segment, &mut self.report)
    }

    /// What was read so far; `corrupt` lists the entries that were refused,
    /// by segment index in feeding order.
    pub fn report(&self) -> &ReplayReport {
        &self.report
    }

    /// Start building the tablet from the winners: their order is fixed,
    /// the index sized for them and, if the counter moved, a head opened
    /// with its version mark (logged even if no object survives).
    pub fn build(self, engine: &mut Engine) -> Result<ReplayBuild<'s>, EngineError> {
        let (table, range) = (self.resolver.table(), self.resolver.range());
        let resolved = self.resolver.finish()?;
        let mut t = Tablet::new(table, range, resolved.next_version);
        let started = t
            .reserve_index(&mut engine.budget, resolved.objects())
            .and_then(|()| {
                if t.next_version > 1 {
                    engine.with_room_retry(|budget| t.open_head(budget, Purpose::Object))
                } else {
                    Ok(())
                }
            });
        if let Err(e) = started {
            t.release(&mut engine.budget);
            return Err(e);
        }
        Ok(ReplayBuild {
            tablet: Some(t),
            resolved,
            objects_done: 0,
            records_done: 0,
            records_reserved: false,
            report: self.report,
        })
    }
}

impl ReplayBuild<'_> {
    /// Append up to `max_entries` more winners (objects, then side records);
    /// `Ok(true)` once all are in. On an error the build must be abandoned.
    pub fn step(&mut self, engine: &mut Engine, max_entries: usize) -> Result<bool, EngineError> {
        let t = self.tablet.as_mut().expect("a build in progress");
        let mut budget_left = max_entries;
        while budget_left > 0 && self.objects_done < self.resolved.objects() {
            let w = self.resolved.object(self.objects_done);
            engine.with_room_retry(|budget| {
                t.push_verified(budget, w.hash, w.key.len(), w.entry, w.expires_at_ms)
            })?;
            self.objects_done += 1;
            budget_left -= 1;
        }
        if self.objects_done < self.resolved.objects() {
            return Ok(false);
        }
        if !self.records_reserved {
            // Records keep their versions (all below the counter).
            t.reserve_records(&mut engine.budget, self.resolved.records.len())?;
            self.records_reserved = true;
        }
        while budget_left > 0 && self.records_done < self.resolved.records.len() {
            let w = &self.resolved.records[self.records_done];
            engine.with_room_retry(|budget| {
                t.push_record(budget, w.id, w.anchor, w.payload, w.version)
            })?;
            self.records_done += 1;
            budget_left -= 1;
        }
        Ok(self.records_done == self.resolved.records.len())
    }

    /// Winners appended so far, of all there are.
    pub fn progress(&self) -> (usize, usize) {
        (
            self.objects_done + self.records_done,
            self.resolved.objects() + self.resolved.records.len(),
        )
    }

    /// Add the rebuilt tablet to the engine (every winner must be in:
    /// `step` returned `Ok(true)`). Refused, with the tablet released, if a
    /// tablet now covers part of its range.
    pub fn finish(mut self, engine: &mut Engine) -> Result<ReplayReport, EngineError> {
        let t = self.tablet.take().expect("a build in progress");
        let (objects, records) = (self.resolved.objects(), self.resolved.records.len());
        assert!(
            self.objects_done == objects && self.records_done == records,
            "finish before every winner was appended"
        );
        engine.add_tablet(t)?; // releases the tablet on a refusal
        let mut report = std::mem::take(&mut self.report);
        report.objects_loaded = objects as u64;
        report.records_loaded = records as u64;
        Ok(report)
    }

    /// Give back everything the build holds (segments, index) to the budget.
    pub fn abandon(mut self, engine: &mut Engine) {
        if let Some(t) = self.tablet.take() {
            t.release(&mut engine.budget);
        }
    }
}

impl Drop for ReplayBuild<'_> {
    fn drop(&mut self) {
        debug_assert!(
            self.tablet.is_none() || std::thread::panicking(),
            "a ReplayBuild dropped without finish or abandon keeps its budget charge"
        );
    }
}

#[cfg(test)]
#[path = "replay_steps_tests.rs"]
mod tests;
