//! The server list a shard's replication chooses backups from: fetched
//! from the coordinator at start, every `refresh_interval`, and whenever a
//! round asks (`want_list`: a failed round, `ServerDown`). A list that
//! shows this server dead fences it.

use std::rc::Rc;
use std::sync::Arc;

use insitu_protocol::{Request, Response, ServerState};

use super::{ClusterIdentity, SendError, connect, with_book};
use crate::shard::ShardState;

/// Fetch the server list at start, every `refresh_interval` (to learn of
/// new servers), and whenever asked (`want_list`: a failed round, `ServerDown`).
pub(super) async fn refresher(state: Rc<ShardState>, identity: Arc<ClusterIdentity>) {
    let interval = state.repl.shared.config.refresh_interval;
    loop {
        refresh_list(&state, &identity).await;
        // A new list may give a waiting round its backups, and suspects'
        // pauses may have run out: let the replicator look.
        state.repl.kick.notify_one();
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = state.repl.want_list.notified() => {}
        }
    }
}

/// Fetch the server list from the coordinator; on failure keep the old one.
async fn refresh_list(state: &ShardState, identity: &ClusterIdentity) {
    let repl = &state.repl;
    let addr: Rc<str> = Rc::from(identity.coordinator.as_str());
    let fetched = async {
        let conn = connect(repl, &addr).await.map_err(|e| match e {
            SendError::Failed(why) => why,
            SendError::Fenced => "fenced".into(),
        })?;
        let reply = conn
            .call_timeout(&Request::ListServers, repl.shared.config.call_timeout)
            .await
            .map_err(|e| e.to_string())?;
        match reply.decode() {
            Ok(Response::Servers(list)) if reply.status.is_ok() => Ok(list),
            _ => Err(format!(
                "ListServers answered {}: {}",
                reply.status,
                reply.error_message()
            )),
        }
    };
    match fetched.await {
        Ok(list) => {
            // Declared dead while it still runs (a stall past the failure
            // timeout): its tablets are being recovered elsewhere, so it must
            // stop serving now. A backup's `Fenced` stops it at its next
            // write; without this, one that only serves reads went on
            // answering clients that still had the old map, for as long as
            // they did not write (seen: both survivors of a recovery declared
            // dead went on answering). This bounds that to one refresh.
            let own = list.iter().find(|s| s.id == identity.server_id);
            if own.is_some_and(|s| s.state == ServerState::Dead) {
                repl.shared.fence(state.index);
                return;
            }
            with_book(repl, |b| b.set_live(identity.server_id, &list));
            // A round in flight stops waiting for a backup that left the list.
            repl.down.notify_waiters();
        }
        Err(why) => {
            repl.conns.borrow_mut().remove(&addr);
            tracing::warn!(
                shard = state.index,
                coordinator = %identity.coordinator,
                "cannot fetch the server list; keeping the last one: {why}"
            );
        }
    }
}
