//! Tablet migration between shards: the source freezes writes, copies its
//! live objects in bounded batches, and the destination installs them with
//! their versions. The coordinator then switches the map (see ARCHITECTURE.md).

use insitu_client::rpc::RpcConn;
use insitu_protocol::{Object, Request, Status, TabletState, blob};

use crate::handler::engine_status;
use crate::shard::ShardState;

/// Payload bytes per MigrateBatch: well under a frame, large enough to amortise a round trip.
const BATCH_BYTES: usize = 1024 * 1024;

pub async fn migrate_out(
    state: &ShardState,
    table: u64,
    start_hash: u64,
    dest_addr: &str,
) -> Result<(), (Status, String)> {
    // Never copy half an update: wait for it (no await between here and the freeze).
    crate::hold::wait_no_update(state, table, start_hash).await?;
    {
        let mut tablets = state.tablets.borrow_mut();
        let Some(meta) = tablets.get_mut(&(table, start_hash)) else {
            return Err((
                Status::UnknownTablet,
                format!("tablet {table}/{start_hash:#x} is not on this shard"),
            ));
        };
        meta.frozen = true;
    }
    state.recount_unusual();
    // Writes are refused from here on, so this copy is the tablet's final content.
    let (objects, next_version) = {
        let engine = state.engine.borrow();
        let objects = engine
            .extract(table, start_hash)
            .map_err(|e| (engine_status(&e), e.to_string()))?;
        let next_version = engine
            .tablet_stats(table, start_hash)
            .map(|s| s.next_version)
            .unwrap_or(1);
        (objects, next_version)
    };
    let conn = RpcConn::connect(dest_addr)
        .await
        .map_err(|e| (Status::Internal, e.to_string()))?;
    let mut sent = 0usize;
    let mut batches = 0usize;
    let mut start = 0usize;
    // Always send at least one batch so the destination learns next_version.
    loop {
        let mut end = start;
        let mut bytes = 0usize;
        while end < objects.len()
            && (end == start
                || bytes + objects[end].0.len() + objects[end].1.len() + 24 <= BATCH_BYTES)
        {
            bytes += objects[end].0.len() + objects[end].1.len() + 24;
            end += 1;
        }
        let batch: Vec<Object<'_>> = objects[start..end]
            .iter()
            .map(|(k, v, ver)| Object {
                key: blob(k),
                value: blob(v),
                version: *ver,
            })
            .collect();
        let reply = conn
            .call(&Request::MigrateBatch {
                table,
                start_hash,
                next_version,
                objects: batch,
            })
            .await
            .map_err(|e| {
                (
                    Status::Internal,
                    format!("migration to {dest_addr} failed: {e}"),
                )
            })?;
        if !reply.status.is_ok() {
            return Err((
                reply.status,
                format!("destination refused a batch: {}", reply.error_message()),
            ));
        }
        sent += end - start;
        batches += 1;
        start = end;
        if start >= objects.len() {
            break;
        }
    }
    tracing::info!(
        shard = state.index,
        table,
        start_hash,
        objects = sent,
        batches,
        dest_addr,
        "tablet copied out"
    );
    Ok(())
}

pub fn install_batch(
    state: &ShardState,
    table: u64,
    start_hash: u64,
    next_version: u64,
    objects: &[Object<'_>],
) -> Result<(), (Status, String)> {
    match state.tablets.borrow().get(&(table, start_hash)) {
        Some(m) if m.state == TabletState::Receiving => {}
        Some(_) => {
            return Err((
                Status::BadRequest,
                "tablet is not receiving a migration".into(),
            ));
        }
        None => return Err((Status::UnknownTablet, "no such tablet on this shard".into())),
    }
    let mut engine = state.engine.borrow_mut();
    for o in objects {
        engine
            .install(table, o.key, o.value, o.version)
            .map_err(|e| (engine_status(&e), e.to_string()))?;
    }
    engine
        .raise_version(table, start_hash, next_version)
        .map_err(|e| (engine_status(&e), e.to_string()))?;
    Ok(())
}
