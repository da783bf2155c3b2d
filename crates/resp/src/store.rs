//! What the commands need from the data: a small set of key-value operations
//! on numbered databases. The server implements it over its shards (local
//! keys straight from the engine, others through the cluster client);
//! `MemStore` implements it over a `BTreeMap` for tests and the fuzzer.
//!
//! Read-modify-write commands (`INCR`, `APPEND`, `SET ... GET`, ...) are
//! built from `get` and a conditional `put` on the version read, retried on
//! a lost race: each is atomic for its key, as in Redis, without a lock.
//!
//! Keys may expire: every object carries a deadline (Unix milliseconds, 0
//! for none) and the store hides a key once its deadline is past, by its
//! own clock (`now_ms`), which the commands also use to compute deadlines.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

/// A value and the version it was read at (versions only grow for a key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub value: Bytes,
    pub version: u64,
    /// When the key expires, in Unix milliseconds of the store's clock
    /// (`Store::now_ms`); 0: never. A key read through `get` is always
    /// live, so this is 0 or after the `now_ms` of the read.
    pub expires_at_ms: u64,
}

impl Versioned {
    /// Whether the key still exists at `now_ms` (its deadline is later).
    pub fn live_at(&self, now_ms: u64) -> bool {
        self.expires_at_ms == 0 || self.expires_at_ms > now_ms
    }
}

/// When a `put` or `del` applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    Always,
    /// Only if the key does not exist (`SET NX`).
    Absent,
    /// Only if the key exists (`SET XX`).
    Present,
    /// Only if the key exists at exactly this version (compare-and-set).
    Version(u64),
}

impl Cond {
    /// Whether the condition holds for the key's current value (None:
    /// absent): one definition for `MemStore` and for every store that
    /// checks a condition itself instead of leaving it to its backend.
    pub fn holds(self, current: Option<&Versioned>) -> bool {
        match self {
            Cond::Always => true,
            Cond::Absent => current.is_none(),
            Cond::Present => current.is_some(),
            Cond::Version(v) => current.is_some_and(|c| c.version == v),
        }
    }
}

/// One write of `Store::put`: `value` under `key` if `cond` holds, the new
/// object expiring at `expires_at_ms`. One argument, so the trait and its
/// stores name the write's parts once and callers name them at the call
/// (a bare `0` deadline or `Cond::Always` reads as `Put::new`).
#[derive(Clone, Copy, Debug)]
pub struct Put<'a> {
    /// The key written (borrowed: the command's argument, copied by the store).
    pub key: &'a [u8],
    /// The whole new value (a `put` never keeps part of the old one).
    pub value: &'a [u8],
    /// When the write applies (nothing is written otherwise).
    pub cond: Cond,
    /// The new object's deadline, in Unix milliseconds of the store's clock;
    /// 0: never. A deadline the key had before is replaced, not kept.
    pub expires_at_ms: u64,
}

impl<'a> Put<'a> {
    /// `value` under `key`, unconditional, never expiring.
    pub fn new(key: &'a [u8], value: &'a [u8]) -> Put<'a> {
        Put {
            key,
            value,
            cond: Cond::Always,
            expires_at_ms: 0,
        }
    }

    /// This write, applied only if `cond` holds.
    pub fn when(self, cond: Cond) -> Put<'a> {
        Put { cond, ..self }
    }

    /// This write, the object expiring at `expires_at_ms` (0: never).
    pub fn expiring_at(self, expires_at_ms: u64) -> Put<'a> {
        Put {
            expires_at_ms,
            ..self
        }
    }
}

/// A value rewrite (`Store::modify_at_once`): the new value from the
/// current one (None: absent), or the error reply that leaves the key as it is.
pub type Rewrite<'a> = dyn FnMut(Option<&[u8]>) -> Result<Vec<u8>, &'static str> + 'a;

