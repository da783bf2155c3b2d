//! Routing (table, key hash) to a tablet, key and value checks, and the
//! tablet set itself: create, drop, split, list.

use crate::cleaner::Goal;
use crate::error::oom;
use crate::segment::Purpose;
use crate::tablet::Tablet;
use crate::{Budget, Engine, EngineError, HashRange, TableId, TabletStats, key_hash};

/// One routing entry: which tablet slot serves `start..=end` of a table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Route {
    pub start: u64,
    pub end: u64,
    pub slot: usize,
}

impl Engine {
    #[inline]
    pub(crate) fn route(&self, table: TableId, hash: u64) -> Option<usize> {
        let routes = self.routes.get(&table)?;
        let i = routes.partition_point(|r| r.start <= hash);
        let r = routes.get(i.checked_sub(1)?)?;
        (hash <= r.end).then_some(r.slot)
    }

    pub(crate) fn route_exact(&self, table: TableId, start_hash: u64) -> Option<usize> {
        let routes = self.routes.get(&table)?;
        let i = routes.binary_search_by_key(&start_hash, |r| r.start).ok()?;
        Some(routes[i].slot)
    }

    #[inline]
    pub(crate) fn tablet(&self, slot: usize) -> &Tablet {
        self.tablets[slot]
            .as_ref()
            .expect("a routed slot holds a tablet")
    }

    #[inline]
    pub(crate) fn tablet_mut(&mut self, slot: usize) -> &mut Tablet {
        self.tablets[slot]
            .as_mut()
            .expect("a routed slot holds a tablet")
    }

    /// The tablet in `slot` and the memory budget, borrowed together: an
    /// append charges the budget while it holds the tablet, which two
    /// `&mut self` accessors could not express.
    #[inline]
    pub(crate) fn tablet_and_budget(&mut self, slot: usize) -> (&mut Tablet, &mut Budget) {
        let Engine {
            tablets, budget, ..
        } = self;
        let t = tablets[slot]
            .as_mut()
            .expect("a routed slot holds a tablet");
        (t, budget)
    }

    pub(crate) fn tablet_at(
        &self,
        table: TableId,
        start_hash: u64,
    ) -> Result<&Tablet, EngineError> {
        let slot = self
            .route_exact(table, start_hash)
            .ok_or(EngineError::UnknownTablet)?;
        Ok(self.tablet(slot))
    }

    #[inline]
    /// Whether an object of this key and value length may be written: the
    /// checks a write makes before touching anything (a transaction makes
    /// them at prepare, so its commit does not fail on them).
    pub fn check_object(&self, key: &[u8], value_len: usize) -> Result<(), EngineError> {
        self.check_key(key)?;
        self.check_value(value_len)
    }

    pub(crate) fn check_key(&self, key: &[u8]) -> Result<(), EngineError> {
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
    pub(crate) fn check_value(&self, value_len: usize) -> Result<(), EngineError> {
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
    pub(crate) fn locate(
        &self,
        table: TableId,
        key: &[u8],
    ) -> Result<(u64, usize, Option<u64>), EngineError> {
        self.check_key(key)?;
        let hash = key_hash(table, key);
        let slot = self.route(table, hash).ok_or(EngineError::UnknownTablet)?;
        Ok((hash, slot, self.tablet(slot).find(hash, key)))
    }

    /// The version of the object at `loc` as reject rules see it: `None`
    /// if absent or expired (an expired object is absent to every caller).
    pub(crate) fn version_at(&self, slot: usize, loc: Option<u64>) -> Option<u64> {
        let o = self.tablet(slot).object(loc?);
        (!o.is_expired_now(self)).then_some(o.version)
    }

    /// The version of the entry at `loc`, expired or not: what keeps a
    /// key's versions growing (`install` never goes below it).
    pub(crate) fn raw_version_at(&self, slot: usize, loc: Option<u64>) -> Option<u64> {
        loc.map(|l| self.tablet(slot).object(l).version)
    }

    /// Create an empty tablet for `range` of `table`. Fails if it overlaps an existing one.
    pub fn create_tablet(&mut self, table: TableId, range: HashRange) -> Result<(), EngineError> {
        self.add_tablet(Tablet::new(table, range, 1)).map(|_| ())
    }

    pub(crate) fn check_free_range(
        &self,
        table: TableId,
        range: HashRange,
    ) -> Result<(), EngineError> {
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
    pub(crate) fn add_tablet(&mut self, t: Tablet) -> Result<usize, EngineError> {
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
    /// Both halves keep every object and side record in their range and the
    /// version counter; the half left in place then logs a record removal
    /// (one version each) for every record that moved (`split.rs`).
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
        // The index keeps only a hash prefix: entries of the split point's
        // own prefix are decided by their key's full hash (a log read).
        let split_prefix = t.prefixer.prefix(at);
        let in_upper = t
            .index
            .iter()
            .filter(|e| match e.prefix().cmp(&split_prefix) {
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Less => false,
                std::cmp::Ordering::Equal => crate::key_hash(table, t.object(e.loc()).key) >= at,
            })
            .count();
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
            let (t, budget) = engine.tablet_and_budget(slot);
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
}
