//! Older versions of objects that committed transactions overwrote, kept
//! while a snapshot may read them: the multi-versioning behind snapshot
//! reads (`Request::Scan::snapshot_ts`, `snapshot.rs`).
//!
//! The log keeps only the newest version of an object in its index, so a
//! commit applied here copies the value it replaces into a *chain* keyed by
//! (table, key): `(commit_ts, value before it)`, oldest first. A snapshot at
//! `S` reads a key as the value before its first commit later than `S`, or
//! the key as it is when no kept commit is later than `S`.
//!
//! Why copies of the replaced values and not older log entries: the cleaner
//! and the index know only the newest entry of a key; keeping old entries
//! alive would reach into the engine's liveness rule, the cleaner's
//! relocation and replay. Copies cost memory only while snapshots are read,
//! they are charged to the memory budget, and they are bounded.
//!
//! When versions are kept: only while snapshots are being read here (one
//! arrived within `IDLE`). Otherwise nothing is copied, so transactions pay
//! nothing when nobody reads a snapshot. The first snapshot read after a
//! quiet time starts keeping, and the shard then learns a *floor* from the
//! oracle: every commit applied before keeping began has a timestamp at or
//! below it (its timestamp was handed out before the floor was), so a
//! snapshot at or above the floor finds every version it needs, and one
//! below it is refused (`SnapshotTooOld`; the client takes a fresh
//! timestamp, which is above the floor, and runs again).
//!
//! The floor only rises: when a kept version expires (`KEEP`), when the
//! budget or `MAX_BYTES` refuses to keep one, it rises to that commit's
//! timestamp, since only snapshots older than that commit needed it. A
//! tablet that arrives on this shard (a move, a recovery) brings objects
//! whose replaced versions were never kept here: `arrive` forgets what was
//! kept for its keys and gives it a floor of its own, learned from the
//! oracle after it arrived, so only snapshots of that tablet are refused
//! meanwhile, not those of the shard's other tablets.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use insitu_engine::TransientCharge;

/// How long a kept version lives: the longest a snapshot read may take from
/// its timestamp to its last tablet. Why 30 s: a scan of a tablet takes
/// milliseconds to seconds; a longer bound only holds memory.
pub const KEEP: Duration = Duration::from_secs(30);
/// Keeping stops this long after the last snapshot read (the versions go).
pub const IDLE: Duration = Duration::from_secs(30);
/// At most this many bytes of kept versions per shard; beyond it the oldest
/// go first (and the floor rises). Why a limit beside the budget: a burst of
/// commits under a snapshot must not take the memory writes need.
pub const MAX_BYTES: usize = 64 << 20;
/// Bookkeeping bytes counted per kept version beside its key and value.
const ENTRY_OVERHEAD: usize = 64;

/// One kept version: the value a commit replaced.
struct Kept {
    /// The commit that replaced it: snapshots before this read `before`.
    commit_ts: u64,
    /// The value before the commit; None: the key was absent.
    before: Option<Vec<u8>>,
    /// Its memory, released when the version goes.
    _charge: TransientCharge,
}

/// A key's kept versions, oldest first, and its key hash (to find a
/// tablet's keys without hashing every key again).
struct Chain {
    hash: u64,
    kept: VecDeque<Kept>,
}

/// A shard's kept versions and what snapshots may be read (see the module).
#[derive(Default)]
pub struct Versions {
    /// Versions are being kept: a snapshot read arrived within `IDLE`.
    active: bool,
    /// When the last snapshot read arrived; keeping stops `IDLE` after it.
    last_read: Option<Instant>,
    /// Snapshots below this cannot be read here. None: not learned yet since
    /// keeping began (a fetch from the oracle is due).
    floor: Option<u64>,
    /// A fetch of the floor is under way (one at a time).
    pub(crate) fetching: bool,
    /// Bumped by every `reset`: a floor fetched or a scan begun before it
    /// does not count after it.
    generation: u64,
    /// Tablets that arrived since keeping began, (table, start hash) ->
    /// (their arrival's number, the floor learned after it; None: due).
    /// Their snapshots need both floors.
    arrived: HashMap<(u64, u64), (u64, Option<u64>)>,
    /// Numbers arrivals, so a floor fetched before a newer one does not count.
    arrivals: u64,
    /// (table, key) -> its kept versions.
    chains: HashMap<(u64, Vec<u8>), Chain>,
    /// Every kept version in the order it was kept (when, table, key), so
    /// expiry drops the oldest first (a key's oldest is its chain's front).
    order: VecDeque<(Instant, u64, Vec<u8>)>,
    /// Bytes of kept versions (keys, values, `ENTRY_OVERHEAD` each).
    bytes: usize,
}

