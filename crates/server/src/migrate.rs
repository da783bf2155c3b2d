//! Tablet migration between shards: the source freezes writes, copies its
//! live objects in bounded batches, and the destination installs them with
//! their versions. The coordinator then switches the map (see ARCHITECTURE.md).

use std::time::Duration;

use insitu_client::rpc::RpcConn;
use insitu_protocol::{Object, Request, SideRecord, Status, TabletState, blob};

use crate::handler::engine_status;
use crate::shard::ShardState;

/// Payload bytes per MigrateBatch: well under a frame, large enough to amortise a round trip.
const BATCH_BYTES: usize = 1024 * 1024;

/// Connecting to the destination shard must succeed within this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One MigrateBatch (about 1 MiB) must be acknowledged within this; a
/// destination that stops answering fails the migration instead of keeping
/// the tablet frozen for ever.
const BATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Copy the tablet to `dest_addr` (which holds it `Receiving`).
///
/// The tablet is frozen (writes get `Retry`) for the copy. On success it is
/// left *moved out*: it never answers again (see `TabletMeta::moved_out`),
/// because the coordinator may activate the destination at any moment. On
/// failure it un-freezes by itself, since the coordinator commits the new
/// owner only after an Ok reply. Either change applies only if no abort
/// (`TakeTablet`) or other migration took the tablet over meanwhile.
pub async fn migrate_out(
    state: &ShardState,
    table: u64,
    start_hash: u64,
    dest_addr: &str,
    migration: u64,
) -> Result<(), (Status, String)> {
    // Never copy half an update: wait for it (no await between here and the freeze).
    crate::hold::wait_no_update(state, table, start_hash).await?;
    let id = state.migrations.get() + 1;
    {
        let mut tablets = state.tablets.borrow_mut();
        let Some(meta) = tablets.get_mut(&(table, start_hash)) else {
            return Err((
                Status::UnknownTablet,
                format!("tablet {table}/{start_hash:#x} is not on this shard"),
            ));
        };
        if !meta.serves_writes() {
            return Err((
                Status::BadRequest,
                format!(
                    "tablet {table}/{start_hash:#x} cannot be migrated: it is not plainly active here \
                     (receiving, moved out, or already being migrated)"
                ),
            ));
        }
        meta.frozen = true;
        meta.migration = id;
    }
    state.migrations.set(id);
    state.recount_unusual();
    let result = copy_out(state, (table, start_hash, migration), dest_addr).await;
    let mut tablets = state.tablets.borrow_mut();
    let ours = tablets
        .get_mut(&(table, start_hash))
        .filter(|m| m.frozen && m.migration == id);
    let outcome = match (result, ours) {
        (Ok(()), Some(meta)) => {
            meta.moved_out = true;
            Ok(())
        }
        (Err(e), Some(meta)) => {
            meta.frozen = false;
            meta.migration = 0;
            tracing::warn!(
                shard = state.index,
                table,
                start_hash,
                dest_addr,
                "migration failed; the tablet serves again here: {}",
                e.1
            );
            Err(e)
        }
        (Ok(()), None) | (Err(_), None) => Err((
            Status::Retry,
            format!(
                "the migration of tablet {table}/{start_hash:#x} was aborted or superseded meanwhile"
            ),
        )),
    };
    drop(tablets);
    state.recount_unusual();
    outcome
}

