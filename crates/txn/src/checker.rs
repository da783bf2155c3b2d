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

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Who wrote a value: a transaction id, or None for the initial value.
pub type Writer = Option<u64>;

/// One transaction of a recorded history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub id: u64,
    /// Whether the client saw it commit (an aborted or unknown one does not count
    /// as committed; its writes must never be read).
    pub committed: bool,
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

/// Check a history (see the module comment for what it must hold).
pub fn check(history: &[Recorded]) -> Verdict {
    let mut v = Verdict::default();
    let committed: HashMap<u64, &Recorded> = history
        .iter()
        .filter(|t| t.committed)
        .map(|t| (t.id, t))
        .collect();
    // (key, writer of the value read) -> committed transactions that read it,
    // and those of them that then overwrote it.
    let mut readers: BTreeMap<(Vec<u8>, Writer), Vec<u64>> = BTreeMap::new();
    let mut overwriters: BTreeMap<(Vec<u8>, Writer), Vec<u64>> = BTreeMap::new();
    // In history order (not the map's), so the verdict is deterministic.
    for t in history.iter().filter(|t| t.committed) {
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
