//! The backup service's request handling, free of sockets: what a storage
//! server's backup port does with `BackupWrite`, `BackupList`, `BackupRead`
//! and `BackupForget` (and `Ping`), over one `BackupStore`.
//!
//! Group commit: `handle_group` applies every op of every request it is
//! given, then — under `SyncMode::Always` — makes them durable with ONE
//! `flush` (one fsync per replica file touched, however many ops and
//! requests touched it) before any of them is answered. The server hands it
//! every request that arrived while the previous group was being flushed,
//! so the fsync cost is shared by all of them. Under `SyncMode::Interval` a
//! group is answered once it is in memory; the server calls `flush` on a
//! timer (every `sync_interval`), so acknowledged data reaches the disk
//! within one interval.
//!
//! Fencing: `BackupList{fence: true}` (a recovery of `master` started) makes
//! the store record the master as fenced, durably, before the list is
//! answered; every later `BackupWrite` from it is refused with
//! `Status::Fenced`, so a master that was declared dead but still runs can
//! no longer make a write durable here.

use bytes::BytesMut;
use insitu_protocol::{
    BackupOp, Destination, LogDigest, Request, Response, Status, blob, encode_error,
    encode_response, message::ReplicaInfo as WireReplica,
};

use crate::io::Io;
use crate::store::{AppendMode, BackupStore, SyncMode};
use crate::{BackupError, Digest, ReplicaId, Tablet};

/// Most bytes one `BackupRead` answers with, whatever it asks for: 2 MiB is
/// a whole segment of the engine's default size, so a recovery reads each
/// replica file once (every `BackupRead` reads and verifies the whole file),
/// and it keeps a reply inside a frame (4 MiB).
pub const MAX_READ_BYTES: u32 = 2 << 20;

/// Appends of at least this many bytes are written at once from the
/// received frame (`AppendMode::Now`), smaller ones buffered until
/// the group is written. Why: copying a large append into a buffer costs
/// more than its own write call (a recovery's re-replication, 1 MiB ops);
/// many small appends to one replica (point writes from many connections)
/// share one write call when buffered.
pub const DIRECT_MIN_BYTES: usize = 16 * 1024;

/// How one request is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pong,
    Done,
    /// The replicas held of a master, and per log its newest digest.
    Replicas(Vec<WireReplica>, Vec<LogDigest>),
    /// A chunk of a replica; `end`: it reaches the end of what is held.
    Bytes {
        bytes: Vec<u8>,
        end: bool,
    },
    /// Any non-Ok answer, with the reason for the log of whoever asked.
    Refused {
        status: Status,
        message: String,
    },
}

impl Outcome {
    fn refused(status: Status, message: impl Into<String>) -> Outcome {
        debug_assert!(status != Status::Ok);
        Outcome::Refused {
            status,
            message: message.into(),
        }
    }

    /// About the bytes `encode` appends: a job's replies are reserved at
    /// once from these (grown one reply at a time, a job of several replica
    /// reads copied the earlier replies again at each growth).
    pub fn encoded_bytes_hint(&self) -> usize {
        let body = match self {
            Outcome::Bytes { bytes, .. } => bytes.len(),
            _ => 0,
        };
        insitu_protocol::HEADER_BYTES + 64 + body
    }

    /// Append the reply frame for request `request_id` to `out`.
    pub fn encode(&self, request_id: u64, out: &mut BytesMut) {
        let response = match self {
            Outcome::Pong => Response::Pong,
            Outcome::Done => Response::Done,
            Outcome::Replicas(replicas, digests) => Response::BackupReplicas {
                replicas: replicas.clone(),
                digests: digests.clone(),
            },
            Outcome::Bytes { bytes, end } => {
                // One allocation for the reply instead of doubling up to it.
                out.reserve(bytes.len() + 64);
                Response::BackupBytes {
                    bytes: blob(bytes),
                    end: *end,
                }
            }
            Outcome::Refused { status, message } => {
                return encode_error(out, request_id, *status, message.as_str());
            }
        };
        if let Err(e) = encode_response(out, request_id, Status::Ok, &response) {
            // Only a list of a huge number of replicas can get here.
            encode_error(
                out,
                request_id,
                Status::Internal,
                format!("backup reply does not fit a frame: {e}"),
            );
        }
    }
}

/// The answer to a request that needs no store: `Ping`, and a refusal of
/// anything that is not a backup request. None for the four backup requests.
pub fn answer_without_store(request: &Request<'_>) -> Option<Outcome> {
    match request {
        Request::Ping => Some(Outcome::Pong),
        r if r.destination() == Destination::Backup => None,
        _ => Some(Outcome::refused(
            Status::BadRequest,
            "this is a backup service port: it answers Ping, BackupWrite, BackupList, \
             BackupRead and BackupForget only (data requests go to a shard's port)",
        )),
    }
}

