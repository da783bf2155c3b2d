//! The replicator's bookkeeping, free of I/O: which backups hold how much of
//! every segment, which frees are owed to whom, and how one round's ops are
//! planned from the engine's log view. Everything here is synchronous, so the
//! round's plan is made under one engine borrow and no borrow crosses an
//! `.await` (see `mod.rs` for the round itself; the planning is in
//! `book/plan.rs`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

use tokio::time::{Duration, Instant};

mod digests;
mod op;
mod plan;

pub use op::OwnedOp;
pub use plan::request;

/// Most segment bytes one `Append` op carries: a 2 MiB segment goes in two
/// ops, and any op fits a frame whatever the engine's segment size.
pub const APPEND_CHUNK_BYTES: usize = 1 << 20;

/// How long a backup that failed is avoided at first, and at most.
const SUSPECT_MIN: Duration = Duration::from_secs(1);
const SUSPECT_MAX: Duration = Duration::from_secs(30);

/// One backup's copy of one segment.
#[derive(Clone, Debug)]
pub struct Replica {
    /// The backup service's address (also the key of its connection).
    pub addr: Rc<str>,
    /// Bytes this backup acknowledged, from offset 0.
    pub held: u64,
    /// The backup acknowledged `close: true` (the sealed segment is complete).
    pub closed: bool,
    /// Number of the newest digest of the segment's log this backup
    /// acknowledged keeping with this replica (0: none).
    pub digest: u64,
}

/// What the replicator knows of one segment of this shard's logs.
#[derive(Debug)]
pub struct Seg {
    /// Tablet of the log: sent with every append so a recovery finds a
    /// tablet's segments without reading them.
    pub table: u64,
    pub start_hash: u64,
    /// Its backups (at most R); fewer while no backup could be found.
    pub replicas: Vec<Replica>,
    /// Walk number that last saw the segment: older means it was freed.
    pub seen: u64,
    /// The engine's `max_tombstone_segment` at the last walk (see `PendingFree`).
    pub max_tomb: u64,
    /// A round that fully succeeded carried its bytes (R backups held data
    /// of it): from then on the log's digests list it.
    pub durable: bool,
    /// The engine sealed it (at the last walk): its replicas may be closed.
    pub sealed: bool,
    /// Its length at the last walk.
    pub len: u64,
}

impl Seg {
    /// Whether it may carry its log's digest: open (never closed, so a
    /// digest never lands in a closed replica) and with bytes (so its
    /// replicas exist on their backups).
    pub fn may_carry(&self) -> bool {
        !self.sealed && self.len > 0
    }
}

/// The digests of one log (see "Log digests" in ARCHITECTURE.md).
#[derive(Debug, Default)]
pub struct LogDigests {
    /// Number of the newest digest made (0: none yet).
    pub seq: u64,
    /// The segments it lists, ascending: the log's durable segments when it
    /// was made.
    pub listed: Arc<[u64]>,
    /// Its carrier: an open segment of the log (the same one while it stays
    /// open), whose backups keep the digest.
    pub carrier: u64,
    /// Every backup of the carrier (R of them) acknowledged digest `seq`. A
    /// segment gone from the log is freed on its backups only then, and
    /// only if `listed` does not name it: a recovery trusts the newest
    /// digest it finds and refuses if a segment it lists is missing.
    pub acked: bool,
}

/// A `Free` owed to one backup.
#[derive(Clone, Debug)]
pub struct PendingFree {
    pub addr: Rc<str>,
    pub log: u64,
    pub segment: u64,
    /// Sendable once a round numbered `after` or later fully succeeded: the
    /// appends that preceded the free (a cleaner's survivors) are then held.
    pub after: u64,
    /// The segment's tombstones name segments up to this id: the free waits
    /// until no free of a segment of the same log with an id up to this is
    /// owed to any backup. The engine dropped those tombstones only after
    /// those segments were gone; backups must lose the old versions first
    /// too, whatever order frees of one walk reach different backups.
    pub max_tomb: u64,
}

