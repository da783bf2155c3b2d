//! What the commands need from the data: a small set of key-value operations
//! on numbered databases. The server implements it over its shards (local
//! keys straight from the engine, others through the cluster client);
//! `MemStore` implements it over a `BTreeMap` for tests and the fuzzer.
//!
//! Read-modify-write commands (`INCR`, `APPEND`, `SET ... GET`, ...) are
//! built from `get` and a conditional `put` on the version read, retried on
//! a lost race: each is atomic for its key, as in Redis, without a lock.

use std::cell::RefCell;
use std::collections::BTreeMap;

use bytes::Bytes;

/// A value and the version it was read at (versions only grow for a key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub value: Bytes,
    pub version: u64,
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

/// A failure the command reports to its client as `ERR <message>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One page of a `SCAN`: the keys and the cursor to continue from (0: done).
pub struct ScanPage {
    pub keys: Vec<Bytes>,
    pub cursor: u64,
}

/// The data operations behind the commands. Futures need not be `Send`: a
/// connection runs on its shard's thread.
#[allow(async_fn_in_trait)]
pub trait Store {
    async fn get(&self, db: u32, key: &[u8]) -> Result<Option<Versioned>, StoreError>;
    /// Write `value` if `cond` holds; false if it did not (nothing written).
    async fn put(&self, db: u32, key: &[u8], value: &[u8], cond: Cond) -> Result<bool, StoreError>;
    /// Remove `key` if `cond` holds; false if it did not or the key was absent.
    async fn del(&self, db: u32, key: &[u8], cond: Cond) -> Result<bool, StoreError>;
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
    /// About `count` keys from `cursor` on (0 starts), in a stable order; a
    /// key present for the whole walk is returned at least once.
    async fn scan(&self, db: u32, cursor: u64, count: usize) -> Result<ScanPage, StoreError>;
    /// Remove every key of `db`.
    async fn flush(&self, db: u32) -> Result<(), StoreError>;
    /// The largest value `put` accepts (what `SETRANGE`/`APPEND` may grow to).
    fn max_value_bytes(&self) -> usize;
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
/// tested against (and what the fuzzer drives).
#[derive(Default)]
pub struct MemStore {
    /// (db, key) -> (value, version).
    data: RefCell<BTreeMap<(u32, Bytes), Versioned>>,
    /// Last version handed out (one counter for all keys: versions grow).
    version: std::cell::Cell<u64>,
}

impl MemStore {
    fn next_version(&self) -> u64 {
        self.version.set(self.version.get() + 1);
        self.version.get()
    }

    fn holds(current: Option<&Versioned>, cond: Cond) -> bool {
        match cond {
            Cond::Always => true,
            Cond::Absent => current.is_none(),
            Cond::Present => current.is_some(),
            Cond::Version(v) => current.is_some_and(|c| c.version == v),
        }
    }
}

impl Store for MemStore {
    async fn get(&self, db: u32, key: &[u8]) -> Result<Option<Versioned>, StoreError> {
        Ok(self
            .data
            .borrow()
            .get(&(db, Bytes::copy_from_slice(key)))
            .cloned())
    }

    async fn put(&self, db: u32, key: &[u8], value: &[u8], cond: Cond) -> Result<bool, StoreError> {
        if value.len() > self.max_value_bytes() {
            return Err(StoreError(format!(
                "value of {} bytes is over the limit",
                value.len()
            )));
        }
        let k = (db, Bytes::copy_from_slice(key));
        let mut data = self.data.borrow_mut();
        if !Self::holds(data.get(&k), cond) {
            return Ok(false);
        }
        let version = self.next_version();
        data.insert(
            k,
            Versioned {
                value: Bytes::copy_from_slice(value),
                version,
            },
        );
        Ok(true)
    }

    async fn del(&self, db: u32, key: &[u8], cond: Cond) -> Result<bool, StoreError> {
        let k = (db, Bytes::copy_from_slice(key));
        let mut data = self.data.borrow_mut();
        let current = data.get(&k);
        if current.is_none() || !Self::holds(current, cond) {
            return Ok(false);
        }
        data.remove(&k);
        Ok(true)
    }

    async fn mget(&self, db: u32, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let data = self.data.borrow();
        Ok(keys
            .iter()
            .map(|k| data.get(&(db, k.clone())).map(|v| v.value.clone()))
            .collect())
    }

    async fn mset(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<(), StoreError> {
        for (k, v) in pairs {
            self.put(db, k, v, Cond::Always).await?;
        }
        Ok(())
    }

    async fn mset_absent(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<bool, StoreError> {
        let any = {
            let data = self.data.borrow();
            pairs
                .iter()
                .any(|(k, _)| data.contains_key(&(db, k.clone())))
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
        self.put(db, to, &v.value, Cond::Always).await?;
        Ok(true)
    }

    async fn dbsize(&self, db: u32) -> Result<u64, StoreError> {
        Ok(self.data.borrow().keys().filter(|(d, _)| *d == db).count() as u64)
    }

    async fn scan(&self, db: u32, cursor: u64, count: usize) -> Result<ScanPage, StoreError> {
        // The cursor is a position in key order (1-based; 0 starts).
        let data = self.data.borrow();
        let keys: Vec<Bytes> = data
            .keys()
            .filter(|(d, _)| *d == db)
            .map(|(_, k)| k.clone())
            .collect();
        let from = cursor.saturating_sub(1) as usize;
        let page: Vec<Bytes> = keys.iter().skip(from).take(count.max(1)).cloned().collect();
        let next = from + page.len();
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
    async fn put(&self, db: u32, key: &[u8], value: &[u8], cond: Cond) -> Result<bool, StoreError> {
        self.0.put(db, key, value, cond).await
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
    async fn scan(&self, db: u32, cursor: u64, count: usize) -> Result<ScanPage, StoreError> {
        self.0.scan(db, cursor, count).await
    }
    async fn flush(&self, db: u32) -> Result<(), StoreError> {
        self.0.flush(db).await
    }
    fn max_value_bytes(&self) -> usize {
        self.0.max_value_bytes()
    }
}