/// A failure the command reports to its client as `ERR <message>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The keys of a database that carry a deadline (`Store::expiring`): what
/// `INFO` reports as `expires=` and derives `avg_ttl` from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpiringKeys {
    /// How many keys have a deadline.
    pub keys: u64,
    /// The sum of their deadlines (Unix ms): a sum, not a mean, so a store
    /// over several shards adds its parts up; divided by `keys`, the mean.
    pub deadline_sum_ms: u128,
}

/// One page of a `SCAN`: the keys and the cursor to continue from (0: done).
pub struct ScanPage {
    pub keys: Vec<Bytes>,
    pub cursor: u64,
}

/// The data operations behind the commands. Futures need not be `Send`: a
/// connection runs on its shard's thread.
///
/// Expiry: a key whose deadline (`Versioned::expires_at_ms`, non-zero) is
/// at or before `now_ms()` is absent for every operation: `get`, `mget`,
/// `scan`, the conditions of `put` and `del` (`Absent` holds, `Present` and
/// `Version` do not), the source of `rename`, the check of `mset_absent`.
/// `rename` carries the source's deadline to the destination (Redis's
/// `RENAME` keeps the TTL); `mset` and `mset_absent` write without
/// deadlines. `dbsize` and `expiring` may count keys that expired but are
/// not reclaimed yet (Redis's `DBSIZE` and `INFO` do too).
#[allow(async_fn_in_trait)]
pub trait Store {
    async fn get(&self, db: u32, key: &[u8]) -> Result<Option<Versioned>, StoreError>;
    /// Write `put.value` under `put.key`, expiring at `put.expires_at_ms`
    /// (0: never), if `put.cond` holds; false if it did not (nothing
    /// written). The object written is new: a deadline the key had before
    /// is replaced, not kept.
    async fn put(&self, db: u32, put: Put<'_>) -> Result<bool, StoreError>;
    /// Remove `key` if `cond` holds; false if it did not or the key was absent.
    async fn del(&self, db: u32, key: &[u8], cond: Cond) -> Result<bool, StoreError>;
    /// Remove every key of `keys` (`DEL`, `UNLINK`); how many existed (a
    /// key named twice counts once). Atomic only where the store says so: a
    /// shard removes its own keys in one step and the others' in one
    /// round trip per shard, not one per key.
    async fn del_many(&self, db: u32, keys: &[Bytes]) -> Result<usize, StoreError> {
        let mut removed = 0;
        for key in keys {
            removed += usize::from(self.del(db, key, Cond::Always).await?);
        }
        Ok(removed)
    }
    /// Values of `keys`, in order.
    async fn mget(&self, db: u32, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, StoreError>;
    /// Write every pair (a later duplicate key wins).
    async fn mset(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<(), StoreError>;
    /// Write every pair only if no key exists, all or none, atomically.
    async fn mset_absent(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<bool, StoreError>;
    /// Move `from`'s value to `to` (replacing it) and remove `from`,
    /// atomically; false if `from` does not exist.
    async fn rename(&self, db: u32, from: &[u8], to: &[u8]) -> Result<bool, StoreError>;
    /// How many keys `db` holds.
    async fn dbsize(&self, db: u32) -> Result<u64, StoreError>;
    /// How many keys of `db` have a deadline, and the sum of their deadlines.
    async fn expiring(&self, db: u32) -> Result<ExpiringKeys, StoreError>;
    /// About `count` keys from `cursor` on (0 starts), in a stable order; a
    /// key present for the whole walk is returned at least once.
    async fn scan(&self, db: u32, cursor: u64, count: usize) -> Result<ScanPage, StoreError>;
    /// Remove every key of `db`.
    async fn flush(&self, db: u32) -> Result<(), StoreError>;
    /// The largest value `put` accepts (what `SETRANGE`/`APPEND` may grow to).
    fn max_value_bytes(&self) -> usize;
    /// The store's clock, in Unix milliseconds: what deadlines are compared
    /// with. Commands compute deadlines and TTLs from it, never from the
    /// system clock, so they agree with the store on what has expired.
    fn now_ms(&self) -> u64;
    /// Replace `key`'s value by `f(current value)` (None: absent) in one
    /// synchronous step, keeping its deadline, when the store can (the key
    /// is at hand); returns what `f` returned. None: it cannot, and the
    /// caller reads and writes on the version read instead. Why: a
    /// read-modify-write (`INCR`, `APPEND`) then costs one lookup, not two.
    fn modify_at_once(
        &self,
        _db: u32,
        _key: &[u8],
        _f: &mut Rewrite<'_>,
    ) -> Option<Result<Result<Vec<u8>, &'static str>, StoreError>> {
        None
    }
    /// The nodes serving database 0 by Redis hash slot, for cluster clients
    /// (`CLUSTER SLOTS | SHARDS | NODES`). None: no slot layout, and the
    /// node the connection reached is described as serving every slot.
    async fn layout(&self) -> Result<Option<Vec<ClusterNode>>, StoreError> {
        Ok(None)
    }
    /// The node ("ip:port") serving `key` of `db` when it is not the one
    /// this connection reached: a connection that learned the layout is
    /// sent there (`MOVED`). None: served here (or forwarded: a plain
    /// client never learned the layout and is never redirected).
    async fn redirect(&self, _db: u32, _key: &[u8]) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
    /// Commands about `keys` of `db` will run soon: start loading what they
    /// will read, if that is cheap (a hint; by default nothing). Called with
    /// the keys of a pipelined batch before its first command runs
    /// (`exec::prefetch`).
    fn prefetch(&self, _db: u32, _keys: &[&[u8]]) {}
}

/// One node of a slot layout (`Store::layout`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// 40 hex digits, stable while the node serves (`CLUSTER MYID`).
    pub id: String,
    pub ip: String,
    pub port: u16,
    /// The node this connection reached.
    pub myself: bool,
    /// Inclusive slot ranges it serves, ascending (none: it serves no slot).
    pub slots: Vec<(u16, u16)>,
}

/// A store whose commands can run as one all-or-nothing group (`MULTI` /
/// `EXEC`): `begin` opens a transaction, itself a `Store`, whose writes
/// appear together at `commit`, and only if nothing it read changed.
#[allow(async_fn_in_trait)]
pub trait Transactional: Store {
    type Tx<'a>: Store + Commit
    where
        Self: 'a;
    async fn begin(&self) -> Result<Self::Tx<'_>, StoreError>;
}

/// The end of a transaction.
#[allow(async_fn_in_trait)]
pub trait Commit {
    /// Ok(true): applied. Ok(false): another writer changed what it read (or
    /// holds a key it writes); nothing was applied, run it again.
    async fn commit(self) -> Result<bool, StoreError>;
}

/// A `Store` over one `BTreeMap` per database: the model the commands are
/// tested against (and what the fuzzer drives). Expired keys stay in the
/// map, hidden, until overwritten or flushed: keeping them keeps `scan`'s
/// positions stable while keys expire during a walk.
#[derive(Default)]
pub struct MemStore {
    /// (db, key) -> (value, version, deadline).
    data: RefCell<BTreeMap<(u32, Bytes), Versioned>>,
    /// Last version handed out (one counter for all keys: versions grow).
    version: Cell<u64>,
    /// A pinned clock (Unix ms) for tests; None: the system clock.
    clock_ms: Cell<Option<u64>>,
    /// A slot layout to describe and redirect by (tests of cluster mode).
    layout: RefCell<Option<Vec<ClusterNode>>>,
}

impl MemStore {
    /// Describe `nodes` to cluster clients and redirect keys of slots
    /// another node serves (None: one node, every key served here).
    pub fn set_layout(&self, nodes: Option<Vec<ClusterNode>>) {
        *self.layout.borrow_mut() = nodes;
    }

    /// Pin the clock at `ms` (Unix milliseconds), or None to follow the
    /// system clock again. Tests move it forward to make keys expire.
    pub fn set_clock_ms(&self, ms: Option<u64>) {
        self.clock_ms.set(ms);
    }

    fn next_version(&self) -> u64 {
        self.version.set(self.version.get() + 1);
        self.version.get()
    }

    /// `key`'s object if it has not expired.
    fn live<'a>(
        data: &'a BTreeMap<(u32, Bytes), Versioned>,
        k: &(u32, Bytes),
        now_ms: u64,
    ) -> Option<&'a Versioned> {
        data.get(k).filter(|v| v.live_at(now_ms))
    }
}

