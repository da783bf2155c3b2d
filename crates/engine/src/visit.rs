//! Visiting a tablet: by log, by index, by given keys; copying it out for
//! migration; its raw segments.

use crate::error::oom;
use crate::{Engine, EngineError, ObjectRef, TableId, key_hash};

/// Which of a tablet's walks a visit takes.
#[derive(Clone, Copy)]
enum Walk {
    /// Its log segments, oldest first.
    Log,
    /// Its hash index.
    Index,
}

impl Engine {
    /// Walk the tablet as `walk` says with `f` behind the filter every
    /// visit puts between a tablet's walk and its caller: only objects not
    /// expired at the clock read before the walk.
    #[inline]
    fn walk_live(
        &self,
        table: TableId,
        start_hash: u64,
        walk: Walk,
        mut f: impl FnMut(ObjectRef<'_>),
    ) -> Result<(), EngineError> {
        let now = self.now_ms();
        let t = self.tablet_at(table, start_hash)?;
        let live = move |o: ObjectRef<'_>| {
            if !o.is_expired(now) {
                f(o)
            }
        };
        match walk {
            Walk::Log => t.for_each_log(live),
            Walk::Index => t.for_each_index(live),
        }
        Ok(())
    }

    /// Walk the tablet's log segments in order, calling `f` for every live object.
    #[inline]
    pub fn for_each_log(
        &self,
        table: TableId,
        start_hash: u64,
        f: impl FnMut(ObjectRef<'_>),
    ) -> Result<(), EngineError> {
        self.walk_live(table, start_hash, Walk::Log, f)
    }

    /// Iterate the tablet's hash index, calling `f` for every live object.
    pub fn for_each_index(
        &self,
        table: TableId,
        start_hash: u64,
        f: impl FnMut(ObjectRef<'_>),
    ) -> Result<(), EngineError> {
        self.walk_live(table, start_hash, Walk::Index, f)
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
        let now = self.now_ms();
        for key in keys {
            let found = if self.check_key(key).is_ok() {
                let hash = key_hash(table, key);
                if t.range.contains(hash) {
                    t.find(hash, key)
                        .map(|loc| t.object(loc))
                        .filter(|o| !o.is_expired(now))
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

    /// The live objects of a tablet, for migration, in log order, as (key,
    /// value, version, deadline (Unix ms; 0: none)); expired ones are left
    /// out. Collected so the caller may mutate the engine afterwards.
    #[allow(clippy::type_complexity)] // the contract's signature
    pub fn extract(
        &self,
        table: TableId,
        start_hash: u64,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>, u64, u64)>, EngineError> {
        let now = self.now_ms();
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
            if failed.is_some() || o.is_expired(now) {
                return;
            }
            match (copy(o.key), copy(o.value)) {
                (Ok(k), Ok(v)) if out.len() < out.capacity() => {
                    out.push((k, v, o.version, o.expires_at_ms))
                }
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
}
