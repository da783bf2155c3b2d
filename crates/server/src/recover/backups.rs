//! Steps 1 and 3 of a recovery, what it asks of the backups: the fenced
//! listing of every backup, and each segment's bytes from its holders in
//! turn. The network half, apart from the plan (`plan.rs`) and the replay.

use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use insitu_client::rpc::RpcConn;
use insitu_protocol::{LogDigest, ReplicaInfo, Request, Response, Status};

use super::Refusal;
use super::plan::SegmentPlan;
use crate::shard::ShardState;

/// Connecting to one backup must succeed within this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One backup's `BackupList` must be answered within this, or it is skipped.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// One `BackupRead` chunk (at most `READ_CHUNK_BYTES`) must arrive within this.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes asked for per `BackupRead`: a whole segment of the default size
/// (2 MiB) in one round trip, and under a frame's 4 MiB body limit. Why
/// whole segments: a backup reads and verifies the whole replica file for
/// every `BackupRead`, so a segment fetched in two chunks was read twice.
const READ_CHUNK_BYTES: u32 = insitu_backup::service::MAX_READ_BYTES;

/// `BackupList{fence: true}` on every backup in parallel: a connection, the
/// replicas and the log digests of each backup that answered (`None`:
/// skipped, logged).
pub(super) async fn list_all(
    state: &ShardState,
    backups: &[String],
    cluster: u64,
    master: u64,
) -> (
    Vec<Option<RpcConn>>,
    Vec<Vec<ReplicaInfo>>,
    Vec<Vec<LogDigest>>,
) {
    let answers = join_all(
        backups
            .iter()
            .map(|addr| list_one(state, addr, cluster, master)),
    )
    .await;
    let mut conns = Vec::with_capacity(backups.len());
    let mut listed = Vec::with_capacity(backups.len());
    let mut digests = Vec::with_capacity(backups.len());
    for (addr, answer) in backups.iter().zip(answers) {
        match answer {
            Ok((conn, replicas, d)) => {
                conns.push(Some(conn));
                listed.push(replicas);
                digests.push(d);
            }
            Err(e) => {
                tracing::warn!(backup = %addr, master, "skipping a backup during recovery: {e}");
                conns.push(None);
                listed.push(Vec::new());
                digests.push(Vec::new());
            }
        }
    }
    (conns, listed, digests)
}

