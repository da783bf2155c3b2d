//! A checker of recorded transaction histories against Adya's isolation
//! anomalies (Adya, "Weak Consistency", MIT 1999), for read-modify-write
//! register workloads: every value is written once and names its writer,
//! and a transaction that writes a key has read it first in the same
//! transaction.
//!
//! From such a history the direct serialization graph (DSG) follows:
//! - *wr* (read dependency) T1 -> T2: T2 read the value T1 wrote;
//! - *ww* (write dependency) T1 -> T2: T2 overwrote T1's value (T2 read it,
//!   then wrote the key: read-modify-write makes the version order visible);
//! - *rw* (anti-dependency) T1 -> T2: T1 read a value that T2 overwrote.
//!
//! Reported: G0 (a cycle of ww edges: dirty writes), G1a (a read of an
//! aborted transaction's write), G1b does not arise (each transaction
//! writes a key at most once, so no intermediate value exists), G1c (a cycle
//! of ww/wr edges), lost updates (two committed transactions overwrote the
//! same value), G-single (a cycle with exactly one rw edge: read skew; what
//! snapshot isolation forbids) and G2 (cycles with two or more rw edges: write
//! skew, which snapshot isolation allows but serializability does not;
//! reported separately, not hidden). Cycles are reported per strongly
//! connected component of the graph restricted to the edge kinds of each
//! class; a component counts as G-single when at most one of its edges is
//! an anti-dependency alone.
//!
//! Histories recorded across crashes hold transactions whose client never
//! learned the outcome ([`Outcome::Unknown`]). One counts as committed when
//! a counted transaction read its write (a value only a commit makes
//! visible), else it is left out; so a recorder should end with a read of
//! every key, which sees the last commit on each.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Who wrote a value: a transaction id, or None for the initial value.
pub type Writer = Option<u64>;

/// How a recorded transaction ended, as its client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The commit was acknowledged.
    Committed,
    /// Certainly not applied (refused, or failed before its commit was
    /// sent): its writes must never be read.
    Aborted,
    /// The client lost touch during the commit (a crash, a timeout): it may
    /// have committed or not. It counts as committed exactly when a
    /// transaction that counts read one of its writes; one never seen is
    /// left out (a history should end with a read of every key, so that a
    /// commit that happened is seen).
    Unknown,
}

/// One transaction of a recorded history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub id: u64,
    pub outcome: Outcome,
    /// Keys read and the writer of the value read.
    pub reads: Vec<(Vec<u8>, Writer)>,
    /// Keys written (each once).
    pub writes: Vec<Vec<u8>>,
}

/// The anomalies found (empty vectors: none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub g0: Vec<Vec<u64>>,
    pub g1a: Vec<(u64, u64)>,
    pub g1c: Vec<Vec<u64>>,
    /// (the value's writer, the two transactions that both overwrote it)
    pub lost_updates: Vec<(Writer, u64, u64)>,
    pub g_single: Vec<Vec<u64>>,
    pub g2: Vec<Vec<u64>>,
}

