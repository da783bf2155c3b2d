//! This server's own backup, called in-process by its shards' replicators.
//!
//! Why: a one-server cluster (`insitu up --servers 1`), and every segment
//! for which fewer other backups are live than R, keeps a replica on this
//! server's own disk (`ReplicationConfig::own_backup`). Through the backup
//! port each round to it was a loopback TCP round trip: two sends and two
//! receives through the socket layer, a frame parse and the gate on the
//! backup thread, and a durable write waits for that round. In-process, a
//! round's frames go to the backup thread's committer as one job over a
//! channel (the same group commit and the same store code as a
//! connection's), and the encoded replies come back on a oneshot. The two
//! thread wake-ups stay; the sockets go. The gate is not asked: the frames
//! are made by this process.

use std::fmt;

use bytes::{Buf, BytesMut};
use insitu_client::rpc::Reply;
use insitu_protocol::frame::{HEADER_BYTES, check_header};
use insitu_protocol::{MAX_BODY_BYTES, Request, encode_request, encoded_len};
use tokio::sync::{mpsc, oneshot};

use crate::backup_service::Job;

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

    /// Hand `requests` to the backup service as one job, applied in order
    /// as a connection's pipelined frames are; their replies, in order.
    /// Err says why there are none (the service stopped, or its answer did
    /// not parse): the caller treats it as a failed backup.
    pub async fn call(&self, requests: &[Request<'_>]) -> Result<Vec<Reply>, String> {
        let mut frames = Vec::with_capacity(requests.len());
        for (id, request) in requests.iter().enumerate() {
            // Sized before encoding, as `RpcConn::call` does: a batch of
            // up to 4 MiB grown by doubling from empty copies its bytes
            // about twice more and faults in a fresh buffer per doubling.
            let mut body =
                BytesMut::with_capacity(HEADER_BYTES + encoded_len(request).min(MAX_BODY_BYTES));
            encode_request(&mut body, id as u64, request)
                .map_err(|e| format!("cannot encode a backup request: {e}"))?;
            body.advance(HEADER_BYTES);
            frames.push((id as u64, body));
        }
        let (reply, answered) = oneshot::channel();
        self.jobs
            .send(Job { frames, reply })
            .map_err(|_| "this server's backup service has stopped".to_string())?;
        let mut out = answered
            .await
            .map_err(|_| "this server's backup service stopped before answering".to_string())?;
        let mut replies = Vec::with_capacity(requests.len());
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
        if replies.len() != requests.len() {
            return Err(format!(
                "the backup service answered {} of {} requests",
                replies.len(),
                requests.len()
            ));
        }
        Ok(replies)
    }
}
