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
//! whose replaced versions were never kept here: `arrive` gives it a floor
//! of its own. A moved tablet carries it: a bound on every commit applied
//! to it before (`commit_bound.rs`), usually far below the move, so
//! snapshots taken before the move are still read. A recovered one learns
//! it from the oracle after it arrived. Only snapshots of that tablet below
//! it are refused, not those of the shard's other tablets.
//!
//! Nothing here walks all kept versions at once (a shard must never stall):
//! a reset or an arrival forgets nothing eagerly, and versions go a bounded
//! number per sweep (`DRAIN_PER_SWEEP`) or one per new one over the byte
//! limit. Why stale versions are harmless: every version kept before a
//! reset or before a tablet's arrival has a commit timestamp below the
//! floor learned after it (that commit's timestamp was handed out before
//! the floor was), and a snapshot read only ever looks for the first kept
//! commit *later* than its timestamp, which is at or above that floor.
//!
//! A kept object carries its deadline, and is absent to a snapshot at or
//! past it (`expired_at`): the snapshot judges expiry at its own instant,
//! in the engine too (`clock_ms_at`, ARCHITECTURE.md, "Expiry under
//! snapshots"). So the object a write replaces is kept even when its
//! deadline has passed: an older snapshot may still see it.
//!
//! A snapshot scan reads the kept versions lazily: each object it visits is
//! looked up (`as_of`; only when its table has kept versions), and the
//! values as of the snapshot are fed afterwards in bounded batches walked in
//! hash order (`changed_in`), so a tablet is a range. Each kept version
//! carries a sequence number: a scan counts only those kept before its
//! attempt began, so a commit applied while it feeds (between batches) is
//! not read twice.

use std::collections::{BTreeSet, HashMap, VecDeque};

/// Looked up once per object a snapshot scan visits: hashbrown's default
/// hasher is several times faster than std's on short keys.
type FastMap<K, V> = hashbrown::HashMap<K, V>;
use std::ops::Bound;
use std::rc::Rc;
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
/// At most this many versions go between two yields of the sweep (about a
/// millisecond: a version's removal costs up to ~1.3 us when 64 MiB are kept).
pub const DRAIN_PER_STEP: usize = 1024;

/// A key as kept here: one copy shared by its chain, its place in the hash
/// order and the expiry queue.
type Key = Rc<[u8]>;

/// One kept version: the value a commit replaced.
struct Kept {
    /// The commit that replaced it: snapshots before this read `before`.
    commit_ts: u64,
    /// Its number in the order versions were kept (see `Versions::next_seq`).
    seq: u64,
    /// The object before the commit; None: the key was absent.
    before: Option<KeptObject>,
    /// Its memory, released when the version goes.
    _charge: TransientCharge,
}

/// An object a commit replaced, as kept.
struct KeptObject {
    version: u64,
    value: Box<[u8]>,
    /// Its deadline (Unix ms; 0: none): a snapshot at or after it reads
    /// the key as absent (`expired_at`), as the engine would have then.
    expires_at_ms: u64,
}

/// The object a commit is about to replace, as `Versions::keep` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Before<'a> {
    pub version: u64,
    pub value: &'a [u8],
    /// Its deadline (Unix ms; 0: none), whether or not it has passed: a
    /// snapshot older than the deadline still sees the object.
    pub expires_at_ms: u64,
}

impl<'a> From<insitu_engine::ObjectRef<'a>> for Before<'a> {
    fn from(o: insitu_engine::ObjectRef<'a>) -> Before<'a> {
        Before {
            version: o.version,
            value: o.value,
            expires_at_ms: o.expires_at_ms,
        }
    }
}

/// The engine's clock (Unix ms) at snapshot `ts`: an object whose deadline
/// is at or before it is absent at the snapshot. Why `ts / 1000`: the
/// oracle's timestamps follow the wall clock in microseconds, so a
/// snapshot's instant is its timestamp; judging every read at that one
/// instant is what keeps a snapshot repeatable while deadlines pass. (The
/// oracle may run ahead of the clock after a coordinator restart; a
/// snapshot then judges expiry ahead of plain reads, still at one instant.)
pub fn clock_ms_at(ts: u64) -> u64 {
    ts / 1000
}

