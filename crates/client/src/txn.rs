//! Multi-key transactions: reads remember the version they saw, writes wait
//! in the transaction, and `commit` runs the two-phase commit over the
//! shards that own the keys (ARCHITECTURE.md, "Transactions").
//!
//! A committed transaction is serializable: it takes effect at one instant
//! at which every key it read still had the version it read, and its writes
//! appear together. Conflicts (a key read changed, a key locked by another
//! transaction) abort it with `Status::Conflict`; `Client::transaction`
//! runs the body again until it commits.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use insitu_keyhash::key_hash;
use insitu_protocol::txn::{
    MAX_TXN_ITEMS, MAX_TXN_PARTICIPANTS, TxnAnchor, TxnId, TxnItem, TxnWrite,
};
use insitu_protocol::{Request, Response, Status, blob};

use crate::client::{Client, decode};
use crate::error::ClientError;
use crate::routing::{Endpoint, call_endpoint};
use crate::rpc::Reply;
use crate::txn_decide::{decide, direct_commit};

/// A transaction in progress. Made by `Client::begin` (or for the body of
/// `Client::transaction`); nothing reaches the store before `commit`.
pub struct Transaction {
    client: Client,
    /// Keys read: the version seen (0: absent) and the value, so reading a
    /// key again returns what the transaction saw first.
    reads: HashMap<(u64, Vec<u8>), (u64, Option<Bytes>)>,
    /// Writes waiting for the commit: Some(value) puts, None removes.
    /// Ordered, so the items a shard gets come in one order for every client.
    writes: BTreeMap<(u64, Vec<u8>), Option<Vec<u8>>>,
    /// Deadlines (Unix ms) of the puts in `writes` that have one.
    deadlines: HashMap<(u64, Vec<u8>), u64>,
}

/// What a commit does to one key it names: `None` only validates its read,
/// `Some(None)` removes it, `Some(Some(value))` writes `value`.
type KeyWrite = Option<Option<Vec<u8>>>;

/// One participant shard of a commit: its endpoint and its items.
pub(crate) struct Share {
    pub(crate) ep: Arc<Endpoint>,
    /// (table, key, read version, write)
    items: Vec<(u64, Vec<u8>, Option<u64>, KeyWrite)>,
}

/// How a participant answered the prepare.
pub(crate) enum Vote {
    /// `needs_ts`: the participant keeps versions for snapshot reads, so the
    /// commit needs a timestamp.
    Yes { needs_ts: bool },
    /// A definite no: the participant holds nothing of the transaction.
    No(ClientError),
    /// No answer: it may or may not be prepared.
    Unknown(ClientError),
}

/// Whether a transaction that failed with `e` may simply be run again: it
/// certainly did not commit, and running it again may succeed.
pub fn is_retryable(e: &ClientError) -> bool {
    matches!(
        e.status(),
        Some(Status::Conflict | Status::Retry | Status::UnknownTablet | Status::StaleMap)
    )
}

impl Client {
    /// Start a transaction. Prefer `transaction`, which also retries.
    pub fn begin(&self) -> Transaction {
        Transaction {
            client: self.clone(),
            reads: HashMap::new(),
            writes: BTreeMap::new(),
            deadlines: HashMap::new(),
        }
    }

