//! The model of the store and the runner of `model.rs`'s proptests: the
//! operations and their strategy, what the store accepted and what a sync
//! made durable per replica and per digest, and `run`, which applies each
//! operation to the store and the model and checks them after every step
//! (after a crash: prefixes of what was accepted, every synced byte and
//! digest kept).
//!
//! Apart from `model.rs` because it is the machinery the property tests
//! share; `model.rs` keeps the fixtures, the `proptest!` block (its saved
//! regressions are found by that file's name) and the single scenarios.

use std::collections::BTreeMap;

use insitu_backup::io::sim::SimIo;
use insitu_backup::store::Flush;
use insitu_backup::{AppendMode, BackupError, BackupStore, ReplicaId, SyncJob, SyncMode};
use proptest::prelude::*;

use crate::{open_sim, rid, tablet};

#[derive(Clone, Debug)]
pub(crate) enum Op {
    Append {
        replica: u8,
        len: usize,
        close: bool,
        fill: u8,
        /// `AppendMode::Synced` (0); `Buffered` (1) or `Now` (2), both
        /// durable only after a flush, in either sync mode.
        way: u8,
    },
    /// Resend bytes the store already holds, from `back` bytes before its end.
    Resend {
        replica: u8,
        back: usize,
    },
    Flush,
    /// Start a flush whose fsyncs run later (`begin_flush`), as the server's
    /// timer flush does while the store goes on taking appends.
    BeginFlush,
    /// Run the begun flush's fsyncs and finish it.
    FinishFlush,
    Crash {
        seed: u64,
    },
    Free {
        replica: u8,
    },
    DiskFills {
        free: u64,
    },
    /// A digest of the replica's log carried by the replica, listing it.
    Digest {
        replica: u8,
    },
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..5, 0usize..700, prop::bool::weighted(0.1), any::<u8>(), 0u8..3)
            .prop_map(|(replica, len, close, fill, way)| Op::Append {
                replica, len, close, fill, way,
            }),
        1 => (0u8..5, 0usize..64).prop_map(|(replica, back)| Op::Resend { replica, back }),
        2 => Just(Op::Flush),
        1 => Just(Op::BeginFlush),
        1 => Just(Op::FinishFlush),
        2 => any::<u64>().prop_map(|seed| Op::Crash { seed }),
        1 => (0u8..5).prop_map(|replica| Op::Free { replica }),
        1 => (0u64..3000).prop_map(|free| Op::DiskFills { free }),
        2 => (0u8..5).prop_map(|replica| Op::Digest { replica }),
    ]
}

#[derive(Clone, Debug, Default)]
struct Model {
    /// Every byte the store accepted.
    data: Vec<u8>,
    closed: bool,
    /// How many of `data` were certainly durable (and whether `closed` was).
    durable: usize,
    durable_closed: bool,
}

impl Model {
    /// A sync covered the replica: all it accepted, and its close, is durable.
    fn synced(&mut self) {
        self.durable = self.data.len();
        self.durable_closed = self.closed;
    }
}

/// A digest the store accepted.
#[derive(Clone, Debug)]
struct Dig {
    carrier: ReplicaId,
    seq: u64,
    /// Certainly on disk (a sync covered it).
    durable: bool,
    /// Its record may have been lost in a crash: the store, reopened, listed
    /// a newer digest of the log, so it cannot say whether this older one
    /// is on disk, and no later sync can bring it back. Such a digest never
    /// becomes durable; it may still be listed again (its carrier's file
    /// held it) once the newer one's carrier is freed.
    maybe_lost: bool,
}

/// A sync covered `g`'s carrier: its record is on disk unless a crash lost it.
fn synced(g: &mut Dig) {
    g.durable |= !g.maybe_lost;
}

/// A sync covered replica `id` (whose model is `m`): its bytes, its close and
/// the digests it carries.
fn sync_replica(m: &mut Model, digests: &mut [Dig], id: ReplicaId) {
    m.synced();
    digests
        .iter_mut()
        .filter(|g| g.carrier == id)
        .for_each(synced);
}

/// A flush begun and not finished: the store's half, its fsyncs, and what
/// the model held when it began (what it makes durable).
struct InFlight {
    flush: Flush,
    job: Option<SyncJob>,
    /// Per replica held then: its length and whether it was closed.
    held: BTreeMap<ReplicaId, (usize, bool)>,
    /// The digests accepted by then.
    digests: Vec<u64>,
}

/// The store no longer holds replica `id` (freed, or dropped after an I/O
/// error): the model forgets it and the digests it carried, and a flush in
/// flight no longer speaks for it (the id may be created anew).
fn forget(
    model: &mut BTreeMap<ReplicaId, Model>,
    digests: &mut Vec<Dig>,
    in_flight: &mut Option<InFlight>,
    id: ReplicaId,
) {
    model.remove(&id);
    digests.retain(|g| g.carrier != id);
    if let Some(f) = in_flight {
        f.held.remove(&id);
    }
}

