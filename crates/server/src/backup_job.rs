//! What the backup service's committer is handed (a `Job`: one connection's
//! requests, or one round of this server's own replicator) and how a group
//! of jobs is answered.

use bytes::BytesMut;
use insitu_backup::service::Outcome;
use insitu_backup::{BackupService, FsIo};
use insitu_protocol::{Request, Status, decode_request};
use tokio::sync::oneshot;

use crate::replicate::OwnedOp;

/// One connection's complete backup requests (request id, body), and where
/// their encoded replies go (also what `LocalBackup` hands over).
pub(crate) struct Job {
    pub frames: Vec<(u64, JobBody)>,
    pub reply: oneshot::Sender<BytesMut>,
}

/// One request of a job.
pub(crate) enum JobBody {
    /// A request's body as it came off a connection: decoded by the committer.
    Encoded {
        body: BytesMut,
        /// It is a `BackupWrite` without a `FreeLog`: its work is copying
        /// its own bytes into the page cache. Any other request may read or
        /// delete whole replica files (`BackupRead` reads and verifies a
        /// file of megabytes from a frame of a few bytes), so its group
        /// never runs on the service thread, where it would hold up the
        /// pings (`backup_service::is_append`).
        append: bool,
    },
    /// A `BackupWrite` of this server's own replicator (`LocalBackup`),
    /// handed over as it is. Why not encoded: a round's bytes would be
    /// copied into a fresh frame on the shard thread (a recovery's rebuilt
    /// tablet is ~128 MB, and each new frame is page-faulted in) and parsed
    /// again here; the ops share the round's bytes with the other backups'
    /// sends instead. Made by this process and split as any frame is
    /// (`split_frames`: a frame's bytes, at most `MAX_BACKUP_OPS` ops), so
    /// they are within the limits a decoder would have checked.
    Write {
        cluster: u64,
        master: u64,
        ops: Vec<OwnedOp>,
    },
}

impl JobBody {
    /// Bytes the request carries (what decides where its group runs).
    pub fn len(&self) -> usize {
        match self {
            JobBody::Encoded { body, .. } => body.len(),
            JobBody::Write { ops, .. } => ops.iter().map(OwnedOp::len).sum(),
        }
    }

    /// Whether the request only appends (its work is bounded by `len`).
    pub fn is_append(&self) -> bool {
        match self {
            JobBody::Encoded { append, .. } => *append,
            JobBody::Write { .. } => true,
        }
    }

    /// The request, borrowing from the body.
    fn request(&self) -> Result<Request<'_>, Outcome> {
        match self {
            JobBody::Encoded { body, .. } => decode_request(body).map_err(malformed_request),
            JobBody::Write {
                cluster,
                master,
                ops,
            } => Ok(Request::BackupWrite {
                cluster: *cluster,
                master: *master,
                ops: ops.iter().map(OwnedOp::as_op).collect(),
            }),
        }
    }
}

/// Decode every request, handle them as one group, encode each job's replies.
pub(crate) fn answer_group(
    svc: &mut BackupService<FsIo>,
    jobs: &[Vec<(u64, JobBody)>],
) -> Vec<BytesMut> {
    let mut requests = Vec::new();
    // Per frame: Ok(index into requests) or the refusal of an undecodable one.
    let mut slots: Vec<Vec<(u64, Result<usize, Outcome>)>> = Vec::with_capacity(jobs.len());
    for frames in jobs {
        let mut job_slots = Vec::with_capacity(frames.len());
        for (id, body) in frames {
            let slot = body.request().map(|r| {
                requests.push(r);
                requests.len() - 1
            });
            job_slots.push((*id, slot));
        }
        slots.push(job_slots);
    }
    let outcomes = svc.handle_group(&requests);
    slots
        .iter()
        .map(|job_slots| {
            let hint = |slot: &Result<usize, Outcome>| match slot {
                Ok(i) => outcomes[*i].encoded_bytes_hint(),
                Err(refused) => refused.encoded_bytes_hint(),
            };
            let mut out = BytesMut::with_capacity(job_slots.iter().map(|(_, s)| hint(s)).sum());
            for (id, slot) in job_slots {
                match slot {
                    Ok(i) => outcomes[*i].encode(*id, &mut out),
                    Err(refused) => refused.encode(*id, &mut out),
                }
            }
            out
        })
        .collect()
}

/// The refusal of a request body that does not decode: one wording for the
/// connections and the committer.
pub(crate) fn malformed_request(e: impl std::fmt::Display) -> Outcome {
    Outcome::Refused {
        status: Status::BadRequest,
        message: format!("malformed request: {e}"),
    }
}
