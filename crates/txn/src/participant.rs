//! One participant's side of a transaction's commit, without I/O: the lock
//! table, the prepared transactions, and the decisions it remembers.
//!
//! The protocol (RAMCloud's, with the outcome kept by one participant):
//! 1. The client sends every participant its items (`prepare`). A
//!    participant says yes only if no other transaction holds a lock on any
//!    of the keys and every key read still has the version the client read;
//!    it then locks the keys it will write and keeps the items.
//! 2. With every vote known, the outcome is known (all yes: commit; a no:
//!    abort) and the client tells every participant at once (`decide`). With
//!    a vote unknown, it asks the *primary* participant first, which records
//!    the first decision it takes and answers it for ever (within
//!    `Limits::decision_ttl_ms`); then it tells the others. Every
//!    participant that applies a commit keeps it (the server makes it
//!    durable), so a primary deciding an orphan learns it (`phase`).
//! 3. A participant left prepared past a timeout (the client went silent)
//!    asks the primary (`TxnResolve`). The primary, if undecided, asks every
//!    other participant where it stands (`phase`): one that never saw the
//!    transaction records it aborted (so the prepare still in flight is
//!    refused when it arrives), which makes the primary abort; if all are
//!    prepared, every vote was yes, and it commits; if one committed (the
//!    client told it directly), it commits at that one's timestamp.
//!
//! Why this is atomic: a participant applies writes only on a commit
//! decision; a commit is decided only when every participant voted yes
//! (by the client, which saw the votes, or by the primary, which asked),
//! and an abort only when one did not, so the two can never both happen.
//! Why serializable: a transaction's reads are validated while its write
//! locks are held, so it takes effect at one point (all locks held) at
//! which everything it read was still current (RAMCloud, Lee et al. 2015).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::locks::Locks;

use crate::item::show_key;
pub use crate::item::{Item, Refusal, TxnId, Write};

/// Where a transaction stands here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Prepared,
    Committed,
    Aborted,
}

/// A key that names a participant: the participant is whichever shard owns
/// the key's tablet *now*. Why a key, not an address: a tablet moves or is
/// recovered onto another server, and the transaction's records go with it;
/// a request routed by key finds them wherever they are.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Anchor {
    pub table: u64,
    pub key: Vec<u8>,
}

/// A transaction validated and locked here, waiting for its decision.
#[derive(Debug)]
pub struct Prepared {
    /// The primary's anchor (its first item): the tablet that holds the
    /// decision, asked by anyone who must learn it.
    pub primary: Anchor,
    /// Whether this participant is the primary (holds the part of the
    /// primary's anchor tablet, so it decides).
    pub is_primary: bool,
    /// At the primary: the other participants' anchors.
    pub others: Vec<Anchor>,
    pub items: Vec<Item>,
    /// The participants whose yes vote is held here, by anchor (`voted`).
    /// Why not "prepared here" alone: a recovery or a move can bring parts
    /// of several participants of one transaction onto one shard, and a
    /// primary asking whether participant P voted yes must hear about P, not
    /// about another participant's part that happens to sit beside it.
    pub voters: Vec<Anchor>,
    /// When it was prepared (the caller's clock, ms): overdue after the timeout.
    pub since_ms: u64,
    /// Bytes charged for it (`held_bytes`).
    bytes: usize,
}

/// Bounds of a participant.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most bytes all prepared transactions may hold (keys, values, overhead).
    pub max_held_bytes: usize,
    /// How long a decision is remembered: a participant asking later than
    /// this (partitioned away that long while prepared) gets "aborted".
    pub decision_ttl_ms: u64,
    /// Most decisions remembered (the oldest go first past it).
    pub max_decisions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // Why 64 MiB: a shard's prepared transactions are in flight for a
            // round trip each; 64 MiB is thousands of large ones at once.
            max_held_bytes: 64 << 20,
            // Why 10 min: far beyond any resolution delay but a partition.
            decision_ttl_ms: 600_000,
            // Why 1M: ~40 MB at most; at 10k commits/s per shard it covers
            // 100 s, still far beyond a prepared transaction's timeout.
            max_decisions: 1_000_000,
        }
    }
}

/// What `decide` asks the caller to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Apply {
    /// Write these items (puts and removes) to the store: a commit.
    Writes(Vec<Item>),
    /// Nothing to apply (an abort, or a decision already taken here).
    Nothing,
}