/// The copy itself: every live object with its version, then the version floor.
async fn copy_out(
    state: &ShardState,
    (table, start_hash, migration): (u64, u64, u64),
    dest_addr: &str,
) -> Result<(), (Status, String)> {
    // Writes are refused from here on, so this copy is the tablet's final
    // content. It is taken one ~1 MiB chunk at a time (`extract_chunk`, in hash
    // order), with the round trip of each batch between chunks, so the shard
    // serves other requests meanwhile and holds at most one chunk beside the
    // data (charged to the memory budget until the batch is acknowledged).
    // A prepared transaction's writes land at its decision: wait for every
    // lock on the tablet to go (no new one can come, the tablet is frozen).
    crate::txn::wait_no_locks(state, table, start_hash).await?;
    let commit_ts_bound = commit_ts_bound(state, table).await;
    let engine_error = |e: insitu_engine::EngineError| (engine_status(&e), e.to_string());
    let (mut cursor, next_version) = {
        let engine = state.engine.borrow();
        let cursor = engine
            .extract_begin(table, start_hash)
            .map_err(engine_error)?;
        let next_version = engine
            .tablet_stats(table, start_hash)
            .map(|s| s.next_version)
            .unwrap_or(1);
        (cursor, next_version)
    };
    let conn = tokio::time::timeout(
        CONNECT_TIMEOUT,
        RpcConn::open(dest_addr, state.gate.as_member()),
    )
    .await
    .map_err(|_| {
        (
            Status::Internal,
            format!("cannot connect to {dest_addr}: timed out after {CONNECT_TIMEOUT:?}"),
        )
    })?
    .map_err(|e| (Status::Internal, e.to_string()))?;
    let (head, floor) = (
        (table, start_hash, migration),
        (next_version, commit_ts_bound),
    );
    let mut sent = 0usize;
    let mut batches = 0usize;
    // Always send at least one batch so the destination learns next_version.
    loop {
        let chunk = state
            .engine
            .borrow()
            .extract_chunk(&mut cursor, BATCH_BYTES)
            .map_err(engine_error)?;
        let objects = chunk
            .objects
            .iter()
            .map(|(k, v, ver, expires_at_ms)| Object {
                key: blob(k),
                value: blob(v),
                version: *ver,
                expires_at_ms: *expires_at_ms,
            })
            .collect();
        send_batch(&conn, &batch(head, floor, objects, Vec::new()), dest_addr).await?;
        sent += chunk.objects.len();
        batches += 1;
        if cursor.is_done() {
            break;
        }
    }
    // The tablet's transaction records follow (decisions a participant may
    // still ask about; no prepared part is left: the locks were waited
    // for). Few and small, so they are copied at once, in batches of the
    // same size bound.
    let records = state.engine.borrow().records(table, start_hash);
    let mut at = 0;
    while at < records.len() {
        let mut bytes = 0;
        let mut end = at;
        while end < records.len()
            && (end == at
                || bytes + records[end].payload.len() + records[end].anchor.len() < BATCH_BYTES)
            && end - at < insitu_protocol::limits::MAX_MULTI_ITEMS
        {
            bytes += records[end].payload.len() + records[end].anchor.len() + 32;
            end += 1;
        }
        let side_records = records[at..end]
            .iter()
            .map(|r| SideRecord {
                class: r.id.class,
                id: r.id.id,
                anchor: blob(&r.anchor),
                payload: blob(&r.payload),
            })
            .collect();
        send_batch(
            &conn,
            &batch(head, floor, Vec::new(), side_records),
            dest_addr,
        )
        .await?;
        batches += 1;
        at = end;
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

/// The bound on the commits applied to the tablet of `table` that moves out
/// now (`commit_bound.rs`), its snapshot floor at the destination. Called
/// once its last commit here was applied (its locks are gone, the tablet is
/// frozen). Unknown here: a timestamp from the oracle, which every commit
/// applied before was handed out before; None if that fails (the
/// destination learns a floor itself).
async fn commit_ts_bound(state: &ShardState, table: u64) -> Option<u64> {
    let marks = match state.versions.borrow().commits.carried(table) {
        Ok(bound) => return Some(bound),
        Err(marks) => marks,
    };
    let fetched = if crate::faults::fault_at("move-oracle-fails", table) {
        Err("the timestamp oracle is unreachable (fault injected)".to_string())
    } else {
        crate::txn_peers::oracle_timestamp(state).await
    };
    match fetched {
        Ok(ts) => {
            state
                .versions
                .borrow_mut()
                .commits
                .learned(table, marks, ts);
            Some(ts)
        }
        Err(why) => {
            tracing::warn!(
                shard = state.index,
                table,
                "no commit bound for a moving tablet: {why}"
            );
            None
        }
    }
}

/// One `MigrateBatch` of objects or of side records, with what every batch
/// of a move carries: the tablet and move, its next version and commit bound
/// (grouped as `install_batch` takes them).
fn batch<'a>(
    (table, start_hash, migration): (u64, u64, u64),
    (next_version, commit_ts_bound): (u64, Option<u64>),
    objects: Vec<Object<'a>>,
    records: Vec<SideRecord<'a>>,
) -> Request<'a> {
    Request::MigrateBatch {
        table,
        start_hash,
        migration,
        next_version,
        commit_ts_bound,
        objects,
        records,
    }
}

