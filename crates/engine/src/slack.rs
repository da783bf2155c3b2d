//! The room a head keeps for one tombstone: why a tablet's first remove
//! succeeds on a full budget even when its segments hold nothing to reclaim
//! and another tablet holds the remove reserve (ARCHITECTURE.md, "Why a
//! remove succeeds on a full budget").
//!
//! Every append to a head other than a removal (a tombstone or a record
//! removal) leaves `Tablet::tombstone_slack` bytes free behind it: room for
//! a tombstone of any key the tablet holds. A removal may use that room, so
//! a remove finds room in its own head however full the budget is, unless
//! an earlier removal in the same head used it already (then the removed
//! objects' dead entries are what compaction reclaims).
//!
//! The slack covers the keys the tablet holds, not the largest key allowed:
//! live objects are counted by key-length class (powers of two), and the
//! slack is a tombstone for the top of the highest class present, so it is
//! at most one tombstone of twice the longest live key.

use crate::entry;
use crate::segment::{Budget, Purpose};
use crate::tablet::Tablet;
use crate::{EngineError, MAX_KEY_BYTES};

/// Key-length classes: class `c` holds the lengths of bit length `c`
/// (`2^(c-1)..2^c`), class 0 the empty key; 18 classes reach 64 KiB.
const CLASSES: usize = (usize::BITS - MAX_KEY_BYTES.leading_zeros()) as usize + 1;

/// Live objects of a tablet by key-length class: what bounds its longest
/// live key while keys come and go (a running maximum could never shrink).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyClasses {
    /// Live objects per class.
    counts: [u64; CLASSES],
}

impl KeyClasses {
    fn class(key_len: usize) -> usize {
        debug_assert!(key_len <= MAX_KEY_BYTES, "key longer than any allowed");
        (usize::BITS - key_len.leading_zeros()) as usize
    }

    /// Longest key length of class `c` (capped at the largest key allowed).
    fn top(c: usize) -> usize {
        ((1usize << c) - 1).min(MAX_KEY_BYTES)
    }

    pub fn add(&mut self, key_len: usize) {
        self.counts[Self::class(key_len)] += 1;
    }

    pub fn remove(&mut self, key_len: usize) {
        let n = &mut self.counts[Self::class(key_len)];
        assert!(*n > 0, "removing a key length no live object has");
        *n -= 1;
    }

    /// Bound on the longest live key (`None`: no live object).
    fn longest(&self) -> Option<usize> {
        self.counts.iter().rposition(|&n| n > 0).map(Self::top)
    }
}

/// Room for a tombstone of a key of up to `key_len` bytes (room checks use
/// the widest header, as `Engine::remove` does).
fn tombstone_room(key_len: usize) -> usize {
    entry::max_entry_bytes(key_len, entry::TOMBSTONE_VALUE_BYTES)
}

impl Tablet {
    /// The room a head keeps behind every append but a removal: one
    /// tombstone for any key this tablet holds (0 while it holds none).
    pub fn tombstone_slack(&self) -> usize {
        self.key_classes.longest().map_or(0, tombstone_room)
    }

    /// The slack once an object with a `key_len`-byte key is added.
    pub fn tombstone_slack_with(&self, key_len: usize) -> usize {
        self.tombstone_slack()
            .max(tombstone_room(KeyClasses::top(KeyClasses::class(key_len))))
    }

    /// Head room an append of `len` bytes (not a removal) asks for: `len`
    /// and `slack` behind it, but never more than a fresh head holds (an
    /// entry within `slack` bytes of a whole segment goes without it), and
    /// just `len` while the head's slack is waived (`slack_waived`).
    pub fn append_room(&self, len: usize, slack: usize, segment_bytes: usize) -> usize {
        if self.slack_waived {
            return len;
        }
        let fresh = segment_bytes - entry::MAX_HEADER_BYTES;
        (len + slack).min(fresh).max(len)
    }

    /// Open a new head unless the current one has `append_room` for `len`
    /// bytes with `slack` behind them: the off-line appends' (split, replay)
    /// room step, which never cleans.
    pub(crate) fn make_room_offline(
        &mut self,
        budget: &mut Budget,
        len: usize,
        slack: usize,
    ) -> Result<(), EngineError> {
        let need = self.append_room(len, slack, budget.segment_bytes);
        if self.head_room(budget.segment_bytes) < need {
            self.open_head(budget, Purpose::Object)?;
        }
        Ok(())
    }

    /// Append a new object while building a tablet off-line (split, replay):
    /// opens heads as needed (keeping the slack) but never cleans.
    pub fn push_new(
        &mut self,
        budget: &mut Budget,
        hash: u64,
        key: &[u8],
        value: &[u8],
        version: u64,
        expires_at_ms: u64,
    ) -> Result<(), EngineError> {
        let len = entry::entry_bytes_expiring(key.len(), value.len(), version, expires_at_ms);
        self.make_room_offline(budget, len, self.tombstone_slack_with(key.len()))?;
        self.reserve_index(budget, 1)?;
        self.put(budget, hash, key, value, version, expires_at_ms, None);
        Ok(())
    }

    /// Recount the key classes from the index (O(objects): for checks).
    pub fn count_key_classes(&self) -> KeyClasses {
        let mut classes = KeyClasses::default();
        for e in self.index.iter() {
            classes.add(self.object(e.loc()).key.len());
        }
        classes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slack_covers_the_longest_live_key_and_shrinks_with_it() {
        let mut c = KeyClasses::default();
        assert_eq!(c.longest(), None);
        c.add(0);
        assert_eq!(c.longest(), Some(0));
        c.add(30);
        assert_eq!(c.longest(), Some(31), "30 is in class 16..=31");
        c.add(MAX_KEY_BYTES);
        assert_eq!(
            c.longest(),
            Some(MAX_KEY_BYTES),
            "capped at the largest key"
        );
        c.remove(MAX_KEY_BYTES);
        assert_eq!(c.longest(), Some(31));
        c.remove(30);
        c.remove(0);
        assert_eq!(c, KeyClasses::default());
        for len in [0, 1, 2, 3, 4, 100, 4096, 40_000, MAX_KEY_BYTES] {
            let top = KeyClasses::top(KeyClasses::class(len));
            assert!(
                len <= top && top <= (2 * len).clamp(1, MAX_KEY_BYTES),
                "{len}: {top}"
            );
        }
    }
}
