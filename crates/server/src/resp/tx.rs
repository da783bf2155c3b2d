//! `MULTI`/`EXEC` on the cluster: the queued commands run on an insitu
//! transaction (`insitu_client::Transaction`): reads remember the versions
//! they saw, writes wait in the transaction, and the commit applies them
//! together only if none of those versions changed (ARCHITECTURE.md,
//! "Transactions"). A conflict makes `EXEC` run the commands again.
//!
//! `DBSIZE`, `SCAN` and `FLUSHDB` inside a transaction run outside it
//! (at once, not at the commit): they are not transactional here.
//!
//! Every read inside a transaction reads a table, creating the database's
//! table if it does not exist yet: a key "read" as absent because its table
//! was missing would be no read at all, and the commit would not check it
//! (two `WATCH`/`EXEC`s of a first key would both commit: a lost update,
//! which `tests/resp.rs` caught).

use std::cell::Cell;

use bytes::Bytes;
use insitu_client::{ClientError, Transaction, is_retryable};
use insitu_resp::{
    Commit, Cond, ExpiringKeys, Put, ScanPage, Store, StoreError, Transactional, Versioned,
};

use super::store::{ShardStore, err};

pub struct ShardTx<'a> {
    /// For table lookups and the commands that run outside the transaction.
    outside: ShardStore<'a>,
    /// Taken out while one of its calls awaits (calls never overlap: a
    /// connection runs its queued commands one after another).
    tx: Cell<Option<Transaction>>,
}

impl Transactional for ShardStore<'_> {
    type Tx<'b>
        = ShardTx<'b>
    where
        Self: 'b;

    async fn begin(&self) -> Result<ShardTx<'_>, StoreError> {
        let client = self.resp.client().await.map_err(err)?;
        Ok(ShardTx {
            outside: ShardStore {
                state: self.state,
                resp: self.resp,
            },
            tx: Cell::new(Some(client.begin())),
        })
    }
}

impl Commit for ShardTx<'_> {
    async fn commit(self) -> Result<bool, StoreError> {
        let tx = self.take()?;
        match tx.commit().await {
            Ok(()) => Ok(true),
            Err(e) if is_retryable(&e) => Ok(false),
            Err(e) => Err(err(e)),
        }
    }
}

impl ShardTx<'_> {
    /// The transaction, taken out of its cell: the caller puts it back (or
    /// commits it). An error only if it is already out, which cannot happen:
    /// calls never overlap.
    fn take(&self) -> Result<Transaction, StoreError> {
        self.tx
            .take()
            .ok_or_else(|| err("the transaction was lost"))
    }

    /// Run `f` on the transaction.
    async fn with<T>(
        &self,
        f: impl AsyncFnOnce(&mut Transaction) -> Result<T, ClientError>,
    ) -> Result<T, StoreError> {
        let mut tx = self.take()?;
        let result = f(&mut tx).await;
        self.tx.set(Some(tx));
        result.map_err(err)
    }

    /// The table of `db`: always created if missing inside a transaction
    /// (see the module comment).
    async fn table(&self, db: u32) -> Result<u64, StoreError> {
        self.outside.created_table(db).await
    }

    async fn read(&self, table: u64, key: &[u8]) -> Result<Option<Versioned>, StoreError> {
        let found = self
            .with(async |tx| tx.read_versioned(table, key).await)
            .await?;
        let Some((value, version)) = found else {
            return Ok(None);
        };
        // A transaction's read records no deadline: it is asked for beside
        // it (TTL answers truthfully; INCR, APPEND, ... keep it). A key this
        // transaction wrote (version 0) has the deadline it was given here.
        let expires_at_ms = match version {
            0 => {
                let tx = self.take()?;
                let deadline = tx.written_deadline(table, key);
                self.tx.set(Some(tx));
                deadline
            }
            _ => self
                .outside
                .resp
                .client()
                .await
                .map_err(err)?
                .read_expiring(table, key)
                .await
                .map_err(err)?
                .map_or(0, |(_, _, deadline)| deadline),
        };
        Ok(Some(Versioned {
            value,
            version,
            expires_at_ms,
        }))
    }
}

impl Store for ShardTx<'_> {
    async fn get(&self, db: u32, key: &[u8]) -> Result<Option<Versioned>, StoreError> {
        let table = self.table(db).await?;
        self.read(table, key).await
    }

    async fn put(&self, db: u32, put: Put<'_>) -> Result<bool, StoreError> {
        let table = self.table(db).await?;
        if put.cond != Cond::Always {
            // The read is checked again at the commit: the condition holds then.
            let current = self.read(table, put.key).await?;
            if !put.cond.holds(current.as_ref()) {
                return Ok(false);
            }
        }
        self.with(async |tx| {
            tx.write_expiring(table, put.key, put.value, put.expires_at_ms);
            Ok(())
        })
        .await?;
        Ok(true)
    }

    async fn del(&self, db: u32, key: &[u8], cond: Cond) -> Result<bool, StoreError> {
        let table = self.table(db).await?;
        let current = self.read(table, key).await?;
        // As in the model (`MemStore`): an absent key is never removed.
        let holds = current.is_some() && cond.holds(current.as_ref());
        if holds {
            self.with(async |tx| {
                tx.remove(table, key);
                Ok(())
            })
            .await?;
        }
        Ok(holds)
    }

    async fn mget(&self, db: u32, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let table = self.table(db).await?;
        self.with(async |tx| tx.read_many(table, keys).await).await
    }

    async fn mset(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<(), StoreError> {
        let table = self.table(db).await?;
        self.with(async |tx| {
            for (k, v) in pairs {
                tx.write(table, k, v);
            }
            Ok(())
        })
        .await
    }

    async fn mset_absent(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<bool, StoreError> {
        let table = self.table(db).await?;
        let keys: Vec<&[u8]> = pairs.iter().map(|(k, _)| &k[..]).collect();
        self.with(async |tx| {
            if tx
                .read_many(table, &keys)
                .await?
                .iter()
                .any(Option::is_some)
            {
                return Ok(false);
            }
            for (k, v) in pairs {
                tx.write(table, k, v);
            }
            Ok(true)
        })
        .await
    }

    async fn rename(&self, db: u32, from: &[u8], to: &[u8]) -> Result<bool, StoreError> {
        let table = self.table(db).await?;
        // With its deadline (RENAME keeps a TTL).
        let Some(v) = self.read(table, from).await? else {
            return Ok(false);
        };
        self.with(async |tx| {
            tx.write_expiring(table, to, &v.value, v.expires_at_ms);
            tx.remove(table, from);
            Ok(true)
        })
        .await
    }

    async fn dbsize(&self, db: u32) -> Result<u64, StoreError> {
        self.outside.dbsize(db).await
    }

    async fn expiring(&self, db: u32) -> Result<ExpiringKeys, StoreError> {
        self.outside.expiring(db).await
    }

    async fn scan(&self, db: u32, cursor: u64, count: usize) -> Result<ScanPage, StoreError> {
        self.outside.scan(db, cursor, count).await
    }

    async fn flush(&self, db: u32) -> Result<(), StoreError> {
        self.outside.flush(db).await
    }

    fn max_value_bytes(&self) -> usize {
        self.outside.max_value_bytes()
    }

    fn now_ms(&self) -> u64 {
        self.outside.now_ms()
    }
}