/// Whether an object with deadline `expires_at_ms` (0: none) is absent at
/// snapshot `ts`: the engine's own rule, at the snapshot's clock.
#[inline]
pub fn expired_at(expires_at_ms: u64, ts: u64) -> bool {
    expires_at_ms != 0 && expires_at_ms <= clock_ms_at(ts)
}

/// A key's kept versions, oldest first (commit timestamps increasing), and
/// its key hash (its place in `TableVersions::by_hash`).
struct Chain {
    hash: u64,
    kept: VecDeque<Kept>,
}

/// One table's kept versions.
#[derive(Default)]
struct TableVersions {
    /// key -> its chain: the lookup of a scanned object.
    by_key: FastMap<Key, Chain>,
    /// The latest commit kept here: a snapshot at or after it finds no key
    /// of the table changed, and looks nothing up. Not lowered when versions
    /// go (it only costs lookups).
    max_commit_ts: u64,
    /// (key hash, key) of every chain: a tablet's keys are a range.
    by_hash: BTreeSet<(u64, Key)>,
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
    /// The highest commit whose version went (or was never kept) while
    /// keeping: every floor is at least this. Why apart from `floor`: a
    /// version may go before the floor is learned. Never lowered (a stale
    /// value is below any floor learned later, so it costs nothing).
    raised: u64,
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
    /// table -> its kept versions.
    tables: FastMap<u64, TableVersions>,
    /// Every kept version in the order it was kept (when, table, key), so
    /// expiry drops the oldest first (a key's oldest is its chain's front).
    order: VecDeque<(Instant, u64, Key)>,
    /// The sequence number of the next version kept.
    seq: u64,
    /// Bytes of kept versions (keys, values, `ENTRY_OVERHEAD` each).
    bytes: usize,
    /// Per table, what the commits applied here are at or below: the floor
    /// a tablet moving out carries (`commit_bound.rs`). Kept whether or not
    /// versions are, and never reset (a commit applied stays applied).
    pub(crate) commits: crate::commit_bound::CommitBounds,
}

/// Where a walk of changed keys (`Versions::changed_in`) goes on from.
pub type Resume = (u64, Key);