/// What a round sends to one backup: ops in order, split into frames that
/// each fit `MAX_BODY_BYTES`.
#[derive(Debug)]
pub struct BackupBatch {
    pub addr: Rc<str>,
    pub frames: Vec<Vec<OwnedOp>>,
    /// Per segment appended to: (log, segment, end offset, close) to record
    /// once the backup answers `Done`.
    pub expect: Vec<(u64, u64, u64, bool)>,
    /// Frees carried, put back in the queue if the backup fails.
    pub frees: Vec<PendingFree>,
    /// Digests carried: (log, carrier segment, seq) to record on `Done`.
    pub digests: Vec<(u64, u64, u64)>,
}

/// One round's plan.
#[derive(Debug)]
pub struct Plan {
    /// Number of the walk (= round) that made it.
    pub walk: u64,
    /// `log_changes()` at the walk: durable once the round fully succeeds.
    pub mark: u64,
    /// Every segment had R backups and no byte was left for a later round,
    /// so success makes everything up to `mark` durable.
    pub complete: bool,
    pub batches: Vec<BackupBatch>,
}

/// A live backup other than this server's own.
#[derive(Clone, Debug)]
pub struct Backup {
    pub id: u64,
    pub addr: Rc<str>,
}

/// All of the replicator's state but its connections.
pub struct Book {
    /// Replicas per segment (R >= 1 here; R = 0 never builds a book).
    pub r: usize,
    /// This server's own backup service, the last resort ("" = none).
    pub own_backup: Option<Rc<str>>,
    /// Live backups of other servers, from the coordinator's list.
    pub live: Vec<Backup>,
    /// Servers declared dead (`ServerDown`): never chosen again even if a
    /// list fetched earlier still shows them up.
    pub dead: HashSet<u64>,
    /// Backups that failed recently: (avoid until, next pause). Chosen only
    /// when nothing else is left, and owed frees wait, until the instant;
    /// the pause doubles per failure (a silent backup would otherwise cost
    /// every round a call timeout) and is forgotten on success.
    pub suspect_until: HashMap<Rc<str>, (Instant, Duration)>,
    /// (log, segment) -> what its backups hold.
    pub segs: HashMap<(u64, u64), Seg>,
    /// log -> its digests; a log leaves when none of its segments is left.
    pub logs: HashMap<u64, LogDigests>,
    /// Frees not yet acknowledged by their backup.
    pub frees: Vec<PendingFree>,
    /// Number of the last walk (rounds are numbered by their walk).
    pub walks: u64,
    /// Number of the last round that fully succeeded.
    pub last_ok: u64,
    /// Bumped whenever a replica is dropped (failure, server down): a round
    /// that saw it change cannot vouch for every segment.
    pub replaced: u64,
    /// A replica was dropped since the last complete round: a round is
    /// needed even if the engine did not change.
    pub dirty: bool,
    /// Spreads replicas at random (production: a fresh seed; tests: a fixed one).
    pub rng: fastrand::Rng,
    /// The coordinator's server list arrived at least once: before it, an
    /// empty `live` means "not known yet", not "no other backups", so a
    /// segment waits for R instead of settling for the own backup.
    pub listed: bool,
}

impl Book {
    pub fn new(r: usize, own_backup: &str, rng: fastrand::Rng) -> Book {
        assert!(r >= 1, "a book is only kept when replicating");
        Book {
            r,
            own_backup: (!own_backup.is_empty()).then(|| Rc::from(own_backup)),
            live: Vec::new(),
            dead: HashSet::new(),
            suspect_until: HashMap::new(),
            segs: HashMap::new(),
            logs: HashMap::new(),
            frees: Vec::new(),
            walks: 0,
            last_ok: 0,
            replaced: 0,
            dirty: false,
            rng,
            listed: false,
        }
    }

    fn suspect(&self, addr: &str, now: Instant) -> bool {
        self.suspect_until.get(addr).is_some_and(|&(t, _)| t > now)
    }

