//! Step 2 of a dead server's recovery for one tablet on one shard: the
//! `RecoverTablet` call and the new owner committed. Its two activations
//! (reads, then writes) are `finish.rs`; the driver (`recovery.rs`) deals
//! tablets to shards.

use std::time::Duration;

use insitu_client::rpc::RpcConn;
use insitu_protocol::{Request, Response};
use tracing::{info, warn};

use crate::model::{MAP_VERSION, Op, Tablet};
use crate::service::Coordinator;
use crate::shards::{CONNECT_TIMEOUT, CONTROL_TIMEOUT};

/// A recovery reads and replays a whole tablet, and the reads-only
/// activation waits for the replay's replication: give them time.
pub(super) const RECOVER_TIMEOUT: Duration = Duration::from_secs(120);

/// How recovering one tablet on one shard ended, short of success.
pub(super) enum Failed {
    /// Try another shard.
    Shard(String),
    /// The tablet is no longer lost from this master (its table was dropped,
    /// or another change took it): nothing left to do for it.
    Gone,
}

/// Recover one orphaned tablet on one shard and commit the owner (its
/// activations follow, `finish.rs`). Ok: (objects, segments, bytes) and the
/// committed tablet.
pub(super) async fn recover_tablet(
    coord: &Coordinator,
    dead: u64,
    table: u64,
    index: u32,
    tablet: &Tablet,
    (server, shard, addr): &(u64, u32, String),
    backups: &[String],
) -> Result<((u64, u64, u64), Tablet), Failed> {
    let started = std::time::Instant::now();
    // A version of its own for the shard's Receiving copy: never reused,
    // even if this coordinator restarts before committing anything else.
    let reserved = {
        let guard = coord.meta_lock.lock().await;
        let version = coord.model().map_version + 1;
        coord
            .commit(&guard, vec![Op::Counter(MAP_VERSION, version)])
            .await
            .map_err(|e| Failed::Shard(format!("reserving a map version: {}", e.message)))?;
        version
    };
    let request = Request::RecoverTablet {
        table,
        start_hash: tablet.start_hash,
        end_hash: tablet.end_hash,
        map_version: reserved,
        master: dead,
        backups: backups.to_vec(),
        // An operator gave up what no backup holds (`accept_loss`): the
        // tablet is recorded in `data_lost`, so it is marked lost below.
        accept_missing: coord.model().data_lost.contains_key(&(table, index)),
    };
    let reserve_ms = started.elapsed().as_millis() as u64;
    let recovered = match call_recover(coord, addr, &request).await {
        Ok(r) => r,
        Err(e) => {
            // It may have installed a Receiving copy (no reply, or a late
            // one): clear it; a later recovery there replaces it anyway.
            drop_leftover(coord, table, tablet.start_hash, addr).await;
            return Err(Failed::Shard(e));
        }
    };
    let replied_ms = started.elapsed().as_millis() as u64;
    // Commit the new owner if the tablet is still lost from `dead` and the
    // shard's server still lives.
    let guard = coord.meta_lock.lock().await;
    let locked_ms = started.elapsed().as_millis() as u64;
    let (current, alive, version) = {
        let model = coord.model();
        let current = model
            .tables
            .get(&table)
            .and_then(|t| t.tablets.get(index as usize))
            .filter(|t| {
                t.is_orphaned()
                    && t.start_hash == tablet.start_hash
                    && t.end_hash == tablet.end_hash
                    && model.lost_from.get(&(table, index)) == Some(&dead)
            })
            .cloned();
        let alive = model.shard_addr(*server, *shard) == Some(addr.as_str());
        (current, alive, model.map_version + 1)
    };
    let Some(current) = current.filter(|_| alive) else {
        drop(guard);
        drop_leftover(coord, table, tablet.start_hash, addr).await;
        let still_lost = coord.model().lost_from.get(&(table, index)) == Some(&dead);
        return Err(if still_lost && !alive {
            Failed::Shard(format!(
                "its server {server} was declared dead or removed during the recovery"
            ))
        } else if still_lost {
            Failed::Shard("the tablet changed during the recovery".into())
        } else {
            Failed::Gone
        });
    };
    let owned = current.placed(*server, *shard, version);
    let ops = vec![
        Op::PutTablet {
            table,
            index,
            tablet: owned.clone(),
        },
        Op::Counter(MAP_VERSION, version),
    ];
    if let Err(e) = coord.commit(&guard, ops).await {
        drop(guard);
        drop_leftover(coord, table, tablet.start_hash, addr).await;
        return Err(Failed::Shard(format!(
            "committing the new owner: {}",
            e.message
        )));
    }
    drop(guard);
    info!(
        server_id = dead,
        table,
        index,
        to_server = server,
        to_shard = shard,
        map_version = version,
        objects = recovered.0,
        segments = recovered.1,
        bytes = recovered.2,
        reserve_ms,
        replied_ms,
        locked_ms,
        committed_ms = started.elapsed().as_millis() as u64,
        "tablet replayed and its new owner committed"
    );
    Ok((recovered, owned))
}

/// `RecoverTablet` on a connection of its own (it takes long, and a shard
/// answers one connection's requests in order).
async fn call_recover(
    coord: &Coordinator,
    addr: &str,
    request: &Request<'_>,
) -> Result<(u64, u64, u64), String> {
    let conn = tokio::time::timeout(
        CONNECT_TIMEOUT,
        RpcConn::open(addr, coord.shards.credentials()),
    )
    .await
    .map_err(|_| format!("cannot connect to {addr}: timed out after {CONNECT_TIMEOUT:?}"))?
    .map_err(|e| e.to_string())?;
    let reply = conn
        .call_timeout(request, RECOVER_TIMEOUT)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    if !reply.status.is_ok() {
        return Err(format!(
            "refused: {}: {}",
            reply.status,
            reply.error_message()
        ));
    }
    match reply.decode() {
        Ok(Response::Recovered {
            objects,
            segments,
            bytes,
        }) => Ok((objects, segments, bytes)),
        Ok(other) => Err(format!("unexpected reply to RecoverTablet: {other:?}")),
        Err(e) => Err(format!("cannot decode the reply to RecoverTablet: {e}")),
    }
}

/// Best effort: drop a copy of the tablet that serves nothing on `addr`.
async fn drop_leftover(coord: &Coordinator, table: u64, start_hash: u64, addr: &str) {
    let request = Request::DropTablet {
        table,
        start_hash,
        only_if_not_serving: true,
    };
    if let Err(e) = coord.shards.call(addr, &request, CONTROL_TIMEOUT).await {
        warn!(
            table,
            start_hash, addr, "dropping a failed recovery's copy failed: {e}"
        );
    }
}