/// The status and message a store error is answered with.
pub fn refusal(e: &BackupError) -> Outcome {
    match e {
        BackupError::DiskFull { .. } => Outcome::refused(
            Status::NoSpace,
            format!("{e}; send this replica to another backup"),
        ),
        BackupError::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
            Outcome::refused(
                Status::NoSpace,
                format!("backup disk full: {e}; send this replica to another backup"),
            )
        }
        BackupError::Gap { .. }
        | BackupError::Closed(_)
        | BackupError::TooLarge { .. }
        | BackupError::WrongTablet { .. }
        | BackupError::Malformed(_)
        | BackupError::Unknown(_) => Outcome::refused(Status::BadRequest, e.to_string()),
        BackupError::Corrupt { .. } => Outcome::refused(
            Status::Internal,
            format!("{e}; read this segment from another backup"),
        ),
        BackupError::Io { .. } | BackupError::OtherCluster { .. } => {
            Outcome::refused(Status::Internal, e.to_string())
        }
    }
}

/// One backup's request handling over its store.
pub struct BackupService<I: Io> {
    store: BackupStore<I>,
}

impl<I: Io> BackupService<I> {
    pub fn new(store: BackupStore<I>) -> BackupService<I> {
        BackupService { store }
    }

    pub fn store(&self) -> &BackupStore<I> {
        &self.store
    }

    pub fn store_mut(&mut self) -> &mut BackupStore<I> {
        &mut self.store
    }

    pub fn into_store(self) -> BackupStore<I> {
        self.store
    }

