//! Resumable scans for data operations (pushdown): a tablet is visited in
//! chunks so the shard's event loop can serve other requests in between.
//!
//! # Cursor safety
//! A cursor is a position in the tablet's segment order (or a count of index
//! entries already visited). It is valid only while the tablet is unchanged,
//! which the caller checks with a [`ScanToken`] taken at the start and
//! compared before every chunk:
//! - the cleaner may move live entries between segments (a position could
//!   then visit an object twice or miss it): `clean_epoch` changes;
//! - a write, remove or install appends a new version (a scan could count an
//!   object's old and new version, or miss an object overwritten ahead of the
//!   cursor): `next_version` changes; a split moves objects: `object_count`
//!   and `range` change;
//! - a drop and re-create makes a new tablet: `generation` changes.
//!
//! We chose detection (restart the scan) over pinning segments against the
//! cleaner: pinning alone would not make writes between chunks safe, it
//! would hold memory the budget may need, and a scan that restarts too often
//! can always fall back to running in one go (the server does).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::tablet::walk_live;
use crate::{Engine, EngineError, ObjectRef, TableId, TransientCharge};

static GENERATIONS: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, Ordering::Relaxed)
}

/// A tablet's index as log references (see `Engine::index_snapshot`).
pub struct IndexSnapshot {
    token: ScanToken,
    locs: Vec<u64>,
    /// `locs` counted against the memory budget while the snapshot lives.
    _charge: TransientCharge,
}

/// The state of a tablet a scan cursor depends on; equal tokens mean the
/// cursor is still exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanToken {
    generation: u64,
    clean_epoch: u64,
    next_version: u64,
    object_count: u64,
    range_start: u64,
    range_end: u64,
}