/// A participant's transaction state (one per shard).
#[derive(Debug)]
pub struct Participant {
    limits: Limits,
    /// The write locks (`locks.rs`).
    locks: Locks,
    prepared: HashMap<TxnId, Prepared>,
    /// Decisions taken or learned here, and their order for expiry.
    decisions: HashMap<TxnId, bool>,
    decided_order: VecDeque<(u64, TxnId)>,
    /// Bytes all prepared transactions hold.
    held_bytes: usize,
    /// Decisions dropped by the count limit, until `expire` hands them out
    /// (so their durable records are removed too).
    pushed_out: Vec<TxnId>,
}

impl Participant {
    pub fn new(limits: Limits) -> Participant {
        Participant {
            limits,
            locks: Locks::default(),
            prepared: HashMap::new(),
            decisions: HashMap::new(),
            decided_order: VecDeque::new(),
            held_bytes: 0,
            pushed_out: Vec::new(),
        }
    }

    /// Validate and lock `items` of `txn`. `version_of(item)` is the key's
    /// current version in the store (0 if absent). Ok: a yes vote.
    pub fn prepare(
        &mut self,
        txn: TxnId,
        primary: Option<Anchor>,
        others: Vec<Anchor>,
        items: Vec<Item>,
        now_ms: u64,
        version_of: impl Fn(&Item) -> u64,
    ) -> Result<(), Refusal> {
        if let Some(&committed) = self.decisions.get(&txn) {
            return Err(Refusal::Decided { committed });
        }
        let Some(first) = items.first() else {
            return Err(Refusal::Bad(format!(
                "transaction {txn:#x}: a prepare without items"
            )));
        };
        let (primary, is_primary) = match primary {
            Some(a) => (a, false),
            None => (
                Anchor {
                    table: first.table,
                    key: first.key.clone(),
                },
                true,
            ),
        };
        if let Some(p) = self.prepared.get(&txn) {
            // A resend of the same prepare is a yes again; another item set
            // under the same id is a collision of random ids.
            let same = p.items.len() == items.len()
                && p.items
                    .iter()
                    .zip(&items)
                    .all(|(a, b)| a.table == b.table && a.key == b.key);
            return if same {
                Ok(())
            } else {
                Err(Refusal::Bad(format!(
                    "transaction id {txn:#x} is in use for other keys"
                )))
            };
        }
        let mut seen = HashSet::with_capacity(items.len());
        for item in &items {
            if !seen.insert((item.table, item.key.as_slice())) {
                return Err(Refusal::Bad(format!(
                    "key {} of table {} appears twice in one prepare",
                    show_key(&item.key),
                    item.table
                )));
            }
        }
        let bytes: usize = items.iter().map(Item::held_bytes).sum();
        if self.held_bytes + bytes > self.limits.max_held_bytes {
            return Err(Refusal::Full {
                held_bytes: self.held_bytes,
                bytes,
            });
        }
        for item in &items {
            if let Some(by) = self.locks.holder(item.table, &item.key) {
                return Err(Refusal::Locked {
                    table: item.table,
                    key: item.key.clone(),
                    by,
                });
            }
            if let Some(read) = item.read_version {
                let now = version_of(item);
                if now != read {
                    return Err(Refusal::Changed {
                        table: item.table,
                        key: item.key.clone(),
                        read,
                        now,
                    });
                }
            }
        }
        // Validated: locking and keeping are what a restore does too (no
        // key can clash now, every one was checked above).
        let kept = self.restore(txn, primary, is_primary, others, items, now_ms);
        debug_assert!(kept.is_ok(), "a validated prepare clashed: {kept:?}");
        Ok(())
    }