impl Store for MemStore {
    async fn get(&self, db: u32, key: &[u8]) -> Result<Option<Versioned>, StoreError> {
        let k = (db, Bytes::copy_from_slice(key));
        Ok(Self::live(&self.data.borrow(), &k, self.now_ms()).cloned())
    }

    async fn put(&self, db: u32, put: Put<'_>) -> Result<bool, StoreError> {
        if put.value.len() > self.max_value_bytes() {
            return Err(StoreError(format!(
                "value of {} bytes is over the limit",
                put.value.len()
            )));
        }
        let k = (db, Bytes::copy_from_slice(put.key));
        let mut data = self.data.borrow_mut();
        if !put.cond.holds(Self::live(&data, &k, self.now_ms())) {
            return Ok(false);
        }
        let version = self.next_version();
        data.insert(
            k,
            Versioned {
                value: Bytes::copy_from_slice(put.value),
                version,
                expires_at_ms: put.expires_at_ms,
            },
        );
        Ok(true)
    }

    async fn del(&self, db: u32, key: &[u8], cond: Cond) -> Result<bool, StoreError> {
        let k = (db, Bytes::copy_from_slice(key));
        let mut data = self.data.borrow_mut();
        let current = Self::live(&data, &k, self.now_ms());
        if current.is_none() || !cond.holds(current) {
            return Ok(false);
        }
        data.remove(&k);
        Ok(true)
    }

