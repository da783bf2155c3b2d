//! Recovery of a dead server's tablets.
//!
//! INTERIM VERSION, until recovery from replicas is merged: the dead
//! server's tablets are re-created EMPTY on live shards, as retirement did
//! before (orphaned, then re-homed round-robin over every live shard), and
//! the server is forgotten. The real version recovers each tablet from the
//! replicas on the backups (`RecoverTablet`) and keeps this signature.

use anyhow::anyhow;

use crate::model::{MAP_VERSION, Op};
use crate::service::Coordinator;

/// What a recovery did (the interim version logs its figures itself).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RecoverySummary;

/// Recover every tablet of dead server `dead` onto live shards, then forget
/// it. Idempotent: a server no longer on record has nothing left to recover.
pub(crate) async fn recover_server(
    coord: &Coordinator,
    dead: u64,
) -> anyhow::Result<RecoverySummary> {
    let guard = coord.meta_lock.lock().await;
    let (ops, orphan_version) = {
        let model = coord.model();
        if !model.servers.contains_key(&dead) {
            return Ok(RecoverySummary);
        }
        tracing::warn!(
            server_id = dead,
            tablets = model.tablets_of(dead).len(),
            "no recovery from replicas yet: the dead server's tablets are re-created empty"
        );
        let version = model.map_version + 1;
        let mut ops = model.retire_ops(&[dead], version);
        ops.push(Op::Counter(MAP_VERSION, version));
        (ops, version)
    };
    coord
        .commit(&guard, ops)
        .await
        .map_err(|e| anyhow!("forgetting dead server {dead}: {}", e.message))?;
    let (orphans, slots) = {
        let model = coord.model();
        let slots: Vec<(u64, u32, String)> = model
            .placement_slots()
            .into_iter()
            .filter_map(|(server, shard)| {
                Some((server, shard, model.shard_addr(server, shard)?.to_string()))
            })
            .collect();
        (model.orphaned_tablets(), slots)
    };
    if orphans.is_empty() || slots.is_empty() {
        return Ok(RecoverySummary);
    }
    let version = orphan_version + 1;
    coord
        .commit(&guard, vec![Op::Counter(MAP_VERSION, version)])
        .await
        .map_err(|e| anyhow!("reserving a map version: {}", e.message))?;
    // Failures leave tablets orphaned, re-homed at the next enlistment.
    coord.rehome(&guard, dead, &slots, orphans, version).await;
    Ok(RecoverySummary)
}
