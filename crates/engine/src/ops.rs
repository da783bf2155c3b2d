//! Point operations: read, and the write path (write, remove, increment,
//! install, raise_version) with its reject rules and version counter.

use crate::config::check_rules;
use crate::segment::Purpose;
use crate::{Engine, EngineError, ObjectRef, RejectRules, TableId, entry, key_hash};

/// Most keys one `Engine::prefetch` call hints.
pub const PREFETCH_MAX: usize = 64;

impl Engine {
    /// Read the live object `key` of `table`.
    /// `Err(ObjectDoesntExist)` if absent, `Err(UnknownTablet)` if no tablet covers it.
    #[inline]
    pub fn read(&self, table: TableId, key: &[u8]) -> Result<ObjectRef<'_>, EngineError> {
        self.check_key(key)?;
        let hash = key_hash(table, key);
        let slot = self.route(table, hash).ok_or(EngineError::UnknownTablet)?;
        self.tablet(slot)
            .find_object(hash, key)
            .filter(|o| !o.is_expired_now(self))
            .ok_or(EngineError::ObjectDoesntExist)
    }

    /// `read`, but an object whose deadline has passed is returned too (its
    /// `expires_at_ms` says when it stopped existing): the value a write
    /// replaces, kept for snapshots that may be older than the deadline.
    pub fn read_expired_too(
        &self,
        table: TableId,
        key: &[u8],
    ) -> Result<ObjectRef<'_>, EngineError> {
        self.check_key(key)?;
        let hash = key_hash(table, key);
        let slot = self.route(table, hash).ok_or(EngineError::UnknownTablet)?;
        self.tablet(slot)
            .find_object(hash, key)
            .ok_or(EngineError::ObjectDoesntExist)
    }

    /// `read`, and the log mark after whose replication the entry read is
    /// durable: that of a walk that saw it (`note_walk`), or `log_changes()`
    /// now if it came after the last walk. A reply that
    /// shows the object need wait only for that mark, not for every change
    /// made since (a read of an old object during a long update).
    #[inline]
    pub fn read_held(
        &self,
        table: TableId,
        key: &[u8],
    ) -> Result<(ObjectRef<'_>, u64), EngineError> {
        self.check_key(key)?;
        let hash = key_hash(table, key);
        let slot = self.route(table, hash).ok_or(EngineError::UnknownTablet)?;
        let (object, held_at) = self
            .tablet(slot)
            .find_object_held(hash, key)
            .filter(|(o, _)| !o.is_expired_now(self))
            .ok_or(EngineError::ObjectDoesntExist)?;
        Ok((object, held_at.unwrap_or_else(|| self.log_changes())))
    }

    /// Start loading into the cache what lookups of `keys` will read in the
    /// log (the entries their index slots point at); changes nothing and
    /// returns without waiting. Why: a point lookup over a large keyspace is
    /// two dependent cache misses, the index slot and the entry whose key it
    /// compares, and lookups run one after another pay them in series. A
    /// caller holding several requests (a pipelined batch) hands their keys
    /// here first. The keys are hashed in one loop and the index probed in
    /// a second, so the probes' own misses, with nothing else between them,
    /// overlap too. Keys past `PREFETCH_MAX` are not hinted.
    pub fn prefetch<'k>(&self, table: TableId, keys: impl IntoIterator<Item = &'k [u8]>) {
        let mut at = [(0usize, 0u64); PREFETCH_MAX];
        let mut n = 0;
        for key in keys.into_iter().take(PREFETCH_MAX) {
            if key.len() > self.max_key_bytes {
                continue;
            }
            let hash = key_hash(table, key);
            if let Some(slot) = self.route(table, hash) {
                at[n] = (slot, hash);
                n += 1;
            }
        }
        for &(slot, hash) in &at[..n] {
            self.tablet(slot).prefetch(hash);
        }
    }

    /// Write `value` under `key`; returns the new version.
    pub fn write(
        &mut self,
        table: TableId,
        key: &[u8],
        value: &[u8],
        rules: &RejectRules,
    ) -> Result<u64, EngineError> {
        self.write_expiring(table, key, value, 0, rules)
    }

    /// `write` of an object that stops existing at `expires_at_ms` (Unix
    /// ms; 0: never). A deadline already passed is accepted: the object is
    /// written and at once absent, as Redis does with `SET ... PXAT` in the
    /// past (the expiry sweep removes it).
    pub fn write_expiring(
        &mut self,
        table: TableId,
        key: &[u8],
        value: &[u8],
        expires_at_ms: u64,
        rules: &RejectRules,
    ) -> Result<u64, EngineError> {
        self.check_value(value.len())?;
        let (hash, slot, old) = self.locate(table, key)?;
        check_rules(rules, self.version_at(slot, old))?;
        self.put(slot, hash, key, value, None, expires_at_ms, old)
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
        self.remove_at(slot, hash, key, old)?;
        Ok(removed_version)
    }

    /// Append a tombstone for `key`, whose live entry is at `old` in tablet
    /// `slot`, and unindex it.
    pub(crate) fn remove_at(
        &mut self,
        slot: usize,
        hash: u64,
        key: &[u8],
        old: u64,
    ) -> Result<(), EngineError> {
        self.tablet(slot).check_version_left()?;
        // No slack asked: a tombstone may use the room its head kept for one.
        let len = entry::max_entry_bytes(key.len(), entry::TOMBSTONE_VALUE_BYTES);
        let cleaned = self.make_room(slot, len, Purpose::Tombstone)?;
        let (t, budget) = self.tablet_and_budget(slot);
        let old = if cleaned {
            t.find(hash, key).expect("cleaning keeps live objects")
        } else {
            old
        };
        let version = t.take_version();
        t.remove(budget, hash, key, version, old);
        self.clean_slice_if_due();
        Ok(())
    }

    /// Write `f(current value)` under `key` with one index lookup (None:
    /// absent or expired), keeping a live object's deadline; returns the
    /// value written and its version. `Ok(Err(e))`: `f` refused, nothing
    /// written. What a read followed by a write on the version read would
    /// do, without the second lookup (Redis's `INCR`, `APPEND`, ...).
    pub fn modify<E>(
        &mut self,
        table: TableId,
        key: &[u8],
        f: impl FnOnce(Option<&[u8]>) -> Result<Vec<u8>, E>,
    ) -> Result<Result<(Vec<u8>, u64), E>, EngineError> {
        let (hash, slot, old) = self.locate(table, key)?;
        let live = old
            .map(|l| self.tablet(slot).object(l))
            .filter(|o| !o.is_expired_now(self));
        let expires_at_ms = live.map_or(0, |o| o.expires_at_ms);
        let new = match f(live.map(|o| o.value)) {
            Ok(new) => new,
            Err(e) => return Ok(Err(e)),
        };
        self.check_value(new.len())?;
        let version = self.put(slot, hash, key, &new, None, expires_at_ms, old)?;
        Ok(Ok((new, version)))
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
        self.install_expiring(table, key, value, version, 0)
    }

    /// `install` of an object with a deadline (Unix ms; 0: none): a move
    /// carries each object's deadline with it.
    pub fn install_expiring(
        &mut self,
        table: TableId,
        key: &[u8],
        value: &[u8],
        version: u64,
        expires_at_ms: u64,
    ) -> Result<(), EngineError> {
        self.check_value(value.len())?;
        // A version from elsewhere (a migration batch) is checked, never trusted.
        if version > crate::MAX_VERSION {
            return Err(EngineError::VersionExhausted { version });
        }
        let (hash, slot, old) = self.locate(table, key)?;
        // The entry's own version, expired or not: versions only grow.
        if self
            .raw_version_at(slot, old)
            .is_some_and(|current| current >= version)
        {
            // The held version is already >= `version`, so the counter is above it.
            debug_assert!(self.tablet(slot).next_version > version);
            return Ok(());
        }
        self.put(slot, hash, key, value, Some(version), expires_at_ms, old)
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
        // Raising to MAX_VERSION + 1 would leave nothing to issue: refused.
        if next_version > crate::MAX_VERSION {
            return Err(EngineError::VersionExhausted {
                version: next_version,
            });
        }
        if next_version <= self.tablet(slot).next_version {
            return Ok(());
        }
        let need = self.append_room(slot, entry::MAX_HEADER_BYTES, None);
        self.make_room(slot, need, Purpose::Object)?;
        let (t, budget) = self.tablet_and_budget(slot);
        t.raise_version(next_version);
        t.append_mark(budget);
        Ok(())
    }

    /// Write an object into tablet `slot`, superseding `old`. `version`
    /// `None` takes the next version; `Some(v)` installs `v` as given.
    #[allow(clippy::too_many_arguments)] // the object's fields and where it goes
    pub(crate) fn put(
        &mut self,
        slot: usize,
        hash: u64,
        key: &[u8],
        value: &[u8],
        version: Option<u64>,
        expires_at_ms: u64,
        old: Option<u64>,
    ) -> Result<u64, EngineError> {
        match version {
            Some(v) => debug_assert!(v <= crate::MAX_VERSION),
            None => self.tablet(slot).check_version_left()?,
        }
        if old.is_none() {
            self.reserve_index_room(slot)?;
        }
        // A new key may raise the room the head keeps for a tombstone.
        let len = entry::max_entry_bytes(key.len(), value.len());
        let need = self.append_room(slot, len, old.is_none().then_some(key.len()));
        let cleaned = self.make_room(slot, need, Purpose::Object)?;
        let (t, budget) = self.tablet_and_budget(slot);
        let old = if cleaned { t.find(hash, key) } else { old };
        let version = match version {
            Some(v) => {
                t.raise_version(v + 1); // v <= MAX_VERSION: no overflow
                v
            }
            None => t.take_version(),
        };
        t.put(budget, hash, key, value, version, expires_at_ms, old);
        self.clean_slice_if_due();
        Ok(version)
    }

    pub(crate) fn increment(
        &mut self,
        table: TableId,
        key: &[u8],
        rules: &RejectRules,
        add: impl FnOnce([u8; 8]) -> [u8; 8],
    ) -> Result<([u8; 8], u64), EngineError> {
        self.check_value(8)?;
        let (hash, slot, old) = self.locate(table, key)?;
        check_rules(rules, self.version_at(slot, old))?;
        // An expired object counts as absent; a live one keeps its deadline
        // (Redis's INCR keeps a key's TTL).
        let live = old
            .map(|l| self.tablet(slot).object(l))
            .filter(|o| !o.is_expired_now(self));
        let (current, expires_at_ms) = match live {
            Some(o) => (
                <[u8; 8]>::try_from(o.value)
                    .map_err(|_| EngineError::NotANumber { len: o.value.len() })?,
                o.expires_at_ms,
            ),
            None => ([0u8; 8], 0), // absent counts as 0 (the same bytes for i64 and f64)
        };
        let new = add(current);
        let version = self.put(slot, hash, key, &new, None, expires_at_ms, old)?;
        Ok((new, version))
    }
}
