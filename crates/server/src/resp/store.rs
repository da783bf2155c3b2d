//! `insitu_resp::Store` over a shard: a key whose tablet this shard serves
//! is read or written in its engine directly (no hop, no copy of a frame);
//! any other key, or one this shard cannot serve right now (frozen, moving,
//! locked by a transaction), goes through the embedded cluster client, whose
//! routing and retries take it to the owner.
//!
//! Replies wait for durability in `conn.rs`, as on the native port: a local
//! write is acknowledged only once R backups hold it.

use bytes::Bytes;
use insitu_client::{ClientError, Selection, ShardStats, TableInfo};
use insitu_engine::{Engine, EngineError, RejectRules as EngineRules};
use insitu_protocol::{RejectRules, Status};
use insitu_resp::{ClusterNode, Cond, ExpiringKeys, Put, ScanPage, Store, StoreError, Versioned};

use crate::handler::admit;
use crate::shard::ShardState;

use super::RespShard;

pub struct ShardStore<'a> {
    pub state: &'a ShardState,
    pub resp: &'a RespShard,
}

fn wire_rules(cond: Cond) -> RejectRules {
    let mut r = RejectRules::default();
    match cond {
        Cond::Always => {}
        Cond::Absent => r.exists = true,
        Cond::Present => r.doesnt_exist = true,
        Cond::Version(v) => {
            r.doesnt_exist = true;
            r.version_ne_given = true;
            r.given_version = v;
        }
    }
    r
}

fn engine_rules(cond: Cond) -> EngineRules {
    crate::handler::rules(&wire_rules(cond))
}

/// Refuse a bad key or value of a multi-key write before any is written: a
/// refusal half-way would leave the command half applied. (Running out of
/// memory half-way still can; the error says so.)
fn refuse_bad_pairs(engine: &Engine, pairs: &[(Bytes, Bytes)]) -> Result<(), StoreError> {
    let max = engine.config().max_value_bytes;
    if let Some((_, v)) = pairs.iter().find(|(_, v)| v.len() > max) {
        return Err(err(EngineError::ValueTooLarge { len: v.len(), max }));
    }
    if let Some((k, _)) = pairs
        .iter()
        .find(|(k, _)| k.is_empty() || k.len() > insitu_engine::MAX_KEY_BYTES)
    {
        return Err(err(format!(
            "key of {} bytes: keys must be 1 to {} bytes",
            k.len(),
            insitu_engine::MAX_KEY_BYTES
        )));
    }
    Ok(())
}

/// A refusal by a condition (nothing changed) rather than a failure.
fn refused_by_rules(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::ObjectExists { .. }
            | EngineError::ObjectDoesntExist
            | EngineError::WrongVersion { .. }
    )
}

fn client_refused(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Status(
            Status::ObjectExists | Status::ObjectDoesntExist | Status::WrongVersion,
            _
        )
    )
}

pub(super) fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

/// Times `expiring` reads the map and the shards' figures before it gives
/// up (each retry follows a tablet move that ended while it counted).
const EXPIRING_ATTEMPTS: usize = 5;

/// The keys with a deadline in every tablet of `map`, from the figures of
/// the shards at `addrs` (sorted; `stats[i]` from `addrs[i]`); None if a
/// tablet is not where the map says.
fn expiring_in(map: &TableInfo, addrs: &[&str], stats: &[ShardStats]) -> Option<ExpiringKeys> {
    let mut sum = ExpiringKeys::default();
    for t in &map.tablets {
        let shard = &stats[addrs.binary_search(&t.addr.as_str()).ok()?];
        let held = shard.tablets.iter().find(|s| {
            s.table == map.id && s.start_hash == t.start_hash && s.end_hash == t.end_hash
        })?;
        sum.keys += held.expiring_objects;
        sum.deadline_sum_ms += held.expiring_deadline_sum_ms;
    }
    Some(sum)
}

/// What a local attempt came to.
enum Local<T> {
    Done(T),
    /// Not this shard's to answer now: forward.
    Forward,
}

