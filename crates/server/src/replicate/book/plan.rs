//! One round's plan, made by walking the engine's log view under one
//! borrow: the appends every backup lacks, the frees whose round has come,
//! and their split into frames that each fit `MAX_BODY_BYTES`.

use std::collections::HashMap;
use std::rc::Rc;

use bytes::Bytes;
use insitu_engine::{Engine, SegmentView};
use insitu_protocol::{MAX_BACKUP_OPS, MAX_BODY_BYTES, Request, encoded_len};
use tokio::time::Instant;

use super::{APPEND_CHUNK_BYTES, BackupBatch, Book, OwnedOp, PendingFree, Plan, Replica, Seg};

/// Bytes of a frame body kept free for the `BackupWrite` envelope (variant,
/// cluster, master, op count: at most ~26 bytes) and rounding.
const ENVELOPE_SLACK_BYTES: usize = 1024;

impl Book {
    /// Walk the engine's view and plan one round: appends of every byte a
    /// backup lacks (at most `max_round_bytes` copied), frees whose round
    /// has come, segments gone from the view turned into frees for later.
    pub fn plan(&mut self, engine: &Engine, max_round_bytes: usize, now: Instant) -> Plan {
        self.walks += 1;
        let walk = self.walks;
        let mark = engine.log_changes();
        let mut batches: HashMap<Rc<str>, BackupBatch> = HashMap::new();
        let mut ops_of: HashMap<Rc<str>, Vec<OwnedOp>> = HashMap::new();
        // Frees first: they only name segments gone from the view, so their
        // order against the appends below does not matter.
        let owed = self.owed_segments();
        let (ready, later): (Vec<PendingFree>, Vec<PendingFree>) = std::mem::take(&mut self.frees)
            .into_iter()
            .partition(|f| self.sendable(f, &owed, now));
        self.frees = later;
        for f in ready {
            ops_of
                .entry(f.addr.clone())
                .or_default()
                .push(OwnedOp::Free {
                    log: f.log,
                    segment: f.segment,
                });
            batch_of(&mut batches, &f.addr).frees.push(f);
        }
        let mut acc = Acc {
            copied: 0,
            complete: true,
            batches: &mut batches,
            ops_of: &mut ops_of,
        };
        engine.for_each_segment(|v| self.plan_segment(v, walk, now, max_round_bytes, &mut acc));
        let complete = acc.complete;
        self.plan_digests(walk, &mut batches, &mut ops_of);
        // Segments the walk did not see were freed: their frees go out once
        // this round (carrying the appends made before them) succeeded.
        let gone: Vec<(u64, u64)> = self
            .segs
            .iter()
            .filter(|(_, s)| s.seen != walk)
            .map(|(k, _)| *k)
            .collect();
        for key in gone {
            let seg = self.segs.remove(&key).expect("listed above");
            for r in seg.replicas {
                self.frees.push(PendingFree {
                    addr: r.addr,
                    log: key.0,
                    segment: key.1,
                    after: walk,
                    max_tomb: seg.max_tomb,
                });
            }
        }
        let mut out: Vec<BackupBatch> = batches.into_values().collect();
        for b in &mut out {
            let ops = ops_of.remove(&b.addr).unwrap_or_default();
            b.frames = split_frames(ops);
        }
        out.retain(|b| !b.frames.is_empty());
        Plan {
            walk,
            mark,
            complete,
            batches: out,
        }
    }