    /// Answer `requests` (in order), as one group: every op is applied, then
    /// under `SyncMode::Always` one flush makes them all durable, and only
    /// then are the outcomes returned. A write whose replica could not be
    /// made durable is answered with the error instead of `Done`.
    pub fn handle_group(&mut self, requests: &[Request<'_>]) -> Vec<Outcome> {
        // Per request, the replicas its appends touched (to fail it if their
        // flush fails).
        let mut touched: Vec<Vec<ReplicaId>> = Vec::with_capacity(requests.len());
        let mut outcomes: Vec<Outcome> = requests
            .iter()
            .map(|r| {
                let mut t = Vec::new();
                let outcome = self.handle_one(r, &mut t);
                touched.push(t);
                outcome
            })
            .collect();
        if self.store.needs_flush() {
            // Always: written and fsynced before anyone is answered. Interval:
            // written (handed to the kernel, no fsync) before anyone is
            // answered, so a crash of every process (kill -9) loses nothing
            // acknowledged; only a power loss can cost the last interval.
            let failed = match self.store.sync_mode() {
                SyncMode::Always => self.store.flush_each(),
                SyncMode::Interval => self.store.write_pending(),
            };
            for (id, e) in &failed {
                for (outcome, ids) in outcomes.iter_mut().zip(&touched) {
                    if *outcome == Outcome::Done && ids.contains(id) {
                        *outcome = refusal(e);
                    }
                }
            }
        }
        debug_assert_eq!(outcomes.len(), requests.len());
        outcomes
    }

    /// Write out and fsync everything buffered (the interval timer, and at
    /// shutdown). Returns the replicas that failed (each was dropped).
    pub fn flush(&mut self) -> Vec<(ReplicaId, BackupError)> {
        self.store.flush_each()
    }

    fn check_cluster(&self, cluster: u64) -> Result<(), Outcome> {
        if cluster == self.store.cluster() {
            return Ok(());
        }
        Err(Outcome::refused(
            Status::BadRequest,
            format!(
                "request for cluster {cluster:#x}, but this backup serves cluster {:#x}",
                self.store.cluster()
            ),
        ))
    }

    fn handle_one(&mut self, request: &Request<'_>, touched: &mut Vec<ReplicaId>) -> Outcome {
        if let Some(outcome) = answer_without_store(request) {
            return outcome;
        }
        let result = match request {
            Request::BackupWrite {
                cluster,
                master,
                ops,
            } => self.write(*cluster, *master, ops, touched),
            Request::BackupList {
                cluster,
                master,
                fence,
            } => self.list(*cluster, *master, *fence),
            Request::BackupRead {
                cluster,
                master,
                log,
                segment,
                offset,
                max_bytes,
            } => {
                let id = ReplicaId {
                    master: *master,
                    log: *log,
                    segment: *segment,
                };
                self.read(*cluster, id, *offset, *max_bytes)
            }
            Request::BackupForget { cluster, master } => self.forget(*cluster, *master),
            _ => unreachable!("answer_without_store answers every other request"),
        };
        result.unwrap_or_else(|refused| refused)
    }

    fn write(
        &mut self,
        cluster: u64,
        master: u64,
        ops: &[BackupOp<'_>],
        touched: &mut Vec<ReplicaId>,
    ) -> Result<Outcome, Outcome> {
        self.check_cluster(cluster)?;
        if self.store.is_fenced(master) {
            return Err(Outcome::refused(
                Status::Fenced,
                format!(
                    "master {master} was declared dead (fenced by its recovery); its writes are refused"
                ),
            ));
        }
        let replica = |log, segment| ReplicaId {
            master,
            log,
            segment,
        };
        for (i, op) in ops.iter().enumerate() {
            let result = match *op {
                BackupOp::Append {
                    log,
                    table,
                    start_hash,
                    segment,
                    offset,
                    bytes,
                    close,
                } => {
                    let id = replica(log, segment);
                    touched.push(id);
                    let tablet = Tablet { table, start_hash };
                    // A large append is written at once, straight from the
                    // frame (no reply goes out before the group's writes
                    // are anyway, see `handle_group`); small ones are
                    // buffered, so a group's appends to one replica share
                    // one write.
                    let mode = if bytes.len() >= DIRECT_MIN_BYTES {
                        AppendMode::Now
                    } else {
                        AppendMode::Buffered
                    };
                    self.store.append(id, tablet, offset, bytes, close, mode)
                }
                BackupOp::Free { log, segment } => {
                    self.store.free(replica(log, segment));
                    Ok(())
                }
                BackupOp::FreeLog { log } => {
                    self.store.free_log(master, log);
                    Ok(())
                }
                BackupOp::Digest {
                    log,
                    segment,
                    seq,
                    ref segments,
                } => {
                    let id = replica(log, segment);
                    touched.push(id);
                    let digest = Digest {
                        seq,
                        segments: segments.clone(),
                    };
                    self.store.digest(id, digest)
                }
            };
            if let Err(e) = result {
                // The ops before this one stay applied; a master resends
                // from what the backup holds, which is accepted again.
                return Err(match refusal(&e) {
                    Outcome::Refused { status, message } => Outcome::refused(
                        status,
                        format!("op {} of {}: {message}", i + 1, ops.len()),
                    ),
                    other => other,
                });
            }
        }
        Ok(Outcome::Done)
    }

    fn list(&mut self, cluster: u64, master: u64, fence: bool) -> Result<Outcome, Outcome> {
        self.check_cluster(cluster)?;
        if fence {
            self.store.fence(master).map_err(|e| refusal(&e))?;
        }
        let replicas = self
            .store
            .list(Some(master))
            .into_iter()
            .map(|r| WireReplica {
                log: r.id.log,
                table: r.tablet.table,
                start_hash: r.tablet.start_hash,
                segment: r.id.segment,
                bytes: r.data_bytes,
                closed: r.closed,
            })
            .collect();
        let digests = self
            .store
            .digests(master)
            .into_iter()
            .map(|(id, d)| LogDigest {
                log: id.log,
                segment: id.segment,
                seq: d.seq,
                segments: d.segments,
            })
            .collect();
        Ok(Outcome::Replicas(replicas, digests))
    }

    fn read(
        &mut self,
        cluster: u64,
        id: ReplicaId,
        offset: u64,
        max_bytes: u32,
    ) -> Result<Outcome, Outcome> {
        self.check_cluster(cluster)?;
        if max_bytes == 0 {
            return Err(Outcome::refused(
                Status::BadRequest,
                "BackupRead max_bytes must be at least 1",
            ));
        }
        // Re-read from disk and verified record by record on every call.
        let (data, _closed) = self.store.read(id).map_err(|e| refusal(&e))?;
        let held = data.len() as u64;
        if offset > held {
            return Err(Outcome::refused(
                Status::BadRequest,
                format!("read of {id:?} at offset {offset}, but only {held} bytes are held"),
            ));
        }
        let n = u64::from(max_bytes.min(MAX_READ_BYTES)).min(held - offset);
        let (from, to) = (offset as usize, (offset + n) as usize);
        // The usual case, the whole replica at once, moves it without a copy.
        let bytes = if from == 0 && to == data.len() {
            data
        } else {
            data[from..to].to_vec()
        };
        Ok(Outcome::Bytes {
            bytes,
            end: to as u64 == held,
        })
    }

    fn forget(&mut self, cluster: u64, master: u64) -> Result<Outcome, Outcome> {
        self.check_cluster(cluster)?;
        self.store.forget_master(master).map_err(|e| refusal(&e))?;
        Ok(Outcome::Done)
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