/// Send one batch and require its acknowledgement.
async fn send_batch(
    conn: &RpcConn,
    request: &Request<'_>,
    dest_addr: &str,
) -> Result<(), (Status, String)> {
    let reply = conn
        .call_timeout(request, BATCH_TIMEOUT)
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
    Ok(())
}

/// Prepare for `TakeTablet{Receiving}` of move `migration`: a copy already
/// here that is not this move's receiving copy is dropped, so the move starts
/// from an empty tablet. Why: a copy left by an aborted attempt, or one moved
/// out earlier, holds objects that may have been deleted since; batches
/// installed on top would bring them back. A copy that serves here is
/// refused instead (the coordinator never moves a tablet onto its owner).
pub fn fresh_receiving_copy(
    state: &ShardState,
    table: u64,
    start_hash: u64,
    migration: u64,
) -> Result<(), String> {
    if migration == 0 {
        return Err("a receiving copy needs the move's id (nonzero)".into());
    }
    let stale = match state.tablets.borrow().get(&(table, start_hash)) {
        None => false,
        Some(m) if m.serves_reads() => {
            return Err(format!(
                "tablet {table}/{start_hash:#x} serves here; it cannot receive a copy over itself"
            ));
        }
        Some(m) => !(m.state == TabletState::Receiving && m.receiving == migration),
    };
    if stale {
        state.tablets.borrow_mut().remove(&(table, start_hash));
        state.engine.borrow_mut().drop_tablet(table, start_hash);
        tracing::info!(
            shard = state.index,
            table,
            start_hash,
            migration,
            "dropped a stale copy before receiving a move"
        );
    }
    Ok(())
}

/// Install one batch of move `migration` into the receiving copy.
pub fn install_batch(
    state: &ShardState,
    (table, start_hash, migration): (u64, u64, u64),
    (next_version, commit_ts_bound): (u64, Option<u64>),
    objects: &[Object<'_>],
    records: &[SideRecord<'_>],
) -> Result<(), (Status, String)> {
    match state.tablets.borrow_mut().get_mut(&(table, start_hash)) {
        Some(m)
            if m.state == TabletState::Receiving && m.receiving == migration && migration != 0 =>
        {
            // Every batch of a move carries the same bound.
            m.carried_commit_ts = commit_ts_bound;
        }
        Some(m) if m.state == TabletState::Receiving => {
            return Err((
                Status::BadRequest,
                format!(
                    "a batch of move {migration:#x} does not belong to this receiving copy (move {:#x}): \
                     a late batch of an aborted move is refused",
                    m.receiving
                ),
            ));
        }
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
            .install_expiring(table, o.key, o.value, o.version, o.expires_at_ms)
            .map_err(|e| (engine_status(&e), e.to_string()))?;
    }
    for r in records {
        let id = insitu_engine::RecordId {
            class: r.class,
            id: r.id,
        };
        // Only into this tablet: a record anchored elsewhere is refused.
        let inside = engine
            .tablet_for(table, insitu_engine::key_hash(table, r.anchor))
            .is_some_and(|range| range.start == start_hash);
        if !inside {
            return Err((
                Status::BadRequest,
                "a migrated record's anchor is not in the tablet".into(),
            ));
        }
        engine
            .put_record(table, r.anchor, id, r.payload)
            .map_err(|e| (engine_status(&e), e.to_string()))?;
    }
    engine
        .raise_version(table, start_hash, next_version)
        .map_err(|e| (engine_status(&e), e.to_string()))?;
    drop(engine);
    for r in records {
        let id = insitu_engine::RecordId {
            class: r.class,
            id: r.id,
        };
        crate::txn_durable::restore_record(state, table, id, r.anchor, r.payload);
    }
    Ok(())
}