/// After a crash: per log, the store lists a digest it accepted whose
/// carrier it holds, at least as new as every durable one; then the model
/// keeps what may still be on disk.
fn check_digests(store: &BackupStore<SimIo>, digests: &mut Vec<Dig>) {
    let held: Vec<ReplicaId> = store.list(None).iter().map(|r| r.id).collect();
    digests.retain(|g| held.contains(&g.carrier));
    let mut listed: BTreeMap<(u64, u64), (ReplicaId, insitu_backup::Digest)> = BTreeMap::new();
    for master in [1, 2] {
        for (id, d) in store.digests(master) {
            assert_eq!(id.master, master);
            assert!(
                listed.insert((master, id.log), (id, d)).is_none(),
                "two digests of one log"
            );
        }
    }
    for (id, d) in listed.values() {
        let g = digests
            .iter()
            .find(|g| g.seq == d.seq)
            .unwrap_or_else(|| panic!("digest {} never sent", d.seq));
        assert_eq!(g.carrier, *id, "listed with its carrier");
        assert_eq!(d.segments, vec![g.carrier.segment]);
    }
    for g in digests.iter().filter(|g| g.durable) {
        let d = listed
            .get(&(g.carrier.master, g.carrier.log))
            .map(|(_, d)| d);
        assert!(
            d.is_some_and(|d| d.seq >= g.seq),
            "durable digest {} of {:?} lost: {d:?}",
            g.seq,
            g.carrier
        );
    }
    // Newer ones were lost; older ones may be on disk or not.
    digests.retain(|g| {
        listed
            .get(&(g.carrier.master, g.carrier.log))
            .is_some_and(|(_, d)| g.seq <= d.seq)
    });
    for g in digests.iter_mut() {
        g.durable = listed
            .get(&(g.carrier.master, g.carrier.log))
            .is_some_and(|(_, d)| d.seq == g.seq);
        g.maybe_lost |= !g.durable;
    }
}