    /// Run `body` in a transaction and commit it; on a conflict run it again
    /// (with a randomised back-off) until it commits or the client's
    /// operation timeout passes. `body` must have no effects outside the
    /// transaction that cannot be repeated. Errors other than conflicts end
    /// it at once; `ClientError::TxnOutcomeUnknown` says the commit may or
    /// may not have happened (the connection to the deciding shard failed).
    ///
    /// The body gets the transaction by value and hands it back with its
    /// result (`|mut tx| async move { ..; Ok((tx, value)) }`): no borrow of
    /// the transaction crosses an `.await` of the caller, so the call stays
    /// `Send` (`tokio::spawn` works) and the body may borrow from outside
    /// (`let key = &key;` before the closure, then `async move`).
    ///
    /// ```no_run
    /// # async fn transfer(client: &insitu_client::Client, t: u64) -> Result<(), insitu_client::ClientError> {
    /// let moved = client
    ///     .transaction(|mut tx| async move {
    ///         let alice = tx.read(t, "alice").await?; // its version is checked at commit
    ///         if alice.is_none() {
    ///             return Ok((tx, false)); // nothing written: commits trivially
    ///         }
    ///         tx.write(t, "alice", b"70");
    ///         tx.write(t, "bob", b"80");
    ///         Ok((tx, true))
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn transaction<T, F, Fut>(&self, mut body: F) -> Result<T, ClientError>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: std::future::Future<Output = Result<(Transaction, T), ClientError>>,
    {
        let start = Instant::now();
        let deadline = self.deadline();
        let mut attempts = 0u32;
        let mut backoff = Duration::from_micros(200);
        loop {
            attempts += 1;
            let outcome = match body(self.begin()).await {
                Ok((tx, v)) => tx.commit().await.map(|()| v),
                Err(e) => Err(e),
            };
            match outcome {
                Err(e) if is_retryable(&e) => {
                    if Instant::now() >= deadline {
                        return Err(crate::client::gave_up(start, attempts, e));
                    }
                    // Randomised so that transactions that conflicted once do
                    // not meet again at the same instant.
                    let sleep = backoff.mul_f64(fastrand::f64() + 0.5);
                    tokio::time::sleep(
                        sleep.min(deadline.saturating_duration_since(Instant::now())),
                    )
                    .await;
                    backoff = (backoff * 2).min(Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }
}

impl Transaction {
    /// Read `key` of `table` as the transaction sees it: its own write if it
    /// wrote the key, else the stored value (None: absent), whose version the
    /// commit checks.
    pub async fn read(
        &mut self,
        table: u64,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<Bytes>, ClientError> {
        let k = (table, key.as_ref().to_vec());
        if let Some(w) = self.writes.get(&k) {
            return Ok(w.as_ref().map(|v| Bytes::copy_from_slice(v)));
        }
        if let Some((_, v)) = self.reads.get(&k) {
            return Ok(v.clone());
        }
        let found = self.client.read(table, &k.1).await?;
        let (version, value) = match found {
            Some((value, version)) => (version, Some(value)),
            None => (0, None),
        };
        self.reads.insert(k, (version, value.clone()));
        Ok(value)
    }

    /// `read`, with the version the commit will check (0: absent). A key
    /// this transaction wrote answers its own value with version 0 (not yet
    /// committed, it has none).
    pub async fn read_versioned(
        &mut self,
        table: u64,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<(Bytes, u64)>, ClientError> {
        let key = key.as_ref();
        let value = self.read(table, key).await?;
        let version = match self.writes.contains_key(&(table, key.to_vec())) {
            true => 0,
            false => self
                .reads
                .get(&(table, key.to_vec()))
                .map_or(0, |(v, _)| *v),
        };
        Ok(value.map(|v| (v, version)))
    }

    /// Read several keys of `table` at once (one multiRead per shard, in
    /// parallel), as `read` does each: the results in the keys' order.
    pub async fn read_many<K: AsRef<[u8]>>(
        &mut self,
        table: u64,
        keys: &[K],
    ) -> Result<Vec<Option<Bytes>>, ClientError> {
        let mut out: Vec<Option<Option<Bytes>>> = vec![None; keys.len()];
        let mut missing = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let k = (table, key.as_ref().to_vec());
            if let Some(w) = self.writes.get(&k) {
                out[i] = Some(w.as_ref().map(|v| Bytes::copy_from_slice(v)));
            } else if let Some((_, v)) = self.reads.get(&k) {
                out[i] = Some(v.clone());
            } else {
                missing.push(i);
            }
        }
        if !missing.is_empty() {
            let wanted: Vec<&[u8]> = missing.iter().map(|&i| keys[i].as_ref()).collect();
            let found = self.client.multi_read(table, &wanted).await?;
            for (&i, result) in missing.iter().zip(found) {
                let (version, value) = match result? {
                    Some((value, version)) => (version, Some(value)),
                    None => (0, None),
                };
                self.reads
                    .insert((table, keys[i].as_ref().to_vec()), (version, value.clone()));
                out[i] = Some(value);
            }
        }
        Ok(out
            .into_iter()
            .map(|v| v.expect("every key answered"))
            .collect())
    }

    /// Write `value` under `key` at the commit.
    pub fn write(&mut self, table: u64, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.write_expiring(table, key, value, 0);
    }

    /// `write` of an object that stops existing at `expires_at_ms` (Unix
    /// ms; 0: never), as `Client::write_expiring`.
    pub fn write_expiring(
        &mut self,
        table: u64,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        expires_at_ms: u64,
    ) {
        let k = (table, key.as_ref().to_vec());
        match expires_at_ms {
            0 => self.deadlines.remove(&k),
            d => self.deadlines.insert(k.clone(), d),
        };
        self.writes.insert(k, Some(value.as_ref().to_vec()));
    }

    /// The deadline this transaction gives `key` (0: none, or not written here).
    pub fn written_deadline(&self, table: u64, key: impl AsRef<[u8]>) -> u64 {
        let k = (table, key.as_ref().to_vec());
        self.deadlines.get(&k).copied().unwrap_or(0)
    }

    /// Remove `key` at the commit.
    pub fn remove(&mut self, table: u64, key: impl AsRef<[u8]>) {
        let k = (table, key.as_ref().to_vec());
        self.deadlines.remove(&k);
        self.writes.insert(k, None);
    }

    /// Commit: Ok once every write is applied as one. `Status::Conflict`
    /// (see `is_retryable`): nothing was applied; run the transaction again.
    pub async fn commit(self) -> Result<(), ClientError> {
        // Nothing written and at most one key read: that read was a
        // consistent view by itself.
        if self.writes.is_empty() && self.reads.len() <= 1 {
            return Ok(());
        }
        let deadline = self.client.deadline();
        let shares = self.shares(deadline).await?;
        within_limits(&shares, |s| s.items.len())?;
        let addrs: Vec<String> = shares.keys().cloned().collect();
        let primary = addrs[0].clone();
        let txn: TxnId = fastrand::u64(1..);
        // Each participant is named by its anchor, its first item's key:
        // records and decisions live in that key's tablet, and a request
        // routed by key finds them after a move or a recovery.
        let anchor = |addr: &String| {
            let (table, key, ..) = &shares[addr].items[0];
            TxnAnchor {
                table: *table,
                key: blob(key),
            }
        };
        let primary_anchor = anchor(&primary);
        let writes = !self.writes.is_empty();
        let other_anchors: Vec<TxnAnchor<'_>> = addrs[1..].iter().map(anchor).collect();

        let prepares = shares.iter().map(|(addr, share)| {
            let is_primary = *addr == primary;
            let items: Vec<TxnItem<'_>> = share
                .items
                .iter()
                .map(|(table, key, read_version, write)| TxnItem {
                    table: *table,
                    key: blob(key),
                    read_version: *read_version,
                    write: match write {
                        None => TxnWrite::None,
                        Some(Some(v)) => match self.deadlines.get(&(*table, key.clone())) {
                            Some(&expires_at_ms) => TxnWrite::PutExpiring {
                                value: blob(v),
                                expires_at_ms,
                            },
                            None => TxnWrite::Put(blob(v)),
                        },
                        Some(None) => TxnWrite::Remove,
                    },
                })
                .collect();
            let request = Request::TxnPrepare {
                txn,
                primary: (!is_primary).then(|| primary_anchor.clone()),
                others: if is_primary {
                    other_anchors.clone()
                } else {
                    Vec::new()
                },
                items,
                writes,
            };
            async move {
                let reply = call_endpoint(&share.ep, &request, false, deadline).await;
                (addr.clone(), reply)
            }
        });
        let replies = futures::future::join_all(prepares).await;

        if shares.len() == 1 {
            // One participant: its prepare committed or refused at once.
            let (addr, reply) = replies.into_iter().next().expect("one share");
            return match reply {
                Ok(r) => self
                    .after_refusal(&r, &addr)
                    .and_then(|()| match decode(&r, &addr)? {
                        Response::TxnDecided {
                            committed: true, ..
                        } => Ok(()),
                        Response::TxnDecided {
                            committed: false, ..
                        } => Err(aborted(txn, "")),
                        other => Err(ClientError::unexpected(
                            &addr,
                            format!("{other:?} to TxnPrepare"),
                        )),
                    }),
                Err(e) => Err(ClientError::TxnOutcomeUnknown {
                    txn,
                    why: e.to_string(),
                }),
            };
        }

        let mut votes = Vec::with_capacity(replies.len());
        for (addr, reply) in replies {
            let vote = match reply {
                Ok(r) if r.status == Status::Ok => match decode(&r, &addr) {
                    Ok(Response::TxnPrepared { needs_ts }) => Vote::Yes { needs_ts },
                    Ok(other) => Vote::Unknown(ClientError::unexpected(
                        &addr,
                        format!("{other:?} to TxnPrepare"),
                    )),
                    Err(e) => Vote::Unknown(e),
                },
                Ok(r) => match self.after_refusal(&r, &addr) {
                    Err(e) => Vote::No(e),
                    Ok(()) => Vote::Unknown(ClientError::unexpected(&addr, "empty refusal")),
                },
                Err(e) => Vote::Unknown(e),
            };
            votes.push((addr, vote));
        }
        let commit = votes.iter().all(|(_, v)| matches!(v, Vote::Yes { .. }));
        let needs_ts = votes
            .iter()
            .any(|(_, v)| matches!(v, Vote::Yes { needs_ts: true }));
        let uncertain = votes.iter().any(|(_, v)| matches!(v, Vote::Unknown(_)));
        let mut first_no = votes.iter().find_map(|(_, v)| match v {
            Vote::No(e) | Vote::Unknown(e) => Some(e.clone()),
            Vote::Yes { .. } => None,
        });

        if !uncertain && (!commit || !writes) {
            // Every vote is known and one is a no: the outcome is an abort
            // whoever decides (a resolution would find that participant
            // unprepared), so every participant, the primary included, is
            // told at once. So is a read-only transaction's commit: nothing
            // is applied anywhere, so nothing needs a durable decision. A
            // commit that writes is told to all at once too, but each
            // participant keeps it durably (below).
            let shares = &shares;
            let tell = votes.iter().filter(|(_, v)| !matches!(v, Vote::No(_))).map(
                |(addr, _)| async move {
                    (
                        addr.clone(),
                        decide(&shares[addr].ep, txn, (commit, 0), (false, true), deadline).await,
                    )
                },
            );
            for (addr, outcome) in futures::future::join_all(tell).await {
                match outcome {
                    // A participant that already took the other decision
                    // lost its prepared state (ARCHITECTURE.md, known gaps).
                    Ok((c, _)) if c != commit => {
                        return Err(ClientError::Status(
                            Status::Internal,
                            format!(
                                "transaction {txn:#x}: {addr} answered committed={c} to the decision committed={commit}"
                            ),
                        ));
                    }
                    // One that does not hear it resolves with the primary
                    // after its timeout (nothing to apply either way).
                    Ok(_) | Err(_) => {}
                }
            }
            return if commit {
                Ok(())
            } else {
                Err(first_no.unwrap_or_else(|| aborted(txn, "aborted")))
            };
        }

        // All yes in a transaction that writes: a commit, told to every
        // participant at once (`direct_commit`). A vote unknown (it may have
        // been a yes): the primary decides first (durably, and it answers
        // the decision that stands, a resolution's included), then the
        // others learn it; the client asks for an abort, and the primary's
        // answer may still be a commit that a resolution took.
        //
        // A commit's timestamp is taken now, after every participant locked
        // its keys: a snapshot read that could miss the commit anywhere was
        // issued before it (ARCHITECTURE.md, "Snapshot reads"). Only when a
        // participant keeps versions for snapshot reads; otherwise none is
        // needed (0). No timestamp, no commit: the primary is asked to abort.
        let mut commit_ts = 0;
        let mut commit = commit;
        if commit && needs_ts {
            match self.client.timestamp().await {
                Ok(ts) => commit_ts = ts,
                Err(e) => {
                    first_no.get_or_insert(e);
                    commit = false;
                }
            }
        }
        if commit {
            return direct_commit(&shares, &votes, &primary, txn, commit_ts, deadline).await;
        }
        let primary_ep = &shares[&primary].ep;
        let (committed, commit_ts) = match decide(
            primary_ep,
            txn,
            (commit, commit_ts),
            (false, true),
            deadline,
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                return Err(ClientError::TxnOutcomeUnknown {
                    txn,
                    why: format!("the deciding shard {primary} did not answer: {e}"),
                });
            }
        };
        let tell = votes
            .iter()
            .filter(|(addr, v)| *addr != primary && !matches!(v, Vote::No(_)))
            .map(|(addr, _)| {
                decide(
                    &shares[addr].ep,
                    txn,
                    (committed, commit_ts),
                    (false, true),
                    deadline,
                )
            });
        // Waiting here makes the writes visible before commit returns. A
        // participant that does not hear it asks the primary after its
        // timeout, so a failed call here loses nothing.
        let _ = futures::future::join_all(tell).await;
        if committed {
            Ok(())
        } else {
            Err(first_no.unwrap_or_else(|| aborted(txn, "the deciding shard aborted it")))
        }
    }

    /// Group the transaction's keys by the shard that owns them.
    async fn shares(&self, deadline: Instant) -> Result<BTreeMap<String, Share>, ClientError> {
        let mut items: BTreeMap<(u64, Vec<u8>), (Option<u64>, KeyWrite)> = BTreeMap::new();
        for (k, (version, _)) in &self.reads {
            items.insert(k.clone(), (Some(*version), None));
        }
        for (k, w) in &self.writes {
            items.entry(k.clone()).or_insert((None, None)).1 = Some(w.clone());
        }
        let mut shares: BTreeMap<String, Share> = BTreeMap::new();
        for ((table, key), (read_version, write)) in items {
            let route = self.client.route(table, deadline).await?;
            let hash = key_hash(table, &key);
            let i = route
                .locate(hash)
                .ok_or(ClientError::NoTablet { table, hash })?;
            let ep = route.endpoint(i).clone();
            shares
                .entry(ep.addr.clone())
                .or_insert_with(|| Share {
                    ep,
                    items: Vec::new(),
                })
                .items
                .push((table, key, read_version, write));
        }
        Ok(shares)
    }

    /// The error of a refused prepare; a refusal that names a stale map drops
    /// the cached maps of the tables involved so the next run refreshes them.
    fn after_refusal(&self, reply: &Reply, addr: &str) -> Result<(), ClientError> {
        match reply.status {
            Status::Ok => Ok(()),
            Status::UnknownTablet | Status::StaleMap => {
                for (table, _) in self.reads.keys().chain(self.writes.keys()) {
                    self.client.forget_map(*table);
                }
                Err(ClientError::Status(reply.status, reply.error_message()))
            }
            Status::Conflict => Err(ClientError::Status(Status::Conflict, reply.error_message())),
            s => Err(ClientError::Status(
                s,
                format!("{addr}: {}", reply.error_message()),
            )),
        }
    }
}

pub(crate) fn aborted(txn: TxnId, why: &str) -> ClientError {
    let why = if why.is_empty() { "aborted" } else { why };
    ClientError::Status(Status::Conflict, format!("transaction {txn:#x}: {why}"))
}

/// Refuse a transaction over the protocol's limits (`MAX_TXN_ITEMS` keys on
/// one shard, `MAX_TXN_PARTICIPANTS` shards) before anything is sent or
/// locked, with a reason the caller can act on, rather than have a
/// participant's decoder refuse the prepare as a malformed message.
/// `items` counts a share's keys.
fn within_limits<S>(
    shares: &BTreeMap<String, S>,
    items: impl Fn(&S) -> usize,
) -> Result<(), ClientError> {
    if let Some((addr, n)) = shares
        .iter()
        .map(|(addr, s)| (addr, items(s)))
        .find(|&(_, n)| n > MAX_TXN_ITEMS)
    {
        return Err(ClientError::Status(
            Status::BadRequest,
            format!(
                "the transaction touches {n} keys on one shard ({addr}), more than the limit of {MAX_TXN_ITEMS} per shard; nothing was written"
            ),
        ));
    }
    if shares.len() > MAX_TXN_PARTICIPANTS {
        return Err(ClientError::Status(
            Status::BadRequest,
            format!(
                "the transaction spans {} shards, more than the limit of {MAX_TXN_PARTICIPANTS}; nothing was written",
                shares.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "txn_tests.rs"]
mod tests;
