//! A participant's write locks: which transaction holds each key it will
//! write, and the key's hash (its tablet). Plain writes probe it on every
//! write while any lock is held, moves and bulk updates ask it about a
//! tablet, snapshot reads wait for the holders it names.

use std::collections::HashSet;
use std::hash::RandomState;

use crate::item::TxnId;

/// A lock-map key borrowed from a request: hashes as `(u64, Vec<u8>)` does
/// (the derive hashes the fields in order, and `Vec<u8>` hashes as its
/// slice), and compares equal to it, so lookups need no owned copy.
#[derive(Hash)]
pub(crate) struct KeyRef<'a>(pub u64, pub &'a [u8]);

impl hashbrown::Equivalent<(u64, Vec<u8>)> for KeyRef<'_> {
    fn equivalent(&self, key: &(u64, Vec<u8>)) -> bool {
        self.0 == key.0 && self.1 == key.1.as_slice()
    }
}

/// The write locks of one participant (one shard).
#[derive(Debug)]
pub struct Locks {
    /// (table, key) -> (holder, key hash). hashbrown's map so a plain
    /// write's check probes it with a borrowed key (`KeyRef`) instead of
    /// copying the key; std's `RandomState`, since keys come from clients
    /// (a seeded SipHash resists collision floods).
    map: hashbrown::HashMap<(u64, Vec<u8>), (TxnId, u64), RandomState>,
}

impl Default for Locks {
    fn default() -> Self {
        Locks {
            map: hashbrown::HashMap::with_hasher(RandomState::new()),
        }
    }
}

impl Locks {
    /// The transaction holding the lock of `key` of `table`, if any.
    pub fn holder(&self, table: u64, key: &[u8]) -> Option<TxnId> {
        // A miss is the common case: no allocation, one probe (and none
        // while no lock is held).
        if self.map.is_empty() {
            return None;
        }
        self.map.get(&KeyRef(table, key)).map(|&(by, _)| by)
    }

    /// Whether a transaction holds the lock of `key` of `table`: plain
    /// writes to it wait (the caller answers Retry).
    pub fn is_locked(&self, table: u64, key: &[u8]) -> bool {
        self.holder(table, key).is_some()
    }

    /// Locks held on keys of `table` with hash in `start..=end` (a tablet):
    /// a tablet is moved or updated in bulk only when it has none.
    pub fn count_in(&self, table: u64, start: u64, end: u64) -> usize {
        self.map
            .iter()
            .filter(|((t, _), (_, h))| *t == table && (start..=end).contains(h))
            .count()
    }

    /// The transactions holding locks on keys of `table` with hash in
    /// `start..=end`: a snapshot read of that tablet waits for them.
    pub fn holders_in(&self, table: u64, start: u64, end: u64) -> HashSet<TxnId> {
        self.map
            .iter()
            .filter(|((t, _), (_, h))| *t == table && (start..=end).contains(h))
            .map(|(_, (txn, _))| *txn)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Lock `key` of `table` (hash `hash`) for `txn`.
    pub(crate) fn lock(&mut self, table: u64, key: &[u8], txn: TxnId, hash: u64) {
        self.map.insert((table, key.to_vec()), (txn, hash));
    }

    /// Release the lock of `key` of `table`; returns its holder.
    pub(crate) fn unlock(&mut self, table: u64, key: &[u8]) -> Option<TxnId> {
        self.map.remove(&KeyRef(table, key)).map(|(by, _)| by)
    }

    /// Every lock: ((table, key), holder).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&(u64, Vec<u8>), TxnId)> {
        self.map.iter().map(|(k, (by, _))| (k, *by))
    }
}