    async fn mget(&self, db: u32, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let data = self.data.borrow();
        let now = self.now_ms();
        Ok(keys
            .iter()
            .map(|k| Self::live(&data, &(db, k.clone()), now).map(|v| v.value.clone()))
            .collect())
    }

    async fn mset(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<(), StoreError> {
        for (k, v) in pairs {
            self.put(db, Put::new(k, v)).await?;
        }
        Ok(())
    }

    async fn mset_absent(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<bool, StoreError> {
        let any = {
            let data = self.data.borrow();
            let now = self.now_ms();
            pairs
                .iter()
                .any(|(k, _)| Self::live(&data, &(db, k.clone()), now).is_some())
        };
        if any {
            return Ok(false);
        }
        self.mset(db, pairs).await?;
        Ok(true)
    }

    async fn rename(&self, db: u32, from: &[u8], to: &[u8]) -> Result<bool, StoreError> {
        let Some(v) = self.get(db, from).await? else {
            return Ok(false);
        };
        self.del(db, from, Cond::Always).await?;
        self.put(db, Put::new(to, &v.value).expiring_at(v.expires_at_ms))
            .await?;
        Ok(true)
    }

    async fn dbsize(&self, db: u32) -> Result<u64, StoreError> {
        // Exact (live keys only) though the trait allows more: the model
        // answers what a fully reclaimed store would.
        let now = self.now_ms();
        Ok(self
            .data
            .borrow()
            .iter()
            .filter(|((d, _), v)| *d == db && v.live_at(now))
            .count() as u64)
    }

    async fn expiring(&self, db: u32) -> Result<ExpiringKeys, StoreError> {
        // Exact, as `dbsize`: live keys only.
        let now = self.now_ms();
        let data = self.data.borrow();
        let deadlines = data
            .iter()
            .filter(|((d, _), v)| *d == db && v.live_at(now) && v.expires_at_ms != 0)
            .map(|(_, v)| v.expires_at_ms);
        Ok(
            deadlines.fold(ExpiringKeys::default(), |acc, ms| ExpiringKeys {
                keys: acc.keys + 1,
                deadline_sum_ms: acc.deadline_sum_ms + u128::from(ms),
            }),
        )
    }

    async fn scan(&self, db: u32, cursor: u64, count: usize) -> Result<ScanPage, StoreError> {
        // The cursor is a position in key order (1-based; 0 starts), counted
        // over expired keys too, so a key expiring mid-walk moves no other.
        let data = self.data.borrow();
        let now = self.now_ms();
        let keys: Vec<(&Bytes, &Versioned)> = data
            .iter()
            .filter(|((d, _), _)| *d == db)
            .map(|((_, k), v)| (k, v))
            .collect();
        let from = cursor.saturating_sub(1) as usize;
        let window: Vec<&(&Bytes, &Versioned)> =
            keys.iter().skip(from).take(count.max(1)).collect();
        let next = from + window.len();
        let page = window
            .into_iter()
            .filter(|(_, v)| v.live_at(now))
            .map(|(k, _)| (*k).clone())
            .collect();
        let cursor = if next >= keys.len() {
            0
        } else {
            next as u64 + 1
        };
        Ok(ScanPage { keys: page, cursor })
    }

    async fn flush(&self, db: u32) -> Result<(), StoreError> {
        self.data.borrow_mut().retain(|(d, _), _| *d != db);
        Ok(())
    }

    fn max_value_bytes(&self) -> usize {
        1024 * 1024
    }

    fn now_ms(&self) -> u64 {
        self.clock_ms.get().unwrap_or_else(|| {
            // A clock before 1970 reads as 0: nothing has a deadline that early.
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
        })
    }

    async fn layout(&self) -> Result<Option<Vec<ClusterNode>>, StoreError> {
        Ok(self.layout.borrow().clone())
    }

    async fn redirect(&self, _db: u32, key: &[u8]) -> Result<Option<String>, StoreError> {
        let slot = insitu_keyhash::key_slot(key);
        let layout = self.layout.borrow();
        let owner = layout.iter().flatten().find(|n| {
            n.slots
                .iter()
                .any(|&(first, last)| (first..=last).contains(&slot))
        });
        Ok(owner
            .filter(|n| !n.myself)
            .map(|n| format!("{}:{}", n.ip, n.port)))
    }
}

/// `MemStore`'s transaction: its commands apply at once. That is all or
/// nothing here because a `MemStore` future never waits, so nothing else
/// runs between a transaction's commands.
pub struct MemTx<'a>(pub &'a MemStore);

impl Commit for MemTx<'_> {
    async fn commit(self) -> Result<bool, StoreError> {
        Ok(true)
    }
}