pub(crate) fn run(ops: Vec<Op>, sync: SyncMode) {
    let budget = 64 * 1024;
    let (mut store, _) = open_sim(sync, budget, SimIo::default());
    let mut model: BTreeMap<ReplicaId, Model> = BTreeMap::new();
    let mut digests: Vec<Dig> = Vec::new();
    let mut next_seq = 0u64;
    let mut in_flight: Option<InFlight> = None;
    for op in ops {
        match op {
            Op::Append {
                replica,
                len,
                close,
                fill,
                way,
            } => {
                let id = rid(replica);
                let m = model.entry(id).or_default();
                let bytes: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                let offset = m.data.len() as u64;
                let mode = match way {
                    0 => AppendMode::Synced,
                    1 => AppendMode::Buffered,
                    _ => AppendMode::Now,
                };
                let r = store.append(id, tablet(id), offset, &bytes, close, mode);
                match r {
                    Ok(()) if m.closed => assert!(bytes.is_empty(), "a closed replica took data"),
                    Ok(()) => {
                        m.data.extend_from_slice(&bytes);
                        m.closed |= close;
                        if sync == SyncMode::Always && mode == AppendMode::Synced {
                            sync_replica(m, &mut digests, id);
                        }
                    }
                    Err(BackupError::Closed(_)) => assert!(m.closed),
                    Err(BackupError::DiskFull { .. }) => {
                        if m.data.is_empty()
                            && !m.closed
                            && store.list(None).iter().all(|r| r.id != id)
                        {
                            model.remove(&id);
                        }
                    }
                    // The store dropped this replica (its state on disk is unknown).
                    Err(BackupError::Io { .. }) => {
                        forget(&mut model, &mut digests, &mut in_flight, id)
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            Op::Resend { replica, back } => {
                let id = rid(replica);
                let Some(m) = model.get(&id) else { continue };
                let from = m.data.len().saturating_sub(back);
                let r = store.append(
                    id,
                    tablet(id),
                    from as u64,
                    &m.data[from..],
                    false,
                    AppendMode::Synced,
                );
                match r {
                    Ok(()) => {
                        if sync == SyncMode::Always {
                            // The sync covers bytes an earlier buffered append took.
                            let m = model.get_mut(&id).expect("checked above");
                            sync_replica(m, &mut digests, id);
                        }
                    }
                    // Writing out what earlier buffered appends took failed:
                    // the store dropped the replica.
                    Err(BackupError::Io { .. }) => {
                        forget(&mut model, &mut digests, &mut in_flight, id)
                    }
                    Err(e) => panic!("resend of held bytes refused: {e}"),
                }
            }
            Op::Flush => match store.flush() {
                Ok(()) => {
                    model.values_mut().for_each(Model::synced);
                    digests.iter_mut().for_each(synced);
                }
                Err(_) => {
                    // Replicas whose write failed were dropped; the rest synced.
                    let held: Vec<ReplicaId> = store.list(None).iter().map(|r| r.id).collect();
                    model.retain(|id, _| held.contains(id));
                    digests.retain(|g| held.contains(&g.carrier));
                    if let Some(f) = &mut in_flight {
                        f.held.retain(|id, _| held.contains(id));
                    }
                    digests.iter_mut().for_each(synced);
                    model.values_mut().for_each(Model::synced);
                }
            },
            Op::BeginFlush => {
                if in_flight.is_some() {
                    continue; // the server runs one at a time
                }
                let (mut flush, failed) = store.begin_flush();
                for (id, _) in failed {
                    forget(&mut model, &mut digests, &mut in_flight, id);
                }
                let job = flush.take_job();
                in_flight = Some(InFlight {
                    flush,
                    job,
                    held: model
                        .iter()
                        .map(|(id, m)| (*id, (m.data.len(), m.closed)))
                        .collect(),
                    digests: digests.iter().map(|g| g.seq).collect(),
                });
            }
            Op::FinishFlush => {
                let Some(f) = in_flight.take() else { continue };
                let done = f.job.map(SyncJob::run);
                for (id, _) in store.finish_flush(f.flush, done) {
                    forget(&mut model, &mut digests, &mut in_flight, id);
                }
                // What every replica still held had when the flush began is
                // durable; what it took since is not (the next flush's).
                for (id, (len, closed)) in f.held {
                    if let Some(m) = model.get_mut(&id) {
                        m.durable = m.durable.max(len);
                        m.durable_closed |= closed;
                    }
                }
                digests
                    .iter_mut()
                    .filter(|g| f.digests.contains(&g.seq))
                    .for_each(synced);
            }
            Op::Crash { seed } => {
                // The begun flush's fsyncs never ran.
                in_flight = None;
                let mut io = store.into_io();
                // The crash's own choices; proptest supplies the seed so it shrinks.
                let mut rng = insitu_testkit::rng(seed);
                io.crash(|n| rng.u64(0..n));
                io.free_bytes = None;
                store = open_sim(sync, budget, io).0;
                let held: BTreeMap<ReplicaId, (u64, bool)> = store
                    .list(None)
                    .iter()
                    .map(|r| (r.id, (r.data_bytes, r.closed)))
                    .collect();
                for (id, m) in &model {
                    if m.durable > 0 || m.durable_closed {
                        assert!(held.contains_key(id), "{id:?} lost after a sync");
                    }
                }
                let mut next = BTreeMap::new();
                for (id, (len, closed)) in held {
                    let m = model.get(&id).cloned().unwrap_or_default();
                    let (data, read_closed) = store.read(id).expect("read after reopen");
                    assert_eq!(data.len() as u64, len);
                    assert_eq!(read_closed, closed);
                    let info = store.list(None).into_iter().find(|r| r.id == id);
                    assert_eq!(info.map(|r| r.tablet), Some(tablet(id)), "tablet lost");
                    assert!(m.data.starts_with(&data), "{id:?}: bytes never sent");
                    assert!(data.len() >= m.durable, "{id:?}: synced bytes lost");
                    assert!(closed || !m.durable_closed, "{id:?}: synced close lost");
                    assert!(!closed || m.closed, "{id:?}: closed without a close");
                    // The master resends from what survived.
                    next.insert(
                        id,
                        Model {
                            durable: data.len(),
                            durable_closed: closed,
                            data,
                            closed,
                        },
                    );
                }
                model = next;
                check_digests(&store, &mut digests);
            }
            Op::Free { replica } => {
                store.free(rid(replica));
                forget(&mut model, &mut digests, &mut in_flight, rid(replica));
            }
            Op::Digest { replica } => {
                let id = rid(replica);
                next_seq += 1;
                let digest = insitu_backup::Digest {
                    seq: next_seq,
                    segments: vec![id.segment],
                };
                let held = store.list(None).iter().any(|r| r.id == id);
                match store.digest(id, digest) {
                    Ok(()) => {
                        assert!(held, "a digest taken by a replica not held");
                        digests.push(Dig {
                            carrier: id,
                            seq: next_seq,
                            durable: false,
                            maybe_lost: false,
                        });
                    }
                    Err(BackupError::Unknown(_)) => assert!(!held),
                    Err(BackupError::DiskFull { .. }) => {}
                    Err(BackupError::Io { .. }) => {
                        forget(&mut model, &mut digests, &mut in_flight, id)
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            Op::DiskFills { free } => store.io_mut().free_bytes = Some(free),
        }
        for (id, m) in &model {
            let info = store.list(None).into_iter().find(|r| r.id == *id);
            match info {
                Some(info) => {
                    assert_eq!(info.data_bytes, m.data.len() as u64, "{id:?}");
                    assert_eq!(info.closed, m.closed, "{id:?}");
                }
                None => assert!(m.data.is_empty() && !m.closed, "{id:?} vanished"),
            }
        }
        assert!(store.disk_bytes() <= budget);
    }
}