async fn list_one(
    state: &ShardState,
    addr: &str,
    cluster: u64,
    master: u64,
) -> Result<(RpcConn, Vec<ReplicaInfo>, Vec<LogDigest>), String> {
    let conn = tokio::time::timeout(CONNECT_TIMEOUT, RpcConn::open(addr, state.gate.as_member()))
        .await
        .map_err(|_| format!("cannot connect to {addr}: timed out after {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let request = Request::BackupList {
        cluster,
        master,
        fence: true,
    };
    let reply = conn
        .call_timeout(&request, LIST_TIMEOUT)
        .await
        .map_err(|e| format!("listing replicas at {addr}: {e}"))?;
    if !reply.status.is_ok() {
        return Err(format!(
            "{addr} refused to list replicas: {}: {}",
            reply.status,
            reply.error_message()
        ));
    }
    match reply.decode() {
        Ok(Response::BackupReplicas { replicas, digests }) => Ok((conn, replicas, digests)),
        Ok(other) => Err(format!("{addr}: unexpected reply to BackupList: {other:?}")),
        Err(e) => Err(format!(
            "{addr}: cannot decode the reply to BackupList: {e}"
        )),
    }
}

/// The bytes of one segment from its holder `plan.next` or, failing that,
/// the next ones (`plan.next` is left at the holder that delivered).
pub(super) async fn fetch_segment(
    conns: &[Option<RpcConn>],
    backups: &[String],
    cluster: u64,
    master: u64,
    log: u64,
    plan: &mut SegmentPlan,
) -> Result<Bytes, Refusal> {
    let mut errors = Vec::new();
    while let Some(holder) = plan.holders.get(plan.next).copied() {
        let addr = &backups[holder.backup];
        let result = match &conns[holder.backup] {
            Some(conn) => {
                read_replica(conn, cluster, master, log, plan.segment, holder.bytes).await
            }
            None => Err("not connected".to_string()),
        };
        match result {
            Ok(bytes) => {
                if plan.next > 0 && holder.bytes < plan.holders[0].bytes {
                    tracing::warn!(
                        master,
                        log,
                        segment = plan.segment,
                        backup = %addr,
                        bytes = holder.bytes,
                        best_bytes = plan.holders[0].bytes,
                        "using a shorter replica: the longer ones could not be read"
                    );
                }
                return Ok(bytes);
            }
            Err(e) => {
                tracing::warn!(master, log, segment = plan.segment, backup = %addr,
                    "cannot read a replica, trying another holder: {e}");
                errors.push(format!("{addr}: {e}"));
                plan.next += 1;
            }
        }
    }
    Err((
        Status::Internal,
        format!(
            "segment {} of log {log} of master {master}: no backup could deliver it ({})",
            plan.segment,
            if errors.is_empty() {
                "no holder left".to_string()
            } else {
                errors.join("; ")
            }
        ),
    ))
}

/// Read `len` bytes of a replica in chunks; anything but exactly `len` bytes
/// (an error, a short read, more than asked) is an error. A replica that
/// comes in one chunk is returned as a view of the reply (no copy). Public
/// for the process-level test of both paths (`tests/backup_service.rs`).
pub async fn read_replica(
    conn: &RpcConn,
    cluster: u64,
    master: u64,
    log: u64,
    segment: u64,
    len: u64,
) -> Result<Bytes, String> {
    let len_usize =
        usize::try_from(len).map_err(|_| format!("{len} bytes do not fit in memory"))?;
    let mut buf = Vec::new();
    while (buf.len() as u64) < len {
        let want = (len - buf.len() as u64).min(READ_CHUNK_BYTES as u64) as u32;
        let request = Request::BackupRead {
            cluster,
            master,
            log,
            segment,
            offset: buf.len() as u64,
            max_bytes: want,
        };
        let reply = conn
            .call_timeout(&request, READ_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        if !reply.status.is_ok() {
            return Err(format!(
                "refused at offset {}: {}: {}",
                buf.len(),
                reply.status,
                reply.error_message()
            ));
        }
        let (bytes, end) = match reply.decode() {
            Ok(Response::BackupBytes { bytes, end }) => (bytes, end),
            Ok(other) => return Err(format!("unexpected reply to BackupRead: {other:?}")),
            Err(e) => return Err(format!("cannot decode the reply to BackupRead: {e}")),
        };
        if bytes.len() > want as usize {
            return Err(format!(
                "sent {} bytes at offset {} where at most {want} were asked for",
                bytes.len(),
                buf.len()
            ));
        }
        if buf.is_empty() && bytes.len() == len_usize && within(&reply.body, bytes) {
            return Ok(reply.body.slice_ref(bytes));
        }
        if buf.is_empty() {
            buf.try_reserve_exact(len_usize)
                .map_err(|_| format!("cannot allocate {len} bytes"))?;
        }
        buf.extend_from_slice(bytes);
        if (buf.len() as u64) < len && (end || bytes.is_empty()) {
            return Err(format!(
                "short read: {} of the {len} bytes it listed",
                buf.len()
            ));
        }
    }
    Ok(Bytes::from(buf))
}

/// Whether `part` lies inside `whole`'s memory (`Bytes::slice_ref` panics
/// otherwise; a decoder that borrows from its input always passes).
fn within(whole: &Bytes, part: &[u8]) -> bool {
    let (w, p) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    p >= w && p + part.len() <= w + whole.len()
}