impl Versions {
    pub fn is_active(&self) -> bool {
        self.active
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    #[cfg(test)]
    pub fn floor(&self) -> Option<u64> {
        self.floor.map(|f| f.max(self.raised))
    }

    /// The floor for snapshots of the tablet `(table, start)`: the shard's,
    /// or the tablet's own if it arrived since keeping began. None: it is
    /// still to be learned. Why not the shard's floor too for an arrived
    /// tablet: that floor bounds the commits applied here before keeping
    /// began, and none of them touched the tablet's objects as they
    /// arrived (a commit to them in an earlier stay here is below the bound
    /// it carried back, `commit_bound.rs`). Every commit applied to it here
    /// since it arrived was kept, or raised the floor (`raised`).
    pub fn floor_for(&self, tablet: (u64, u64)) -> Option<u64> {
        match self.arrived.get(&tablet) {
            None => Some(self.floor?.max(self.raised)),
            Some((_, own)) => own.map(|f| f.max(self.raised)),
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

    /// A tablet arrived here (`table`, hash range `start..=_end`): its
    /// objects' replaced versions were not kept here, so its snapshots need
    /// a floor of their own: `carried`, the bound on every commit applied
    /// to it before (`commit_bound.rs`), or if none is known (a recovery)
    /// one learned from the oracle after now. What was kept for its keys in
    /// an earlier stay stays until it expires: it is below that floor
    /// (module doc, and `commit_bound.rs`).
    pub fn arrive(&mut self, table: u64, (start, _end): (u64, u64), carried: Option<u64>) {
        self.commits.arrived(table, carried);
        if !self.active {
            return; // nothing kept; the shard's floor will be learned after now
        }
        self.arrivals += 1;
        self.arrived
            .insert((table, start), (self.arrivals, carried));
    }

    /// The arrival number of `tablet` (None: not arrived since keeping began).
    pub fn arrival(&self, tablet: (u64, u64)) -> Option<u64> {
        self.arrived.get(&tablet).map(|(n, _)| *n)
    }

    #[cfg(test)]
    pub fn kept_bytes(&self) -> usize {
        self.bytes
    }

    /// Stop keeping and forget the floor (reads stopped): the next snapshot
    /// read starts afresh. What was kept goes by the sweep (`expire`).
    pub fn reset(&mut self) {
        self.active = false;
        self.floor = None;
        self.generation += 1;
        self.arrived.clear();
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
        self.raised = self.raised.max(ts);
    }

    /// A commit at `commit_ts` is about to replace `before` (None: absent)
    /// under `(table, key)`. Kept only while snapshots are read; `charge`
    /// asks the memory budget (refused: the version is not kept and the
    /// floor rises past this commit instead).
    pub fn keep(
        &mut self,
        (table, key, hash): (u64, &[u8], u64),
        commit_ts: u64,
        before: Option<Before<'_>>,
        now: Instant,
        charge: impl FnOnce(u64) -> Option<TransientCharge>,
    ) {
        if !self.active || commit_ts == 0 {
            return;
        }
        let size = key.len() + before.map_or(0, |b| b.value.len()) + ENTRY_OVERHEAD;
        while self.bytes + size > MAX_BYTES && self.drop_oldest() {}
        let Some(charge) = (self.bytes + size <= MAX_BYTES)
            .then(|| charge(size as u64))
            .flatten()
        else {
            self.raise_floor(commit_ts);
            return;
        };
        let t = self.tables.entry(table).or_default();
        t.max_commit_ts = t.max_commit_ts.max(commit_ts);
        let k: Key = match t.by_key.get_key_value(key) {
            Some((k, _)) => k.clone(),
            None => {
                let k: Key = Rc::from(key);
                t.by_hash.insert((hash, k.clone()));
                let chain = Chain {
                    hash,
                    kept: VecDeque::new(),
                };
                t.by_key.insert(k.clone(), chain);
                k
            }
        };
        let chain = t.by_key.get_mut(&k).expect("just found or made");
        // Commits of one key come in timestamp order: each took its
        // timestamp while it held the key's lock, after the previous one.
        debug_assert!(chain.kept.back().is_none_or(|k| k.commit_ts < commit_ts));
        chain.kept.push_back(Kept {
            commit_ts,
            seq: self.seq,
            before: before.map(|b| KeptObject {
                version: b.version,
                value: Box::from(b.value),
                expires_at_ms: b.expires_at_ms,
            }),
            _charge: charge,
        });
        self.seq += 1;
        self.order.push_back((now, table, k));
        self.bytes += size;
    }

    /// Drop the oldest kept version (raising the floor past its commit).
    fn drop_oldest(&mut self) -> bool {
        let Some((_, table, key)) = self.order.pop_front() else {
            return false;
        };
        let Some(t) = self.tables.get_mut(&table) else {
            debug_assert!(false, "a kept version's table is gone");
            return true;
        };
        let mut gone = None;
        if let Some(chain) = t.by_key.get_mut(&key) {
            // The oldest kept version of all is its key's oldest.
            if let Some(k) = chain.kept.pop_front() {
                self.bytes -=
                    key.len() + k.before.as_ref().map_or(0, |b| b.value.len()) + ENTRY_OVERHEAD;
                gone = Some(k.commit_ts);
            }
            if chain.kept.is_empty() {
                let hash = chain.hash;
                t.by_key.remove(&key);
                t.by_hash.remove(&(hash, key));
                if t.by_key.is_empty() {
                    self.tables.remove(&table);
                }
            }
        }
        if let Some(ts) = gone {
            self.raise_floor(ts);
        }
        true
    }

    /// Drop versions kept longer than `KEEP`, or all of them once keeping
    /// stopped; stop keeping `IDLE` after the last snapshot read. At most
    /// `DRAIN_PER_STEP` go per call: true if more are due (the caller
    /// yields and calls again). Called by the shard's periodic sweep.
    pub fn expire(&mut self, now: Instant) -> bool {
        if self.active
            && self
                .last_read
                .is_some_and(|t| now.duration_since(t) >= IDLE)
        {
            self.reset();
        }
        let due = |v: &Self| {
            v.order
                .front()
                .is_some_and(|(t, ..)| !v.active || now.duration_since(*t) >= KEEP)
        };
        for _ in 0..DRAIN_PER_STEP {
            if !due(self) {
                return false;
            }
            self.drop_oldest();
        }
        due(self)
    }

    /// The sequence number the next kept version gets: a read that began
    /// when this was `n` counts only versions numbered below `n`.
    pub fn next_seq(&self) -> u64 {
        self.seq
    }

    /// Whether `table` may have a key a commit later than `snapshot`
    /// changed (else a scan at it looks nothing up).
    pub fn changed_after(&self, table: u64, snapshot: u64) -> bool {
        self.tables
            .get(&table)
            .is_some_and(|t| t.max_commit_ts > snapshot)
    }

    /// `key` of `table` as of `snapshot`, counting versions numbered below
    /// `seq`: None if no such kept commit is later than the snapshot (its
    /// value now is the one then), else Some(its version and value then;
    /// None: absent, or past its deadline at the snapshot).
    pub fn as_of(
        &self,
        table: u64,
        key: &[u8],
        snapshot: u64,
        seq: u64,
    ) -> Option<Option<(u64, &[u8])>> {
        let chain = self.tables.get(&table)?.by_key.get(key)?;
        first_after(chain, snapshot, seq)
            .map(|k| visible(k, snapshot).map(|b| (b.version, &b.value[..])))
    }

    /// Visit up to `limit` kept keys of `table` with hash in `start..=end`,
    /// in hash order from `from` (None: the range's start); `f` gets each key a commit later than
    /// `snapshot` changed (counting versions numbered below `seq`) and its
    /// value as of the snapshot (None: absent then). Returns the first key
    /// not visited, to go on from, or None when the range is done.
    pub fn changed_in(
        &self,
        table: u64,
        (start, end): (u64, u64),
        from: Option<Resume>,
        (snapshot, seq): (u64, u64),
        limit: usize,
        mut f: impl FnMut(&[u8], Option<&[u8]>),
    ) -> Option<Resume> {
        let t = self.tables.get(&table)?;
        let lower = match from {
            Some(pos) => Bound::Included(pos),
            None => Bound::Included((start, Rc::from(&[][..]))),
        };
        for (n, (hash, key)) in t.by_hash.range((lower, Bound::Unbounded)).enumerate() {
            if *hash > end {
                return None;
            }
            if n == limit {
                return Some((*hash, key.clone()));
            }
            let chain = t.by_key.get(key).expect("by_hash and by_key agree");
            if let Some(k) = first_after(chain, snapshot, seq) {
                f(key, visible(k, snapshot).map(|b| &b.value[..]));
            }
        }
        None
    }
}

/// The object `kept` holds as snapshot `snapshot` sees it: None if the key
/// was absent or the object's deadline had passed by then.
fn visible(kept: &Kept, snapshot: u64) -> Option<&KeptObject> {
    kept.before
        .as_ref()
        .filter(|b| !expired_at(b.expires_at_ms, snapshot))
}

/// The first version of `chain` numbered below `seq` whose commit is later
/// than `snapshot`. Numbers and timestamps both increase along a chain.
fn first_after(chain: &Chain, snapshot: u64, seq: u64) -> Option<&Kept> {
    chain
        .kept
        .iter()
        .take_while(|k| k.seq < seq)
        .find(|k| k.commit_ts > snapshot)
}

#[cfg(test)]
#[path = "versions_tests.rs"]
mod tests;