/// What a snapshot scan of one tablet needs from the kept versions: the keys
/// changed after the snapshot (the scan skips their current value) and their
/// value as of the snapshot (None: absent then).
pub struct Changed {
    pub keys: std::collections::HashSet<Vec<u8>>,
    pub values: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl Versions {
    pub fn is_active(&self) -> bool {
        self.active
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    #[cfg(test)]
    pub fn floor(&self) -> Option<u64> {
        self.floor
    }

    /// The floor for snapshots of the tablet `(table, start)`: the shard's,
    /// or the tablet's own if it arrived since and is higher. None: one of
    /// them is still to be learned.
    pub fn floor_for(&self, tablet: (u64, u64)) -> Option<u64> {
        let shard = self.floor?;
        match self.arrived.get(&tablet) {
            None => Some(shard),
            Some((_, own)) => own.map(|f| f.max(shard)),
        }
    }

    /// What a floor fetch for `tablet` must still match when it returns:
    /// (generation, the tablet's arrival number).
    pub fn fetch_tag(&self, tablet: (u64, u64)) -> (u64, Option<u64>) {
        (self.generation, self.arrived.get(&tablet).map(|(n, _)| *n))
    }

    /// The oracle's answer to a floor fetch tagged `tag` (`fetch_tag`) for
    /// `tablet`: every commit applied before keeping began (or before the
    /// tablet arrived) is at or below `ts`.
    pub fn set_floors(&mut self, tablet: (u64, u64), tag: (u64, Option<u64>), ts: u64) {
        if self.floor.is_none() {
            self.set_floor(tag.0, ts);
        }
        if let (Some(n), Some((m, own))) = (tag.1, self.arrived.get_mut(&tablet))
            && n == *m
            && own.is_none()
        {
            *own = Some(ts);
        }
    }

    /// A tablet arrived here (`table`, hash range `start..=end`): what was
    /// kept for its keys belongs to an earlier stay, and its objects'
    /// replaced versions were not kept here, so its snapshots need a floor
    /// learned after now.
    pub fn arrive(&mut self, table: u64, (start, end): (u64, u64)) {
        if !self.active {
            return; // nothing kept; the shard's floor will be learned after now
        }
        let gone: Vec<(u64, Vec<u8>)> = self
            .chains
            .iter()
            .filter(|((t, _), c)| *t == table && (start..=end).contains(&c.hash))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            if let Some(chain) = self.chains.remove(&k) {
                for kept in chain.kept {
                    self.bytes -=
                        k.1.len() + kept.before.as_ref().map_or(0, Vec::len) + ENTRY_OVERHEAD;
                }
            }
        }
        self.arrivals += 1;
        self.arrived.insert((table, start), (self.arrivals, None));
    }

    /// The arrival number of `tablet` (None: not arrived since keeping began).
    pub fn arrival(&self, tablet: (u64, u64)) -> Option<u64> {
        self.arrived.get(&tablet).map(|(n, _)| *n)
    }

    #[cfg(test)]
    pub fn kept_bytes(&self) -> usize {
        self.bytes
    }

    /// Forget every kept version and the floor (a tablet arrived, or reads
    /// stopped): the next snapshot read starts afresh.
    pub fn reset(&mut self) {
        self.active = false;
        self.floor = None;
        self.generation += 1;
        self.chains.clear();
        self.order.clear();
        self.arrived.clear();
        self.bytes = 0;
    }

    /// A snapshot read arrived: keep versions from now on.
    pub fn note_read(&mut self, now: Instant) {
        self.active = true;
        self.last_read = Some(now);
    }

    /// The oracle's answer to the floor fetch begun in `generation`: every
    /// commit applied before keeping began is at or below `ts`.
    pub fn set_floor(&mut self, generation: u64, ts: u64) {
        if generation == self.generation && self.active {
            self.floor = Some(self.floor.map_or(ts, |f| f.max(ts)));
        }
    }

    /// No snapshot below `ts` can be read any more.
    fn raise_floor(&mut self, ts: u64) {
        if let Some(f) = self.floor.as_mut() {
            *f = (*f).max(ts);
        }
    }

    /// A commit at `commit_ts` is about to replace `before` (None: absent)
    /// under `(table, key)`. Kept only while snapshots are read; `charge`
    /// asks the memory budget (refused: the version is not kept and the
    /// floor rises past this commit instead).
    pub fn keep(
        &mut self,
        (table, key, hash): (u64, &[u8], u64),
        commit_ts: u64,
        before: Option<&[u8]>,
        now: Instant,
        charge: impl FnOnce(u64) -> Option<TransientCharge>,
    ) {
        if !self.active || commit_ts == 0 {
            return;
        }
        let size = key.len() + before.map_or(0, <[u8]>::len) + ENTRY_OVERHEAD;
        while self.bytes + size > MAX_BYTES && self.drop_oldest() {}
        let Some(charge) = (self.bytes + size <= MAX_BYTES)
            .then(|| charge(size as u64))
            .flatten()
        else {
            self.raise_floor(commit_ts);
            return;
        };
        let chain = self
            .chains
            .entry((table, key.to_vec()))
            .or_insert_with(|| Chain {
                hash,
                kept: VecDeque::new(),
            });
        // Commits of one key come in timestamp order: each took its
        // timestamp while it held the key's lock, after the previous one.
        debug_assert!(chain.kept.back().is_none_or(|k| k.commit_ts < commit_ts));
        chain.kept.push_back(Kept {
            commit_ts,
            before: before.map(<[u8]>::to_vec),
            _charge: charge,
        });
        self.order.push_back((now, table, key.to_vec()));
        self.bytes += size;
    }

    /// Drop the oldest kept version (raising the floor past its commit).
    fn drop_oldest(&mut self) -> bool {
        let Some((_, table, key)) = self.order.pop_front() else {
            return false;
        };
        let mut ts = None;
        let mut empty = false;
        if let Some(chain) = self.chains.get_mut(&(table, key.clone())) {
            if let Some(k) = chain.kept.pop_front() {
                self.bytes -= key.len() + k.before.as_ref().map_or(0, Vec::len) + ENTRY_OVERHEAD;
                ts = Some(k.commit_ts);
            }
            empty = chain.kept.is_empty();
        }
        if empty {
            self.chains.remove(&(table, key));
        }
        if let Some(ts) = ts {
            self.raise_floor(ts);
        }
        true
    }

    /// Drop versions kept longer than `KEEP`; stop keeping `IDLE` after the
    /// last snapshot read. Called by the shard's periodic sweep.
    pub fn expire(&mut self, now: Instant) {
        if self.active
            && self
                .last_read
                .is_some_and(|t| now.duration_since(t) >= IDLE)
        {
            self.reset();
            return;
        }
        while self
            .order
            .front()
            .is_some_and(|(t, ..)| now.duration_since(*t) >= KEEP)
        {
            self.drop_oldest();
        }
    }

    /// The keys of `table` with hash in `start..=end` that a commit later
    /// than `snapshot` changed, and their values as of `snapshot`.
    pub fn changed_after(&self, table: u64, (start, end): (u64, u64), snapshot: u64) -> Changed {
        let mut out = Changed {
            keys: Default::default(),
            values: Vec::new(),
        };
        for ((t, key), chain) in &self.chains {
            if *t != table || !(start..=end).contains(&chain.hash) {
                continue;
            }
            if let Some(k) = chain.kept.iter().find(|k| k.commit_ts > snapshot) {
                out.keys.insert(key.clone());
                out.values.push((key.clone(), k.before.clone()));
            }
        }
        out
    }
}

#[cfg(test)]
#[path = "versions_tests.rs"]
mod tests;