    /// One segment of the walk: note it seen, give it R backups, plan the
    /// appends each backup lacks.
    fn plan_segment(
        &mut self,
        v: SegmentView<'_>,
        walk: u64,
        now: Instant,
        max_round_bytes: usize,
        acc: &mut Acc<'_>,
    ) {
        let key = (v.log, v.segment);
        // A sealed segment's replicas are closed only once the log has a
        // held digest on another carrier: a closed replica then proves a
        // newer digest than any it holds was made, which is how a recovery
        // tells that the newest digest is missing (see "Log digests").
        let may_close = v.sealed
            && self
                .logs
                .get(&v.log)
                .is_some_and(|d| d.acked && d.carrier != v.segment);
        let seg = self.segs.entry(key).or_insert_with(|| Seg {
            table: v.table,
            start_hash: v.start_hash,
            replicas: Vec::new(),
            seen: walk,
            max_tomb: 0,
            durable: false,
            sealed: v.sealed,
            len: 0,
        });
        seg.seen = walk;
        seg.max_tomb = v.max_tombstone_segment;
        seg.sealed = v.sealed;
        seg.len = v.bytes.len() as u64;
        if !self.fill(key, now) {
            acc.complete = false;
        }
        let (len, close) = (v.bytes.len() as u64, may_close);
        let lacking = |r: &Replica| r.held < len || (close && !r.closed);
        let seg = &self.segs[&key];
        let Some(from) = seg
            .replicas
            .iter()
            .filter(|r| lacking(r))
            .map(|r| r.held.min(len))
            .min()
        else {
            return;
        };
        if acc.copied >= max_round_bytes {
            acc.complete = false; // the rest waits for the next round
            return;
        }
        // One copy per segment, shared (sliced) by its backups.
        let copy = Bytes::copy_from_slice(&v.bytes[from as usize..]);
        acc.copied += copy.len();
        let tablet = (v.log, seg.table, seg.start_hash, v.segment);
        for r in seg.replicas.iter().filter(|r| lacking(r)) {
            let ops = acc.ops_of.entry(r.addr.clone()).or_default();
            push_appends(ops, tablet, &copy, from, r.held, close);
            batch_of(acc.batches, &r.addr)
                .expect
                .push((v.log, v.segment, len, close));
        }
    }
}

impl Book {
    /// Per log still present after the walk: a new digest when its durable
    /// segments or its carrier changed (or it has none yet), sent to each
    /// backup of its carrier that lacks it (after the carrier's appends in
    /// the same batch, so a replica being re-created holds its bytes
    /// first). A log without a segment left is forgotten.
    ///
    /// Why only durable segments are listed: a segment whose bytes no round
    /// completed may vanish with a crash of this server before any backup
    /// holds it, and listing it would make the recovery refuse for a loss of
    /// nothing acknowledged. Why the carrier is an open segment (the current
    /// one while it stays open, else the highest open one with bytes): a
    /// digest then never lands in a closed replica, and a sealed segment is
    /// closed only after a digest on another carrier is held, so a recovery
    /// that finds its newest digest in a closed replica knows a newer one
    /// was made. A log with no open segment with bytes gets no new digest.
    fn plan_digests(
        &mut self,
        walk: u64,
        batches: &mut HashMap<Rc<str>, BackupBatch>,
        ops_of: &mut HashMap<Rc<str>, Vec<OwnedOp>>,
    ) {
        // Per log seen: its durable segments and the segments that may carry.
        let mut seen: HashMap<u64, (Vec<u64>, Vec<u64>)> = HashMap::new();
        for (&(log, segment), seg) in self.segs.iter().filter(|(_, s)| s.seen == walk) {
            let (durable, open) = seen.entry(log).or_default();
            if seg.durable {
                durable.push(segment);
            }
            if seg.may_carry() {
                open.push(segment);
            }
        }
        self.logs.retain(|log, _| seen.contains_key(log));
        for (log, (mut ids, open)) in seen {
            ids.sort_unstable();
            let current = self.logs.get(&log);
            let carrier = match current {
                Some(d) if open.contains(&d.carrier) => d.carrier,
                _ => match open.iter().max() {
                    Some(&c) => c,
                    None => continue, // nothing can carry: the last digest stands
                },
            };
            let stale = current.is_none_or(|d| *d.listed != *ids || d.carrier != carrier);
            let d = self.logs.entry(log).or_default();
            if stale {
                d.seq += 1;
                d.carrier = carrier;
                d.listed = ids.into();
                d.acked = false;
            }
            let (seq, listed) = (d.seq, d.listed.clone());
            let seg = &self.segs[&(log, carrier)];
            for r in seg.replicas.iter().filter(|r| r.digest < seq) {
                let appended = batches
                    .get(&r.addr)
                    .is_some_and(|b| b.expect.iter().any(|e| (e.0, e.1) == (log, carrier)));
                if r.held == 0 && !appended {
                    continue; // its replica is not there yet
                }
                ops_of
                    .entry(r.addr.clone())
                    .or_default()
                    .push(OwnedOp::Digest {
                        log,
                        segment: carrier,
                        seq,
                        segments: listed.clone(),
                    });
                batch_of(batches, &r.addr).digests.push((log, carrier, seq));
            }
            self.check_digest_acked(log);
        }
    }
}

