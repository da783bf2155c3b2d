//! Change logs: which keys of a tablet were written or removed since a
//! watcher last looked, so something kept beside the tablet (a shard's
//! secondary indexes) can catch up exactly without being told of every
//! write path.
//!
//! Why here: every change to a tablet's objects goes through
//! `Tablet::put` or `Tablet::remove` (writes, removes, increments,
//! installs from migrations, replay, pushdown updates), so recording there
//! cannot miss one, however the server grows. Only the key's hash is kept
//! (8 bytes, no copy of the key); the watcher re-reads every object with that
//! hash. A split or a drop makes a new tablet instance (a new generation)
//! that nobody watches: the watcher sees the generation change and starts
//! over.

use crate::{Engine, EngineError, TableId};

/// Most hashes a change log keeps before it gives up listing them and only
/// says "overflowed" (the watcher then rebuilds from the whole tablet).
/// 1M hashes = 8 MiB per watched tablet at most.
pub const MAX_CHANGES: usize = 1 << 20;

/// One watched tablet's changes since the last take.
#[derive(Debug, Default)]
pub(crate) struct ChangeLog {
    hashes: Vec<u64>,
    /// More than MAX_CHANGES changes were made: `hashes` is incomplete.
    overflow: bool,
}

impl ChangeLog {
    #[inline]
    pub(crate) fn record(&mut self, hash: u64) {
        if self.hashes.len() < MAX_CHANGES {
            self.hashes.push(hash);
        } else {
            self.overflow = true;
        }
    }
}

/// What `Engine::take_changes` hands over.
#[derive(Debug, PartialEq, Eq)]
pub struct Changes {
    /// The tablet instance the changes are of.
    pub generation: u64,
    /// Hashes of keys changed (in order, with repeats); complete unless
    /// `overflow`.
    pub hashes: Vec<u64>,
    /// Too many changes were made to list: start over from the whole tablet.
    pub overflow: bool,
}

impl Engine {
    /// Start (or restart, emptied) recording the changes of the tablet
    /// starting at `start_hash`; returns its generation.
    pub fn watch(&mut self, table: TableId, start_hash: u64) -> Result<u64, EngineError> {
        let slot = self
            .route_exact(table, start_hash)
            .ok_or(EngineError::UnknownTablet)?;
        let t = self.tablet_mut(slot);
        t.changes = Some(ChangeLog::default());
        Ok(t.generation)
    }

    /// Stop recording the tablet's changes.
    pub fn unwatch(&mut self, table: TableId, start_hash: u64) -> Result<(), EngineError> {
        let slot = self
            .route_exact(table, start_hash)
            .ok_or(EngineError::UnknownTablet)?;
        self.tablet_mut(slot).changes = None;
        Ok(())
    }

    /// The changes recorded since `watch` or the last take (the log goes on
    /// empty); `None` if the tablet is not watched (a new instance, say).
    pub fn take_changes(
        &mut self,
        table: TableId,
        start_hash: u64,
    ) -> Result<Option<Changes>, EngineError> {
        let slot = self
            .route_exact(table, start_hash)
            .ok_or(EngineError::UnknownTablet)?;
        let t = self.tablet_mut(slot);
        let generation = t.generation;
        Ok(t.changes.as_mut().map(|c| Changes {
            generation,
            hashes: std::mem::take(&mut c.hashes),
            overflow: std::mem::take(&mut c.overflow),
        }))
    }

    /// The instance number of the tablet starting at `start_hash` (a dropped
    /// and re-created or split tablet has a new one).
    pub fn tablet_generation(&self, table: TableId, start_hash: u64) -> Result<u64, EngineError> {
        Ok(self.tablet_at(table, start_hash)?.generation)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig, HashRange, RejectRules, key_hash};

    #[test]
    fn every_write_path_is_recorded_once_watched() {
        let mut e = Engine::new(EngineConfig::default()).unwrap();
        e.create_tablet(1, HashRange::FULL).unwrap();
        let r = RejectRules::default();
        e.write(1, b"before", b"x", &r).unwrap();
        assert_eq!(e.take_changes(1, 0).unwrap(), None, "not watched");
        let g = e.watch(1, 0).unwrap();
        e.write(1, b"a", b"1", &r).unwrap();
        e.increment_i64(1, b"n", 5, &r).unwrap();
        e.install(1, b"i", b"v", 1_000).unwrap();
        e.remove(1, b"before", &r).unwrap();
        e.remove(1, b"absent", &r).unwrap(); // writes nothing
        let got = e.take_changes(1, 0).unwrap().unwrap();
        assert_eq!(got.generation, g);
        assert!(!got.overflow);
        let want: Vec<u64> = [&b"a"[..], b"n", b"i", b"before"]
            .iter()
            .map(|k| key_hash(1, k))
            .collect();
        assert_eq!(got.hashes, want);
        // Taken: the log goes on empty.
        assert!(e.take_changes(1, 0).unwrap().unwrap().hashes.is_empty());
        e.unwatch(1, 0).unwrap();
        e.write(1, b"a", b"2", &r).unwrap();
        assert_eq!(e.take_changes(1, 0).unwrap(), None);
    }

    #[test]
    fn past_the_limit_the_log_says_it_overflowed() {
        let mut e = Engine::new(EngineConfig::default()).unwrap();
        e.create_tablet(1, HashRange::FULL).unwrap();
        let r = RejectRules::default();
        e.watch(1, 0).unwrap();
        for i in 0..=super::MAX_CHANGES as u64 {
            e.write(1, &(i % 64).to_le_bytes(), b"v", &r).unwrap();
        }
        let got = e.take_changes(1, 0).unwrap().unwrap();
        assert!(got.overflow);
        assert_eq!(got.hashes.len(), super::MAX_CHANGES);
        // Taken: the next log starts afresh.
        e.write(1, b"k", b"v", &r).unwrap();
        let got = e.take_changes(1, 0).unwrap().unwrap();
        assert!(!got.overflow);
        assert_eq!(got.hashes.len(), 1);
    }

    #[test]
    fn cleaning_moves_objects_without_recording_changes() {
        let mut e = Engine::new(EngineConfig::default()).unwrap();
        e.create_tablet(1, HashRange::FULL).unwrap();
        let r = RejectRules::default();
        for i in 0..20_000u32 {
            e.write(1, &(i % 2000).to_le_bytes(), &[7; 200], &r)
                .unwrap();
        }
        e.watch(1, 0).unwrap();
        assert!(e.clean().segments_cleaned > 0, "the cleaner had work");
        let got = e.take_changes(1, 0).unwrap().unwrap();
        assert!(got.hashes.is_empty(), "{} hashes", got.hashes.len());
    }
}