    /// Add backups to `seg` until it has R (or nothing is left): live others
    /// not yet used by it, at random, preferring ones that did not fail
    /// recently; then this server's own backup; then recently failed ones.
    fn fill(&mut self, key: (u64, u64), now: Instant) -> bool {
        if !self.listed {
            // Which backups exist is not known yet: choosing the own backup
            // now would crowd out the others for this segment's life.
            return false;
        }
        let target = self.target_replicas();
        let Some(seg) = self.segs.get(&key) else {
            return false;
        };
        // A replica on this server's own backup is a last resort: a
        // recovery does not wait for a dead master's own disk, so it moves
        // to another backup as soon as one is free for the segment (it was
        // placed before the others were known, or while they failed).
        if let Some(own) = self.own_backup.clone()
            && seg.replicas.iter().any(|r| r.addr == own)
            && self.live.iter().filter(|b| b.addr != own).count() >= target
            && self.live.iter().any(|b| {
                b.addr != own
                    && !self.suspect(&b.addr, now)
                    && !seg.replicas.iter().any(|r| r.addr == b.addr)
            })
        {
            self.drop_replica(key, &own, true);
        }
        let Some(seg) = self.segs.get(&key) else {
            return false;
        };
        let mut need = target.saturating_sub(seg.replicas.len());
        if need == 0 {
            return true;
        }
        let used: Vec<Rc<str>> = seg.replicas.iter().map(|r| r.addr.clone()).collect();
        let free_of = |a: &Rc<str>| !used.iter().any(|u| u == a);
        let mut fresh: Vec<Rc<str>> = Vec::new();
        let mut failed: Vec<Rc<str>> = Vec::new();
        for b in &self.live {
            if free_of(&b.addr) && !fresh.contains(&b.addr) && !failed.contains(&b.addr) {
                if self.suspect(&b.addr, now) {
                    failed.push(b.addr.clone());
                } else {
                    fresh.push(b.addr.clone());
                }
            }
        }
        let own = self.own_backup.clone().filter(|a| free_of(a));
        let mut chosen = Vec::with_capacity(need);
        while need > 0 && !fresh.is_empty() {
            chosen.push(fresh.swap_remove(self.rng.usize(..fresh.len())));
            need -= 1;
        }
        if let Some(own) = own.filter(|_| need > 0) {
            chosen.push(own);
            need -= 1;
        }
        while need > 0 && !failed.is_empty() {
            chosen.push(failed.swap_remove(self.rng.usize(..failed.len())));
            need -= 1;
        }
        for addr in &chosen {
            // A free still owed to this backup for this segment would delete
            // the replica about to be resent from 0: the resend replaces it.
            self.frees
                .retain(|f| !(&f.addr == addr && f.log == key.0 && f.segment == key.1));
        }
        let seg = self.segs.get_mut(&key).expect("looked up above");
        seg.replicas.extend(chosen.into_iter().map(|addr| Replica {
            addr,
            held: 0,
            closed: false,
            digest: 0,
        }));
        debug_assert!(seg.replicas.len() <= self.r);
        need == 0
    }

    /// Replicas a segment gets now: R, or every distinct backup there is
    /// (live others plus this server's own) when there are fewer — at least
    /// one while R > 0. Why not wait for R: a coordinator's R is cluster-wide
    /// (default 2) while servers join one by one; a cluster of one server
    /// would never acknowledge a write. Segments placed while backups were
    /// few are topped up (from offset 0) as soon as more are live, since
    /// every walk re-fills every segment.
    pub fn target_replicas(&self) -> usize {
        if self.r == 0 || !self.listed {
            return self.r;
        }
        let own = self
            .own_backup
            .as_ref()
            .is_some_and(|o| !self.live.iter().any(|b| &b.addr == o));
        self.r.min(self.live.len() + own as usize).max(1)
    }