impl ShardStore<'_> {
    pub(super) async fn table(&self, db: u32, create: bool) -> Result<Option<u64>, StoreError> {
        self.resp.table(db, create).await.map_err(err)
    }

    /// The table of `db`, created if it does not exist yet: what every write
    /// works on (and every read in a transaction, `tx.rs`).
    pub(super) async fn created_table(&self, db: u32) -> Result<u64, StoreError> {
        self.table(db, true).await?.ok_or_else(|| err("no table"))
    }

    /// A client call's error. An unknown table means `db`'s table was
    /// dropped (`insitu table drop`): its cached id is forgotten, so this
    /// command fails but the next one finds, or creates, the table again.
    pub(super) fn lost(&self, db: u32) -> impl Fn(ClientError) -> StoreError + '_ {
        move |e| {
            if e.status() == Some(Status::UnknownTable) {
                self.resp.forget(db);
            }
            err(e)
        }
    }

    pub(super) async fn client(&self) -> Result<&insitu_client::Client, StoreError> {
        self.resp.client().await.map_err(err)
    }

    fn local_read(&self, table: u64, key: &[u8]) -> Result<Local<Option<Versioned>>, StoreError> {
        if admit(self.state, table, key, false).is_err() {
            return Ok(Local::Forward);
        }
        let engine = self.state.engine.borrow();
        match engine.read(table, key) {
            Ok(obj) => Ok(Local::Done(Some(Versioned {
                value: Bytes::copy_from_slice(obj.value),
                version: obj.version,
                expires_at_ms: obj.expires_at_ms,
            }))),
            Err(EngineError::ObjectDoesntExist) => {
                match crate::lost::lost_from(self.state, table, key) {
                    0 => Ok(Local::Done(None)),
                    // The key may have existed: say so rather than "nil".
                    from => Err(err(format!("data lost: {}", crate::lost::message(from)))),
                }
            }
            Err(EngineError::UnknownTablet) => Ok(Local::Forward),
            Err(e) => Err(err(e)),
        }
    }

    fn local_put(&self, table: u64, put: Put<'_>) -> Result<Local<bool>, StoreError> {
        if !self.writes_here(table, put.key) {
            return Ok(Local::Forward);
        }
        let result = self.state.engine.borrow_mut().write_expiring(
            table,
            put.key,
            put.value,
            put.expires_at_ms,
            &engine_rules(put.cond),
        );
        match result {
            Ok(_) => Ok(Local::Done(true)),
            Err(e) if refused_by_rules(&e) => Ok(Local::Done(false)),
            Err(EngineError::UnknownTablet) => Ok(Local::Forward),
            Err(e) => Err(err(e)),
        }
    }

    fn local_del(&self, table: u64, key: &[u8], cond: Cond) -> Result<Local<bool>, StoreError> {
        if !self.writes_here(table, key) {
            return Ok(Local::Forward);
        }
        let result = self
            .state
            .engine
            .borrow_mut()
            .remove(table, key, &engine_rules(cond));
        match result {
            Ok(version) => Ok(Local::Done(version != 0)),
            Err(e) if refused_by_rules(&e) => Ok(Local::Done(false)),
            Err(EngineError::UnknownTablet) => Ok(Local::Forward),
            Err(e) => Err(err(e)),
        }
    }

    /// Whether `key` may be written here at once, with no timestamp: its
    /// tablet takes writes here, and no snapshot is read here (else the
    /// write is forwarded, as to another shard, to this shard's request
    /// port, which gives it a timestamp: `crate::stamped`). A write made
    /// here makes the table's commit bound unknown, as an unstamped plain
    /// write does.
    fn writes_here(&self, table: u64, key: &[u8]) -> bool {
        let here =
            !crate::stamped::needed(self.state) && admit(self.state, table, key, true).is_ok();
        if here {
            crate::stamped::unstamped(self.state, table);
        }
        here
    }

    /// Whether every key is served here right now (so a multi-key change can
    /// be made in one synchronous step: atomic, as nothing else runs on
    /// this thread meanwhile), and no snapshot is read here (else the change
    /// is a transaction, which snapshots order).
    fn all_local<'k>(&self, table: u64, keys: impl IntoIterator<Item = &'k [u8]>) -> bool {
        if crate::stamped::needed(self.state) {
            return false;
        }
        crate::stamped::unstamped(self.state, table);
        let engine = self.state.engine.borrow();
        keys.into_iter().all(|k| {
            admit(self.state, table, k, true).is_ok()
                && engine
                    .tablet_for(table, insitu_engine::key_hash(table, k))
                    .is_some()
        })
    }
}