impl Verdict {
    /// Anomalies snapshot isolation forbids (everything but G2).
    pub fn si_anomalies(&self) -> usize {
        self.g0.len()
            + self.g1a.len()
            + self.g1c.len()
            + self.lost_updates.len()
            + self.g_single.len()
    }
    /// Anomalies serializability forbids (all of them).
    pub fn serializability_anomalies(&self) -> usize {
        self.si_anomalies() + self.g2.len()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Edge {
    Ww,
    Wr,
    Rw,
}

/// A bank account's stored value for a recorded history: the balance and
/// the transaction that wrote it (0: the initial value), so every read
/// records whose write it saw.
pub fn encode_balance(balance: i64, writer: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&balance.to_le_bytes());
    v[8..].copy_from_slice(&writer.to_le_bytes());
    v
}

/// (balance, writer) of a value `encode_balance` made; a missing or short
/// one reads as (0, initial), which shows up as a violated total.
pub fn decode_balance(v: Option<&[u8]>) -> (i64, Writer) {
    let Some(v) = v.filter(|v| v.len() >= 16) else {
        return (0, None);
    };
    let balance = i64::from_le_bytes(v[..8].try_into().unwrap_or([0; 8]));
    let writer = u64::from_le_bytes(v[8..16].try_into().unwrap_or([0; 8]));
    (balance, (writer != 0).then_some(writer))
}

/// Check a history (see the module comment for what it must hold).
pub fn check(history: &[Recorded]) -> Verdict {
    let mut v = Verdict::default();
    let committed = counted(history);
    // (key, writer of the value read) -> committed transactions that read it,
    // and those of them that then overwrote it.
    let mut readers: BTreeMap<(Vec<u8>, Writer), Vec<u64>> = BTreeMap::new();
    let mut overwriters: BTreeMap<(Vec<u8>, Writer), Vec<u64>> = BTreeMap::new();
    // In history order (not the map's), so the verdict is deterministic.
    for t in history.iter().filter(|t| committed.contains_key(&t.id)) {
        for (key, writer) in &t.reads {
            if let Some(w) = writer
                && !committed.contains_key(w)
                && *w != t.id
            {
                // A read of a value whose writer did not commit (or is not
                // in the history at all: the same, nothing committed it).
                v.g1a.push((t.id, *w));
                continue;
            }
            readers
                .entry((key.clone(), *writer))
                .or_default()
                .push(t.id);
            if t.writes.contains(key) {
                overwriters
                    .entry((key.clone(), *writer))
                    .or_default()
                    .push(t.id);
            }
        }
    }
    let mut edges: BTreeMap<(u64, u64), BTreeSet<Edge>> = BTreeMap::new();
    let mut add = |a: u64, b: u64, e: Edge| {
        if a != b {
            edges.entry((a, b)).or_default().insert(e);
        }
    };
    for ((key, writer), over) in &overwriters {
        if over.len() > 1 {
            v.lost_updates.push((*writer, over[0], over[1]));
        }
        for &t2 in over {
            if let Some(w) = writer {
                add(*w, t2, Edge::Ww);
            }
            for &r in readers.get(&(key.clone(), *writer)).into_iter().flatten() {
                add(r, t2, Edge::Rw);
            }
        }
    }
    for ((_, writer), rs) in &readers {
        if let Some(w) = writer {
            for &r in rs {
                add(*w, r, Edge::Wr);
            }
        }
    }
    // Cycles by edge class: one per strongly connected component found in
    // the subgraph of the allowed edges (enough to report and count).
    let only = |allowed: &[Edge]| -> Vec<(u64, u64)> {
        edges
            .iter()
            .filter(|(_, es)| es.iter().any(|e| allowed.contains(e)))
            .map(|(&k, _)| k)
            .collect()
    };
    v.g0 = cycles(&only(&[Edge::Ww]));
    let g1 = cycles(&only(&[Edge::Ww, Edge::Wr]));
    v.g1c = g1.into_iter().filter(|c| !v.g0.contains(c)).collect();
    // Cycles needing anti-dependencies: count the rw edges inside each component.
    for comp in cycles(&only(&[Edge::Ww, Edge::Wr, Edge::Rw])) {
        if v.g0.contains(&comp) || v.g1c.contains(&comp) {
            continue;
        }
        let inside: BTreeSet<u64> = comp.iter().copied().collect();
        let rw_only = edges
            .iter()
            .filter(|((a, b), es)| {
                inside.contains(a) && inside.contains(b) && es.len() == 1 && es.contains(&Edge::Rw)
            })
            .count();
        if rw_only <= 1 {
            v.g_single.push(comp);
        } else {
            v.g2.push(comp);
        }
    }
    v
}

/// The transactions that count as committed: those acknowledged, and those
/// of unknown outcome whose writes a counted transaction read (to a fixed
/// point: such a reader may itself be of unknown outcome).
fn counted(history: &[Recorded]) -> HashMap<u64, &Recorded> {
    let mut counted: HashMap<u64, &Recorded> = history
        .iter()
        .filter(|t| t.outcome == Outcome::Committed)
        .map(|t| (t.id, t))
        .collect();
    let unknown: HashMap<u64, &Recorded> = history
        .iter()
        .filter(|t| t.outcome == Outcome::Unknown)
        .map(|t| (t.id, t))
        .collect();
    let mut frontier: Vec<&Recorded> = counted.values().copied().collect();
    while let Some(t) = frontier.pop() {
        for (_, writer) in &t.reads {
            if let Some(w) = writer
                && let Some(&u) = unknown.get(w)
                && !counted.contains_key(w)
            {
                counted.insert(*w, u);
                frontier.push(u);
            }
        }
    }
    counted
}

/// The strongly connected components with more than one node (each holds a
/// cycle), sorted, by Tarjan's algorithm (iterative: histories can be long).
fn cycles(edges: &[(u64, u64)]) -> Vec<Vec<u64>> {
    let mut adj: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(a, b) in edges {
        adj.entry(a).or_default().push(b);
        adj.entry(b).or_default();
    }
    let mut index: HashMap<u64, usize> = HashMap::new();
    let mut low: HashMap<u64, usize> = HashMap::new();
    let mut on_stack: BTreeSet<u64> = BTreeSet::new();
    let mut stack: Vec<u64> = Vec::new();
    let mut out = Vec::new();
    let mut next = 0usize;
    for &root in adj.keys() {
        if index.contains_key(&root) {
            continue;
        }
        // (node, position in its adjacency list)
        let mut work: Vec<(u64, usize)> = vec![(root, 0)];
        while let Some(&mut (node, ref mut pos)) = work.last_mut() {
            if *pos == 0 && !index.contains_key(&node) {
                index.insert(node, next);
                low.insert(node, next);
                next += 1;
                stack.push(node);
                on_stack.insert(node);
            }
            let succ = &adj[&node];
            if *pos < succ.len() {
                let s = succ[*pos];
                *pos += 1;
                if !index.contains_key(&s) {
                    work.push((s, 0));
                } else if on_stack.contains(&s) {
                    let l = low[&node].min(index[&s]);
                    low.insert(node, l);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                let l = low[&parent].min(low[&node]);
                low.insert(parent, l);
            }
            if low[&node] == index[&node] {
                let mut comp = Vec::new();
                while let Some(x) = stack.pop() {
                    on_stack.remove(&x);
                    comp.push(x);
                    if x == node {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort_unstable();
                    out.push(comp);
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
#[path = "checker_tests.rs"]
mod tests;