    /// A backup answered `Done` to every frame of its batch.
    pub fn acknowledged(&mut self, batch: &BackupBatch) {
        self.suspect_until.remove(&batch.addr);
        for &(log, segment, end, close) in &batch.expect {
            let Some(seg) = self.segs.get_mut(&(log, segment)) else {
                continue; // freed meanwhile
            };
            if let Some(r) = seg.replicas.iter_mut().find(|r| r.addr == batch.addr) {
                r.held = r.held.max(end);
                r.closed |= close;
            }
        }
        for &(log, segment, seq) in &batch.digests {
            let Some(seg) = self.segs.get_mut(&(log, segment)) else {
                continue;
            };
            if let Some(r) = seg.replicas.iter_mut().find(|r| r.addr == batch.addr) {
                r.digest = r.digest.max(seq);
            }
            self.check_digest_acked(log);
        }
    }

    /// A round fully succeeded: every segment it saw with data is held by
    /// R backups, so digests list it from now on. Returns whether the
    /// digests are settled (`digests_settled`): only then may the walk's
    /// mark be published; if not, another round is due even if the engine
    /// stays idle.
    pub fn round_complete(&mut self, walk: u64) -> bool {
        self.last_ok = walk;
        self.dirty = false;
        for seg in self.segs.values_mut() {
            if seg.seen == walk
                && !seg.replicas.is_empty()
                && seg.replicas.iter().all(|r| r.held > 0)
            {
                seg.durable = true;
            }
        }
        let settled = self.digests_settled();
        self.dirty |= !settled;
        settled
    }

    /// A backup failed (error, timeout, NoSpace): every segment its batch
    /// touched (appends or a digest) gets another backup and is resent from
    /// offset 0; its frees are owed again; it is avoided for a while (longer
    /// after each failure).
    pub fn failed(&mut self, batch: &BackupBatch, now: Instant) {
        if !self.is_live_addr(&batch.addr) {
            // Its server was declared dead meanwhile: `forget_addr` already
            // dropped its replicas and frees; owing it more would block frees.
            return;
        }
        let pause = match self.suspect_until.get(&batch.addr) {
            Some(&(_, pause)) => (pause * 2).min(SUSPECT_MAX),
            None => SUSPECT_MIN,
        };
        self.suspect_until
            .insert(batch.addr.clone(), (now + pause, pause));
        for f in &batch.frees {
            self.frees.push(PendingFree {
                after: 0,
                ..f.clone()
            });
        }
        for &(log, segment, _, _) in &batch.expect {
            self.drop_replica((log, segment), &batch.addr, true);
        }
        // A carrier whose digest the backup refused moves too, even when the
        // batch carried none of its bytes: a backup that keeps refusing the
        // digest (its disk full) would otherwise hold the log's frees, and
        // with them the durable mark, for ever.
        for &(log, segment, _) in &batch.digests {
            self.drop_replica((log, segment), &batch.addr, true);
        }
    }

    /// Forget the replica of `key` on `addr`. `owe_free`: the backup may
    /// still hold (part of) it, so it is told to free it once the segment's
    /// new replica is held (a stale copy must not outlive the segment).
    fn drop_replica(&mut self, key: (u64, u64), addr: &Rc<str>, owe_free: bool) {
        let Some(seg) = self.segs.get_mut(&key) else {
            return;
        };
        let before = seg.replicas.len();
        seg.replicas.retain(|r| &r.addr != addr);
        if seg.replicas.len() == before {
            return;
        }
        self.replaced += 1;
        self.dirty = true;
        if owe_free {
            let max_tomb = seg.max_tomb;
            self.frees.push(PendingFree {
                addr: addr.clone(),
                log: key.0,
                segment: key.1,
                after: self.walks + 1,
                max_tomb,
            });
        }
    }

    /// A server is gone: stop using its backup, re-replicate what it held.
    /// Returns its address if it was known.
    pub fn server_down(&mut self, id: u64) -> Option<Rc<str>> {
        self.dead.insert(id);
        let pos = self.live.iter().position(|b| b.id == id)?;
        let addr = self.live.swap_remove(pos).addr;
        self.forget_addr(&addr);
        Some(addr)
    }

