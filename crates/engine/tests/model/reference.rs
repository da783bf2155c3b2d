//! The reference model: a `BTreeMap` of what the engine must hold, with
//! deadlines and the pinned clock, and the specification of reject rules.
//!
//! Apart from the harness (`harness.rs`) because it is the specification,
//! written independently of the engine (only its types and `key_hash`, to
//! say which tablet holds a key): the harness drives the engine and this
//! side by side and compares them.

use std::collections::{BTreeMap, HashMap};

use insitu_engine::{EngineError, HashRange, RejectRules, TableId, key_hash};

/// The specification of reject rules, written independently of the engine.
pub(super) fn expected_rules(r: &RejectRules, current: Option<u64>) -> Result<(), EngineError> {
    match current {
        None if r.doesnt_exist => Err(EngineError::ObjectDoesntExist),
        None => Ok(()),
        Some(v) if r.exists => Err(EngineError::ObjectExists { version: v }),
        Some(v) if r.version_le_given && v <= r.given_version => {
            Err(EngineError::WrongVersion { version: v })
        }
        Some(v) if r.version_ne_given && v != r.given_version => {
            Err(EngineError::WrongVersion { version: v })
        }
        Some(_) => Ok(()),
    }
}

pub(super) type Key = (TableId, Vec<u8>);

#[derive(Default)]
pub(super) struct Model {
    /// Every object the engine holds, expired ones too until removed.
    pub(super) objects: BTreeMap<Key, (Vec<u8>, u64)>,
    /// Deadlines of the objects that have one.
    pub(super) deadlines: HashMap<Key, u64>,
    /// The engine's pinned clock.
    pub(super) now: u64,
    /// Highest version ever returned for a key (survives removes).
    pub(super) highest: HashMap<Key, u64>,
}

impl Model {
    pub(super) fn expired(&self, key: &Key) -> bool {
        self.deadlines.get(key).is_some_and(|&d| d <= self.now)
    }

    /// The live object of `key`: absent once its deadline passed.
    pub(super) fn live(&self, key: &Key) -> Option<&(Vec<u8>, u64)> {
        self.objects.get(key).filter(|_| !self.expired(key))
    }

    /// The live object of `key` and the deadline an update of it keeps (0 if none).
    pub(super) fn live_and_kept(&self, key: &Key) -> (Option<(Vec<u8>, u64)>, u64) {
        let current = self.live(key).cloned();
        let kept = match current {
            Some(_) => self.deadlines.get(key).copied().unwrap_or(0),
            None => 0,
        };
        (current, kept)
    }

    /// The version reject rules see (the live object's).
    pub(super) fn current(&self, key: &Key) -> Option<u64> {
        self.live(key).map(|o| o.1)
    }

    pub(super) fn record(&mut self, key: Key, value: Vec<u8>, version: u64) {
        self.record_expiring(key, value, version, 0);
    }

    pub(super) fn record_expiring(
        &mut self,
        key: Key,
        value: Vec<u8>,
        version: u64,
        deadline: u64,
    ) {
        let prev = self.highest.get(&key).copied().unwrap_or(0);
        assert!(
            version > prev,
            "version {version} of {key:?} does not exceed {prev}"
        );
        self.highest.insert(key.clone(), version);
        match deadline {
            0 => self.deadlines.remove(&key),
            d => self.deadlines.insert(key.clone(), d),
        };
        self.objects.insert(key, (value, version));
    }

    pub(super) fn remove(&mut self, key: &Key) {
        self.objects.remove(key);
        self.deadlines.remove(key);
    }

    /// The live objects of a tablet.
    pub(super) fn live_in_range(
        &self,
        table: TableId,
        range: HashRange,
    ) -> impl Iterator<Item = (&Key, &(Vec<u8>, u64))> {
        self.in_range(table, range)
            .filter(|(k, _)| !self.expired(k))
    }

    pub(super) fn in_range(
        &self,
        table: TableId,
        range: HashRange,
    ) -> impl Iterator<Item = (&Key, &(Vec<u8>, u64))> {
        self.objects
            .iter()
            .filter(move |((t, k), _)| *t == table && range.contains(key_hash(*t, k)))
    }
}