impl Store for ShardStore<'_> {
    fn prefetch(&self, db: u32, keys: &[&[u8]]) {
        // Only a table already known: finding one may ask the coordinator.
        if let Some(table) = self.resp.cached_table(db) {
            self.state
                .engine
                .borrow()
                .prefetch(table, keys.iter().copied());
        }
    }

    async fn get(&self, db: u32, key: &[u8]) -> Result<Option<Versioned>, StoreError> {
        // A read creates the database's table too: an id that stays unknown
        // is not cached, so reads of a table nobody wrote yet would each ask
        // the coordinator (redis-benchmark's GETs before any SET did).
        let table = self.created_table(db).await?;
        if let Local::Done(v) = self.local_read(table, key)? {
            return Ok(v);
        }
        let found = self
            .client()
            .await?
            .read_expiring(table, key)
            .await
            .map_err(self.lost(db))?;
        Ok(found.map(|(value, version, expires_at_ms)| Versioned {
            value,
            version,
            expires_at_ms,
        }))
    }

    async fn put(&self, db: u32, put: Put<'_>) -> Result<bool, StoreError> {
        let table = self.created_table(db).await?;
        if let Local::Done(done) = self.local_put(table, put)? {
            return Ok(done);
        }
        let client = self.client().await?;
        let written = client
            .write_expiring(
                table,
                put.key,
                put.value,
                put.expires_at_ms,
                wire_rules(put.cond),
            )
            .await;
        match written {
            Ok(_) => Ok(true),
            Err(e) if client_refused(&e) => Ok(false),
            Err(e) => Err(self.lost(db)(e)),
        }
    }

    async fn del(&self, db: u32, key: &[u8], cond: Cond) -> Result<bool, StoreError> {
        let Some(table) = self.table(db, false).await? else {
            return Ok(false);
        };
        if let Local::Done(done) = self.local_del(table, key, cond)? {
            return Ok(done);
        }
        let client = self.client().await?;
        match client.remove_with(table, key, wire_rules(cond)).await {
            Ok(v) => Ok(v.is_some()),
            Err(e) if client_refused(&e) => Ok(false),
            Err(e) => Err(self.lost(db)(e)),
        }
    }

    async fn del_many(&self, db: u32, keys: &[Bytes]) -> Result<usize, StoreError> {
        let Some(table) = self.table(db, false).await? else {
            return Ok(0);
        };
        let mut removed = 0;
        let mut remote: Vec<&[u8]> = Vec::new();
        for key in keys {
            match self.local_del(table, key, Cond::Always)? {
                Local::Done(done) => removed += usize::from(done),
                Local::Forward => remote.push(key),
            }
        }
        if !remote.is_empty() {
            // One round trip per owning shard (in order within each, so a
            // key named twice is found once), not one per key.
            let client = self.client().await?;
            let items = client
                .multi_remove(table, &remote)
                .await
                .map_err(self.lost(db))?;
            for item in items {
                removed += usize::from(item.map_err(err)?.is_some());
            }
        }
        Ok(removed)
    }

    async fn mget(&self, db: u32, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, StoreError> {
        // Created if missing, as by `get`.
        let table = self.created_table(db).await?;
        let mut out: Vec<Option<Bytes>> = vec![None; keys.len()];
        let mut remote = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            match self.local_read(table, key)? {
                Local::Done(v) => out[i] = v.map(|v| v.value),
                Local::Forward => remote.push(i),
            }
        }
        if !remote.is_empty() {
            let wanted: Vec<&[u8]> = remote.iter().map(|&i| &keys[i][..]).collect();
            let found = self
                .client()
                .await?
                .multi_read(table, &wanted)
                .await
                .map_err(self.lost(db))?;
            for (&i, item) in remote.iter().zip(found) {
                out[i] = item.map_err(err)?.map(|(value, _)| value);
            }
        }
        Ok(out)
    }

    async fn mset(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<(), StoreError> {
        let table = self.created_table(db).await?;
        if self.all_local(table, pairs.iter().map(|(k, _)| &k[..])) {
            // All here: one synchronous step, so no reader sees half of it.
            let mut engine = self.state.engine.borrow_mut();
            refuse_bad_pairs(&engine, pairs)?;
            for (k, v) in pairs {
                engine
                    .write(table, k, v, &EngineRules::default())
                    .map_err(err)?;
            }
            return Ok(());
        }
        // Keys on several shards: a transaction makes them appear together.
        let client = self.client().await?;
        client
            .transaction(|mut tx| async move {
                for (k, v) in pairs {
                    tx.write(table, k, v);
                }
                Ok((tx, ()))
            })
            .await
            .map_err(self.lost(db))
    }

    async fn mset_absent(&self, db: u32, pairs: &[(Bytes, Bytes)]) -> Result<bool, StoreError> {
        let table = self.created_table(db).await?;
        if self.all_local(table, pairs.iter().map(|(k, _)| &k[..])) {
            let mut engine = self.state.engine.borrow_mut();
            if pairs.iter().any(|(k, _)| engine.read(table, k).is_ok()) {
                return Ok(false);
            }
            refuse_bad_pairs(&engine, pairs)?;
            for (k, v) in pairs {
                engine
                    .write(table, k, v, &EngineRules::default())
                    .map_err(err)?;
            }
            return Ok(true);
        }
        let client = self.client().await?;
        let keys: Vec<&[u8]> = pairs.iter().map(|(k, _)| &k[..]).collect();
        let keys = &keys;
        client
            .transaction(|mut tx| async move {
                let found = tx.read_many(table, keys).await?;
                if found.iter().any(Option::is_some) {
                    return Ok((tx, false));
                }
                for (k, v) in pairs {
                    tx.write(table, k, v);
                }
                Ok((tx, true))
            })
            .await
            .map_err(self.lost(db))
    }

    async fn rename(&self, db: u32, from: &[u8], to: &[u8]) -> Result<bool, StoreError> {
        let Some(table) = self.table(db, false).await? else {
            return Ok(false);
        };
        if self.all_local(table, [from, to]) {
            let mut engine = self.state.engine.borrow_mut();
            // The deadline goes with the value, as Redis's RENAME keeps a TTL.
            let (value, expires_at_ms) = match engine.read(table, from) {
                Ok(obj) => (obj.value.to_vec(), obj.expires_at_ms),
                Err(EngineError::ObjectDoesntExist) => return Ok(false),
                Err(e) => return Err(err(e)),
            };
            engine
                .write_expiring(table, to, &value, expires_at_ms, &EngineRules::default())
                .map_err(err)?;
            engine
                .remove(table, from, &EngineRules::default())
                .map_err(err)?;
            return Ok(true);
        }
        let client = self.client().await?;
        client
            .transaction(|mut tx| async move {
                let Some((value, version)) = tx.read_versioned(table, from).await? else {
                    return Ok((tx, false));
                };
                // The deadline goes along. A transaction's read carries none,
                // so it is read beside it; if the key changed in between the
                // two reads, the transaction runs again.
                let deadline = match client.read_expiring(table, from).await? {
                    Some((_, v, deadline)) if v == version => deadline,
                    _ => {
                        return Err(ClientError::Status(
                            Status::Conflict,
                            "the key changed while it was renamed".into(),
                        ));
                    }
                };
                tx.write_expiring(table, to, &value, deadline);
                tx.remove(table, from);
                Ok((tx, true))
            })
            .await
            .map_err(self.lost(db))
    }

    async fn dbsize(&self, db: u32) -> Result<u64, StoreError> {
        let Some(table) = self.table(db, false).await? else {
            return Ok(0);
        };
        self.client()
            .await?
            .count(table, &Selection::all())
            .await
            .map_err(self.lost(db))
    }

    async fn expiring(&self, db: u32) -> Result<ExpiringKeys, StoreError> {
        if self.table(db, false).await?.is_none() {
            return Ok(ExpiringKeys::default());
        }
        let client = self.client().await?;
        // Summed like `dbsize`, over every tablet of the table on every
        // server, but from the shards' figures (`TabletStat::expiring_*`,
        // kept per segment by the engine): no key is read. Each tablet of
        // a fresh map is taken from the shard the map names, so one being
        // moved (held by two shards for a while) counts once; a tablet
        // missing there means the map changed meanwhile: count again.
        for _ in 0..EXPIRING_ATTEMPTS {
            let map = client
                .open_table(&self.resp.table_name(db))
                .await
                .map_err(self.lost(db))?;
            let mut addrs: Vec<&str> = map.tablets.iter().map(|t| t.addr.as_str()).collect();
            addrs.sort_unstable();
            addrs.dedup();
            let stats = futures::future::try_join_all(addrs.iter().map(|a| client.shard_stats(a)))
                .await
                .map_err(err)?;
            if let Some(sum) = expiring_in(&map, &addrs, &stats) {
                return Ok(sum);
            }
        }
        Err(err(
            "the table's tablets kept moving while its keys with a deadline were counted; try again",
        ))
    }

    async fn scan(&self, db: u32, cursor: u64, count: usize) -> Result<ScanPage, StoreError> {
        let Some(table) = self.table(db, false).await? else {
            return Ok(ScanPage {
                keys: Vec::new(),
                cursor: 0,
            });
        };
        // The cursor is a position in key-hash order: where the walk goes on.
        let mut walk = self.client().await?.enumerate_at(table, cursor);
        let Some(batch) = walk.next_batch().await.map_err(self.lost(db))? else {
            return Ok(ScanPage {
                keys: Vec::new(),
                cursor: 0,
            });
        };
        if batch.len() > count {
            // Stop before the first key not returned; it starts the next page.
            // Keys sharing its hash are returned again then (SCAN allows it).
            let next = insitu_engine::key_hash(table, &batch[count].0).max(1);
            let keys = batch.into_iter().take(count).map(|(k, _, _)| k).collect();
            return Ok(ScanPage { keys, cursor: next });
        }
        let keys = batch.into_iter().map(|(k, _, _)| k).collect();
        Ok(ScanPage {
            keys,
            cursor: walk.position().unwrap_or(0),
        })
    }

    async fn flush(&self, db: u32) -> Result<(), StoreError> {
        let Some(table) = self.table(db, false).await? else {
            return Ok(());
        };
        let client = self.client().await?;
        let mut walk = client.enumerate(table);
        while let Some(batch) = walk.next_batch().await.map_err(self.lost(db))? {
            let keys: Vec<&[u8]> = batch.iter().map(|(k, _, _)| &k[..]).collect();
            for item in client
                .multi_remove(table, &keys)
                .await
                .map_err(self.lost(db))?
            {
                item.map_err(err)?;
            }
        }
        Ok(())
    }

    fn max_value_bytes(&self) -> usize {
        self.resp.config.max_value_bytes
    }

    fn modify_at_once(
        &self,
        db: u32,
        key: &[u8],
        f: &mut insitu_resp::Rewrite<'_>,
    ) -> Option<Result<Result<Vec<u8>, &'static str>, StoreError>> {
        // Only a key of a known table that this shard may write now with no
        // timestamp; else the caller's read and conditional write (which
        // forward) do it.
        let table = self.resp.cached_table(db)?;
        if !self.writes_here(table, key) {
            return None;
        }
        let result = self.state.engine.borrow_mut().modify(table, key, f);
        match result {
            Ok(done) => Some(Ok(done.map(|(value, _version)| value))),
            Err(EngineError::UnknownTablet) => None,
            Err(e) => Some(Err(err(e))),
        }
    }

    fn now_ms(&self) -> u64 {
        // The engine's clock decides expiry here; a forwarded key's owner
        // uses its own (the servers of a cluster keep their clocks in step).
        self.state.engine.borrow().now_ms()
    }

    async fn layout(&self) -> Result<Option<Vec<ClusterNode>>, StoreError> {
        super::cluster::layout(self).await
    }

    async fn redirect(&self, db: u32, key: &[u8]) -> Result<Option<String>, StoreError> {
        super::cluster::redirect(self, db, key).await
    }
}