impl Engine {
    /// The token of the tablet starting at `start_hash`.
    pub fn scan_token(&self, table: TableId, start_hash: u64) -> Result<ScanToken, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        Ok(ScanToken {
            generation: t.generation,
            clean_epoch: t.clean_epoch,
            next_version: t.next_version,
            object_count: t.object_count,
            range_start: t.range.start,
            range_end: t.range.end,
        })
    }

    /// Keep the cleaner away from this tablet (`hold = true`) or release one
    /// such hold. While held, and while nothing writes to the tablet, its
    /// `ScanToken` cannot change, so a chunked scan never has to restart.
    /// Holds nest (a count); the caller releases every hold it takes. A held
    /// tablet's dead space is not reclaimed, so holds must be short.
    pub fn hold_cleaner(
        &mut self,
        table: TableId,
        start_hash: u64,
        hold: bool,
    ) -> Result<(), EngineError> {
        let slot = self
            .route_exact(table, start_hash)
            .ok_or(EngineError::UnknownTablet)?;
        let t = self.tablet_mut(slot);
        t.clean_holds = if hold {
            t.clean_holds.saturating_add(1)
        } else {
            t.clean_holds.saturating_sub(1)
        };
        Ok(())
    }

    /// Number of log segments of the tablet (cursor positions are `0..this`).
    pub fn scan_segments(&self, table: TableId, start_hash: u64) -> Result<usize, EngineError> {
        Ok(self.tablet_at(table, start_hash)?.order.len())
    }

    /// Visit the live objects of the `i`-th segment (oldest first) of the
    /// tablet. Returns false if there is no such segment.
    #[inline]
    pub fn scan_log_segment(
        &self,
        table: TableId,
        start_hash: u64,
        i: usize,
        mut f: impl FnMut(ObjectRef<'_>),
    ) -> Result<bool, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        match t.order.get(i) {
            Some(&slot) => {
                let now = self.now_ms();
                walk_live(&t.segs[slot as usize].buf, &mut |o: ObjectRef<'_>| {
                    if !o.is_expired(now) {
                        f(o)
                    }
                });
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The tablet's hash index in iteration order, as log references, so a
    /// chunked index scan can resume by position (hashbrown's iterator cannot
    /// be resumed, and skipping to a position costs O(position)). Valid only
    /// while the tablet's `ScanToken` is unchanged; 8 bytes per object.
    pub fn index_snapshot(
        &self,
        table: TableId,
        start_hash: u64,
    ) -> Result<IndexSnapshot, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        let charge = self.try_charge_transient((t.index.len() * 8) as u64)?;
        let mut locs = Vec::new();
        locs.try_reserve_exact(t.index.len())
            .map_err(|_| EngineError::OutOfMemory)?;
        locs.extend(t.index.iter().map(|e| e.loc()));
        Ok(IndexSnapshot {
            token: self.scan_token(table, start_hash)?,
            locs,
            _charge: charge,
        })
    }

    /// Visit the objects of `snap` from position `from` until the end or
    /// until `budget` has passed (checked every 256 objects). Returns (objects
    /// visited, whether the snapshot ended). Refuses (`BadTablet`) if the
    /// tablet changed since the snapshot was taken.
    pub fn scan_index_snapshot(
        &self,
        table: TableId,
        start_hash: u64,
        snap: &IndexSnapshot,
        from: usize,
        budget: std::time::Duration,
        mut f: impl FnMut(ObjectRef<'_>),
    ) -> Result<(usize, bool), EngineError> {
        if self.scan_token(table, start_hash)? != snap.token {
            return Err(EngineError::BadTablet(
                "the tablet changed since its index snapshot".into(),
            ));
        }
        let t = self.tablet_at(table, start_hash)?;
        let started = std::time::Instant::now();
        let now = self.now_ms();
        let rest = snap.locs.get(from..).unwrap_or(&[]);
        for (n, chunk) in rest.chunks(256).enumerate() {
            for &loc in chunk {
                let o = t.object(loc);
                if !o.is_expired(now) {
                    f(o);
                }
            }
            let done = (n + 1) * 256;
            if done < rest.len() && started.elapsed() >= budget {
                return Ok((done, false));
            }
        }
        Ok((rest.len(), true))
    }

    /// Visit up to `max` objects of the tablet's hash index after skipping
    /// the first `skip`. Returns how many were visited (< `max`: done).
    pub fn scan_index_chunk(
        &self,
        table: TableId,
        start_hash: u64,
        skip: usize,
        max: usize,
        mut f: impl FnMut(ObjectRef<'_>),
    ) -> Result<usize, EngineError> {
        let t = self.tablet_at(table, start_hash)?;
        let now = self.now_ms();
        let mut n = 0;
        for e in t.index.iter().skip(skip).take(max) {
            let o = t.object(e.loc());
            if !o.is_expired(now) {
                f(o);
            }
            n += 1; // a position in the index, expired or not
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig, HashRange, RejectRules};

    fn engine() -> Engine {
        Engine::with_max_key_bytes(
            EngineConfig {
                segment_bytes: 4096,
                memory_budget_bytes: 64 * 4096,
                max_value_bytes: 1024,
            },
            64,
        )
        .unwrap()
    }

    fn sum_by_segments(e: &Engine) -> (u64, u64) {
        let (mut n, mut sum) = (0, 0);
        let mut i = 0;
        while e
            .scan_log_segment(1, 0, i, |o| {
                n += 1;
                sum = u64::wrapping_add(sum, u64::from_le_bytes(o.value[..8].try_into().unwrap()));
            })
            .unwrap()
        {
            i += 1;
        }
        (n, sum)
    }

    #[test]
    fn chunked_visits_see_every_live_object_once() {
        let mut e = engine();
        e.create_tablet(1, HashRange::FULL).unwrap();
        let r = RejectRules::default();
        for i in 0..500u64 {
            e.write(1, &i.to_le_bytes(), &i.to_le_bytes(), &r).unwrap();
        }
        for i in 0..250u64 {
            e.write(1, &i.to_le_bytes(), &(i * 2).to_le_bytes(), &r)
                .unwrap();
        }
        let want: u64 = (0..250u64).map(|i| i * 2).sum::<u64>() + (250..500).sum::<u64>();
        assert_eq!(sum_by_segments(&e), (500, want));
        let (mut n, mut skip) = (0, 0);
        loop {
            let got = e.scan_index_chunk(1, 0, skip, 64, |_| n += 1).unwrap();
            skip += got;
            if got < 64 {
                break;
            }
        }
        assert_eq!(n, 500);
        // The same through an index snapshot, one tiny chunk at a time.
        let snap = e.index_snapshot(1, 0).unwrap();
        let (mut n, mut pos) = (0, 0);
        loop {
            let (got, done) = e
                .scan_index_snapshot(1, 0, &snap, pos, std::time::Duration::ZERO, |_| n += 1)
                .unwrap();
            pos += got;
            if done {
                break;
            }
        }
        assert_eq!((n, pos), (500, 500));
        // A write makes the snapshot stale: refused, never read.
        e.write(1, &7u64.to_le_bytes(), b"12345678", &r).unwrap();
        assert!(
            e.scan_index_snapshot(1, 0, &snap, 0, std::time::Duration::ZERO, |_| {})
                .is_err()
        );
    }

    #[test]
    fn tokens_change_on_write_cleaning_and_recreation() {
        let mut e = engine();
        e.create_tablet(1, HashRange::FULL).unwrap();
        let r = RejectRules::default();
        for i in 0..300u64 {
            e.write(1, &i.to_le_bytes(), &[0u8; 100], &r).unwrap();
        }
        let t0 = e.scan_token(1, 0).unwrap();
        assert_eq!(
            e.scan_token(1, 0).unwrap(),
            t0,
            "reads leave the token alone"
        );
        let _ = e.read(1, &1u64.to_le_bytes());
        assert_eq!(e.scan_token(1, 0).unwrap(), t0);
        e.write(1, &1u64.to_le_bytes(), &[1u8; 100], &r).unwrap();
        let t1 = e.scan_token(1, 0).unwrap();
        assert_ne!(t1, t0, "a write changes the token");
        // Overwrite most objects so the cleaner has work, then clean.
        for i in 0..250u64 {
            e.write(1, &i.to_le_bytes(), &[2u8; 100], &r).unwrap();
        }
        let before = e.scan_token(1, 0).unwrap();
        // A held tablet is left alone by the cleaner: the token stays.
        e.hold_cleaner(1, 0, true).unwrap();
        assert_eq!(e.clean().segments_cleaned, 0);
        assert_eq!(e.scan_token(1, 0).unwrap(), before);
        e.hold_cleaner(1, 0, false).unwrap();
        let stats = e.clean();
        assert!(stats.segments_cleaned > 0);
        let after = e.scan_token(1, 0).unwrap();
        assert_ne!(after, before, "cleaning changes the token");
        assert_eq!(sum_by_segments(&e).0, 300);
        e.drop_tablet(1, 0);
        e.create_tablet(1, HashRange::FULL).unwrap();
        assert_ne!(e.scan_token(1, 0).unwrap(), after);
    }
}
