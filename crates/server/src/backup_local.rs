//! This server's own backup, called in-process by its shards' replicators.
//!
//! Why: a one-server cluster (`insitu up --servers 1`), and every segment
//! for which fewer other backups are live than R, keeps a replica on this
//! server's own disk (`ReplicationConfig::own_backup`). Through the backup
//! port each round to it was a loopback TCP round trip: two sends and two
//! receives through the socket layer, a frame parse and the gate on the
//! backup thread, and a durable write waits for that round. In-process, a
//! round's writes go to the backup thread's committer as one job over a
//! channel (the same group commit and the same store code as a
//! connection's), as ops sharing the round's bytes, never encoded
//! (`JobBody::Write`), and the encoded replies come back on a oneshot. The
//! two thread wake-ups stay; the sockets and the copies go. The gate is not
//! asked: the writes are made by this process.

use std::fmt;

use bytes::Buf;
use insitu_client::rpc::Reply;
use insitu_protocol::frame::{HEADER_BYTES, check_header};
use tokio::sync::{mpsc, oneshot};

use crate::backup_job::{Job, JobBody};

/// The in-process door to this server's backup service (cheap to clone).
#[derive(Clone)]
pub struct LocalBackup {
    /// The committer's queue, shared with the backup port's connections.
    jobs: mpsc::UnboundedSender<Job>,
}

impl fmt::Debug for LocalBackup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LocalBackup")
    }
}

impl LocalBackup {
    pub(crate) fn new(jobs: mpsc::UnboundedSender<Job>) -> LocalBackup {
        LocalBackup { jobs }
    }

    /// Hand `bodies` to the backup service as one job, applied in order
    /// as a connection's pipelined frames are; their replies, in order.
    /// Err says why there are none (the service stopped, or its answer did
    /// not parse): the caller treats it as a failed backup.
    pub(crate) async fn call(&self, bodies: Vec<JobBody>) -> Result<Vec<Reply>, String> {
        let asked = bodies.len();
        let frames: Vec<(u64, JobBody)> = (0..).zip(bodies).collect();
        let (reply, answered) = oneshot::channel();
        self.jobs
            .send(Job { frames, reply })
            .map_err(|_| "this server's backup service has stopped".to_string())?;
        let mut out = answered
            .await
            .map_err(|_| "this server's backup service stopped before answering".to_string())?;
        let mut replies = Vec::with_capacity(asked);
        while !out.is_empty() {
            let parsed = check_header(&out, usize::MAX)
                .map_err(|e| format!("the backup service's reply does not parse: {e}"))?;
            let Some((header, body_len)) = parsed else {
                return Err("the backup service's reply is cut short".into());
            };
            if out.len() < HEADER_BYTES + body_len || header.request_id != replies.len() as u64 {
                return Err("the backup service's replies are cut short or out of order".into());
            }
            let mut frame = out.split_to(HEADER_BYTES + body_len);
            frame.advance(HEADER_BYTES);
            replies.push(Reply {
                status: header.status,
                body: frame.freeze(),
            });
        }
        if replies.len() != asked {
            return Err(format!(
                "the backup service answered {} of {} requests",
                replies.len(),
                asked
            ));
        }
        Ok(replies)
    }
}