/// What `plan` gathers while walking the segments.
struct Acc<'a> {
    /// Segment bytes copied so far this round (bounded by `max_round_bytes`).
    copied: usize,
    /// Still true if every segment got R backups and all its lacking bytes.
    complete: bool,
    batches: &'a mut HashMap<Rc<str>, BackupBatch>,
    /// Ops per backup, in order.
    ops_of: &'a mut HashMap<Rc<str>, Vec<OwnedOp>>,
}

fn batch_of<'a>(
    batches: &'a mut HashMap<Rc<str>, BackupBatch>,
    addr: &Rc<str>,
) -> &'a mut BackupBatch {
    batches.entry(addr.clone()).or_insert_with(|| BackupBatch {
        addr: addr.clone(),
        frames: Vec::new(),
        expect: Vec::new(),
        frees: Vec::new(),
        digests: Vec::new(),
    })
}

/// Appends of `copy` (the segment's bytes from `from`) beyond what the
/// replica holds (`held`), in chunks; with `close`, the last one closes the
/// sealed segment (an empty append when only the close is missing).
fn push_appends(
    ops: &mut Vec<OwnedOp>,
    (log, table, start_hash, segment): (u64, u64, u64, u64),
    copy: &Bytes,
    from: u64,
    held: u64,
    close: bool,
) {
    let end = from + copy.len() as u64;
    let mut offset = held.clamp(from, end);
    loop {
        let take = ((end - offset) as usize).min(APPEND_CHUNK_BYTES);
        let start = (offset - from) as usize;
        let last = offset + take as u64 == end;
        ops.push(OwnedOp::Append {
            log,
            table,
            start_hash,
            segment,
            offset,
            bytes: copy.slice(start..start + take),
            close: close && last,
        });
        offset += take as u64;
        if last {
            break;
        }
    }
}

/// Split ops, in order, into frames whose `BackupWrite` bodies fit
/// `MAX_BODY_BYTES` and carry at most `MAX_BACKUP_OPS` ops each.
pub fn split_frames(ops: Vec<OwnedOp>) -> Vec<Vec<OwnedOp>> {
    let budget = MAX_BODY_BYTES - ENVELOPE_SLACK_BYTES;
    let mut frames: Vec<Vec<OwnedOp>> = Vec::new();
    let mut current: Vec<OwnedOp> = Vec::new();
    let mut used = 0usize;
    for op in ops {
        let size = encoded_len(&op.as_op());
        assert!(size <= budget, "an op is at most one chunk: {size} bytes");
        if !current.is_empty() && (used + size > budget || current.len() >= MAX_BACKUP_OPS) {
            frames.push(std::mem::take(&mut current));
            used = 0;
        }
        used += size;
        current.push(op);
    }
    if !current.is_empty() {
        frames.push(current);
    }
    frames
}

/// The request carrying one frame's ops.
pub fn request(cluster: u64, master: u64, frame: &[OwnedOp]) -> Request<'_> {
    Request::BackupWrite {
        cluster,
        master,
        ops: frame.iter().map(OwnedOp::as_op).collect(),
    }
}