    /// Take back a part of `txn` found in a durable record (after a crash
    /// recovery replayed the tablet that held it): lock its keys and keep
    /// its items, without validation (it voted yes before the crash) and
    /// beyond the byte limit (a recovery cannot be refused for it). Several
    /// records of one transaction (one per tablet) merge; the primary's
    /// anchor record makes it the primary here. A key locked by another
    /// transaction is left to that one and reported in the Err (a bug: two
    /// live records never lock one key).
    pub fn restore(
        &mut self,
        txn: TxnId,
        primary: Anchor,
        is_primary: bool,
        others: Vec<Anchor>,
        items: Vec<Item>,
        now_ms: u64,
    ) -> Result<(), String> {
        let mut clash = None;
        let mut items = items;
        items.retain(|item| {
            if item.write == Write::None {
                return true;
            }
            match self.locks.holder(item.table, &item.key) {
                Some(by) if by != txn => {
                    clash = Some(format!(
                        "key {} of table {} is locked by transaction {by:#x} and recorded by {txn:#x}",
                        show_key(&item.key),
                        item.table
                    ));
                    false
                }
                _ => {
                    self.locks.lock(item.table, &item.key, txn, item.hash);
                    true
                }
            }
        });
        let bytes: usize = items.iter().map(Item::held_bytes).sum();
        self.held_bytes += bytes;
        match self.prepared.get_mut(&txn) {
            Some(p) => {
                p.items.extend(items);
                p.bytes += bytes;
                if is_primary {
                    p.is_primary = true;
                    p.others = others;
                }
            }
            None => {
                self.prepared.insert(
                    txn,
                    Prepared {
                        primary,
                        is_primary,
                        others,
                        items,
                        voters: Vec::new(),
                        since_ms: now_ms,
                        bytes,
                    },
                );
            }
        }
        match clash {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Take back a decision found in a durable record (a commit at the
    /// primary's anchor).
    pub fn restore_decision(&mut self, txn: TxnId, committed: bool, now_ms: u64) {
        if !self.decisions.contains_key(&txn) {
            self.record(txn, committed, now_ms);
        }
    }

    /// Take decision `commit` for `txn` (or learn it from the primary).
    /// The first decision recorded here stands: a later, different one is
    /// ignored and the recorded one returned (and applied to a part still
    /// prepared). Returns the outcome and what to apply.
    pub fn decide(&mut self, txn: TxnId, commit: bool, now_ms: u64) -> (bool, Apply) {
        let commit = self.settle(txn, commit, now_ms);
        (commit, self.finish(txn))
    }

    /// The first half of `decide`: record decision `commit` for `txn` unless
    /// one is recorded; returns the one that stands. The part prepared here
    /// stays locked until `finish`, so a caller can make the decision
    /// durable first while nobody else touches the keys.
    pub fn settle(&mut self, txn: TxnId, commit: bool, now_ms: u64) -> bool {
        match self.decisions.get(&txn) {
            Some(&committed) => committed,
            None => {
                self.record(txn, commit, now_ms);
                commit
            }
        }
    }

    /// The second half of `decide`: release the part prepared here (if any)
    /// under the decision recorded for it, and say what to apply.
    pub fn finish(&mut self, txn: TxnId) -> Apply {
        let Some(&commit) = self.decisions.get(&txn) else {
            debug_assert!(false, "finish before settle");
            return Apply::Nothing;
        };
        match self.release(txn) {
            Some(writes) if commit => Apply::Writes(writes),
            _ => Apply::Nothing,
        }
    }

    /// Release `txn`'s part prepared here without recording a decision:
    /// unlock its keys and return its writes (None: not prepared here).
    /// Only for a part nobody else can ask about: a one-phase part this
    /// shard made itself (a plain write that takes a timestamp while
    /// snapshots are read), whose outcome is its caller's to apply. Why no
    /// decision: none is ever asked for, and a decision per plain write
    /// would fill `max_decisions` for nothing.
    pub fn release(&mut self, txn: TxnId) -> Option<Vec<Item>> {
        let p = self.prepared.remove(&txn)?;
        self.held_bytes -= p.bytes;
        for item in p.items.iter().filter(|i| i.write != Write::None) {
            let removed = self.locks.unlock(item.table, &item.key);
            debug_assert_eq!(
                removed,
                Some(txn),
                "a prepared key is locked by its transaction"
            );
        }
        Some(
            p.items
                .into_iter()
                .filter(|i| i.write != Write::None)
                .collect(),
        )
    }

    /// The decision recorded here, if any.
    pub fn decision(&self, txn: TxnId) -> Option<bool> {
        self.decisions.get(&txn).copied()
    }

    /// Record that the participant named by `anchor` voted yes for `txn`
    /// here: every part of its prepare is held (the caller has written all
    /// of its records, or restored the record that proves it). Only then
    /// may `phase` answer `Prepared` for it.
    pub fn voted(&mut self, txn: TxnId, anchor: Anchor) {
        if let Some(p) = self.prepared.get_mut(&txn)
            && !p.voters.contains(&anchor)
        {
            p.voters.push(anchor);
        }
    }

    /// Where the participant named by `anchor` stands on `txn` here, for a
    /// primary deciding an orphan. A transaction never seen is recorded
    /// aborted first, so its prepare, if still on its way, is refused when
    /// it comes. One held here only as other participants' parts (brought
    /// by a recovery or a move) is `Aborted` for this participant, which
    /// never voted here, and nothing is recorded: its late prepare is
    /// refused anyway (the id is in use here for other keys, or decided by
    /// then), and the parts here follow the primary's decision.
    ///
    /// A decision taken here answers first, even while its part is still
    /// prepared (being applied): a participant that has taken a client's
    /// commit must say so, so that the primary commits it too, at the same
    /// timestamp, rather than decide it again.
    pub fn phase(&mut self, txn: TxnId, anchor: &Anchor, now_ms: u64) -> Phase {
        match self.decisions.get(&txn) {
            Some(true) => return Phase::Committed,
            Some(false) => return Phase::Aborted,
            None => {}
        }
        if let Some(p) = self.prepared.get(&txn) {
            return match p.voters.contains(anchor) {
                true => Phase::Prepared,
                false => Phase::Aborted,
            };
        }
        self.record(txn, false, now_ms);
        Phase::Aborted
    }

    /// The prepared transaction `txn`, if it is prepared here.
    pub fn prepared(&self, txn: TxnId) -> Option<&Prepared> {
        self.prepared.get(&txn)
    }

    /// Transactions prepared at or before `now_ms - timeout_ms`: their
    /// client went silent (or is slow); they need resolving.
    pub fn overdue(&self, now_ms: u64, timeout_ms: u64) -> Vec<TxnId> {
        let mut v: Vec<TxnId> = self
            .prepared
            .iter()
            .filter(|(_, p)| p.since_ms + timeout_ms <= now_ms)
            .map(|(&t, _)| t)
            .collect();
        v.sort_unstable();
        v
    }

    /// The write locks held here.
    pub fn locks(&self) -> &Locks {
        &self.locks
    }

    pub fn prepared_count(&self) -> usize {
        self.prepared.len()
    }

    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Forget decisions past their time to live, and those pushed out by
    /// the count limit since the last call; returns them (their durable
    /// records may go too). A transaction still prepared here keeps its
    /// decision until it is finished.
    pub fn expire(&mut self, now_ms: u64) -> Vec<TxnId> {
        let mut gone = std::mem::take(&mut self.pushed_out);
        while let Some(&(at, txn)) = self.decided_order.front() {
            if at + self.limits.decision_ttl_ms > now_ms || self.prepared.contains_key(&txn) {
                break;
            }
            self.decided_order.pop_front();
            self.decisions.remove(&txn);
            gone.push(txn);
        }
        gone
    }

    fn record(&mut self, txn: TxnId, committed: bool, now_ms: u64) {
        if self.decided_order.len() >= self.limits.max_decisions
            && let Some(&(_, oldest)) = self.decided_order.front()
            && !self.prepared.contains_key(&oldest)
        {
            self.decided_order.pop_front();
            self.decisions.remove(&oldest);
            self.pushed_out.push(oldest);
        }
        self.decisions.insert(txn, committed);
        self.decided_order.push_back((now_ms, txn));
    }

    /// Check the invariants (tests): every lock belongs to a prepared
    /// transaction that writes the key; the held bytes add up.
    pub fn check(&self) {
        for ((table, key), txn) in self.locks.iter() {
            let p = self
                .prepared
                .get(&txn)
                .expect("a lock's holder is prepared");
            assert!(
                p.items
                    .iter()
                    .any(|i| i.table == *table && &i.key == key && i.write != Write::None),
                "a lock's key is written by its holder"
            );
        }
        let bytes: usize = self.prepared.values().map(|p| p.bytes).sum();
        assert_eq!(bytes, self.held_bytes);
        assert!(self.decisions.len() <= self.decided_order.len());
    }
}

#[cfg(test)]
#[path = "participant_tests.rs"]
mod tests;