    /// Drop every replica and owed free on `addr` (its server is dead).
    fn forget_addr(&mut self, addr: &Rc<str>) {
        let keys: Vec<(u64, u64)> = self
            .segs
            .iter()
            .filter(|(_, s)| s.replicas.iter().any(|r| &r.addr == addr))
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            self.drop_replica(key, addr, false);
        }
        self.frees.retain(|f| &f.addr != addr);
        self.suspect_until.remove(addr);
    }

    /// Take a fresh server list: live others with a backup service. A
    /// backup that left the list (dead, removed) is forgotten like `server_down`.
    pub fn set_live(&mut self, own_id: u64, servers: &[insitu_protocol::ServerInfo]) {
        self.listed = true;
        let mut live: Vec<Backup> = Vec::new();
        for s in servers {
            let up = s.state == insitu_protocol::ServerState::Up;
            if s.id == own_id || !up || s.backup_addr.is_empty() || self.dead.contains(&s.id) {
                continue;
            }
            // Keep the same Rc for an address already known.
            let addr = self
                .live
                .iter()
                .find(|b| *b.addr == *s.backup_addr)
                .map(|b| b.addr.clone())
                .unwrap_or_else(|| Rc::from(s.backup_addr.as_str()));
            live.push(Backup { id: s.id, addr });
        }
        let gone: Vec<Rc<str>> = self
            .live
            .iter()
            .filter(|b| !live.iter().any(|l| l.addr == b.addr))
            .map(|b| b.addr.clone())
            .filter(|a| self.own_backup.as_ref() != Some(a))
            .collect();
        self.live = live;
        for addr in gone {
            self.forget_addr(&addr);
        }
        // Segments placed while backups were fewer than R are topped up by
        // the next round, even if the engine is idle; replicas on the own
        // backup move to another (see `fill`).
        let target = self.target_replicas();
        let own = self.own_backup.clone();
        let others = self.live.iter().filter(|b| Some(&b.addr) != own.as_ref());
        let movable = others.count() >= target;
        let on_own = |s: &Seg| s.replicas.iter().any(|r| Some(&r.addr) == own.as_ref());
        if self
            .segs
            .values()
            .any(|s| s.replicas.len() < target || (movable && on_own(s)))
        {
            self.dirty = true;
        }
    }

    /// Whether a round has anything to do besides the engine's changes:
    /// a replica to replace, or a free that may go now.
    pub fn has_work(&self, now: Instant) -> bool {
        if self.dirty {
            return true;
        }
        let owed = self.owed_segments();
        self.frees.iter().any(|f| self.sendable(f, &owed, now))
    }

    /// Per log, the segments some backup is still owed a free of.
    fn owed_segments(&self) -> HashMap<u64, BTreeSet<u64>> {
        let mut owed: HashMap<u64, BTreeSet<u64>> = HashMap::new();
        for f in &self.frees {
            owed.entry(f.log).or_default().insert(f.segment);
        }
        owed
    }

    /// Whether a free may go in the round being planned: the round that
    /// carried its survivors succeeded, its backup is not avoided, and no
    /// older segment its tombstones may cover still awaits its own free.
    fn sendable(&self, f: &PendingFree, owed: &HashMap<u64, BTreeSet<u64>>, now: Instant) -> bool {
        let covered_pending = owed
            .get(&f.log)
            .is_some_and(|s| s.range(..=f.max_tomb).any(|&seg| seg != f.segment));
        f.after <= self.last_ok
            && !self.suspect(&f.addr, now)
            && !covered_pending
            && self.digest_allows_free(f.log, f.segment)
    }

    /// Whether `addr` is a backup in use: this server's own or a live one.
    pub fn is_live_addr(&self, addr: &str) -> bool {
        self.own_backup.as_deref() == Some(addr) || self.live.iter().any(|b| &*b.addr == addr)
    }
}

#[cfg(test)]
#[path = "book_tests.rs"]
mod tests;