impl Transactional for MemStore {
    type Tx<'a> = MemTx<'a>;
    async fn begin(&self) -> Result<MemTx<'_>, StoreError> {
        Ok(MemTx(self))
    }
}

impl Store for MemTx<'_> {
    async fn get(&self, db: u32, key: &[u8]) -> Result<Option<Versioned>, StoreError> {
        self.0.get(db, key).await
    }
    async fn put(&self, db: u32, put: Put<'_>) -> Result<bool, StoreError> {
        self.0.put(db, put).await
    }
    async fn del(&self, db: u32, key: &[u8], cond: Cond) -> Result<bool, StoreError> {
        self.0.del(db, key, cond).await
    }
    async fn mget(&self, db: u32, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, StoreError> {
        self.0.mget(db, keys).await
    }
    async fn mset(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<(), StoreError> {
        self.0.mset(db, pairs).await
    }
    async fn mset_absent(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<bool, StoreError> {
        self.0.mset_absent(db, pairs).await
    }
    async fn rename(&self, db: u32, from: &[u8], to: &[u8]) -> Result<bool, StoreError> {
        self.0.rename(db, from, to).await
    }
    async fn dbsize(&self, db: u32) -> Result<u64, StoreError> {
        self.0.dbsize(db).await
    }
    async fn expiring(&self, db: u32) -> Result<ExpiringKeys, StoreError> {
        self.0.expiring(db).await
    }
    async fn scan(&self, db: u32, cursor: u64, count: usize) -> Result<ScanPage, StoreError> {
        self.0.scan(db, cursor, count).await
    }
    async fn flush(&self, db: u32) -> Result<(), StoreError> {
        self.0.flush(db).await
    }
    fn max_value_bytes(&self) -> usize {
        self.0.max_value_bytes()
    }
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
}
