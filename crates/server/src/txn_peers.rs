//! How a shard reaches the other participants of a transaction: by anchor
//! key, through the cluster's maps (a tablet moves or is recovered onto
//! another server with its records, so an address would go stale), with a
//! bound on every call. ARCHITECTURE.md, "Transactions".

use insitu_client::rpc::RpcConn;
use insitu_client::{Client, ClientConfig};
use insitu_protocol::txn::{TxnAnchor, TxnId, TxnPhase};
use insitu_protocol::{Request, Response, Status, blob};
use insitu_txn::Anchor;

use crate::shard::ShardState;
use crate::txn::PEER_CALL_TIMEOUT;

/// Why a routed call has no answer.
#[derive(Debug)]
pub(crate) enum Unrouted {
    /// The coordinator says the anchor's table does not exist: it was
    /// dropped, or never made (a broken or hostile client named it). Final:
    /// no shard will ever answer for that anchor, so asking again each sweep
    /// would keep the transaction's keys locked for ever.
    TableGone(String),
    /// Anything else (the coordinator or the peer unreachable, slow, or
    /// refusing): worth asking again later.
    Failed(String),
}

impl From<Unrouted> for String {
    fn from(u: Unrouted) -> String {
        match u {
            Unrouted::TableGone(why) | Unrouted::Failed(why) => why,
        }
    }
}

/// One request to the shard that owns `anchor` now, with a bound on its
/// time. The owner comes from the cluster's maps (refreshed once when the
/// cached one is stale).
///
/// It presents the *client* token, not the cluster credential: the anchor
/// came from a client's `TxnPrepare` and the request is one a client may
/// send, so nothing more than a client's rights is needed.
pub(crate) async fn routed_call(
    state: &ShardState,
    anchor: &Anchor,
    request: &Request<'_>,
) -> Result<Response<'static>, Unrouted> {
    let client = txn_client(state).await.map_err(Unrouted::Failed)?;
    let mut refresh = false;
    loop {
        let addr = match client.owner_of(anchor.table, &anchor.key, refresh).await {
            Ok(addr) => addr,
            Err(e) => {
                let why = format!("cannot find the owner of a transaction's anchor: {e}");
                return Err(match e.status() {
                    Some(Status::UnknownTable) => Unrouted::TableGone(why),
                    _ => Unrouted::Failed(why),
                });
            }
        };
        match peer_call(state, &addr, request).await {
            Err((Some(Status::UnknownTablet), _)) if !refresh => refresh = true,
            Err((_, why)) => return Err(Unrouted::Failed(why)),
            Ok(r) => return Ok(r),
        }
    }
}

/// Ask the owner of `anchor` where `txn` stands (`TxnInquire`): the
/// participant anchored there, or with `part` the part recorded there.
pub(crate) async fn inquire(
    state: &ShardState,
    txn: TxnId,
    anchor: &Anchor,
    part: bool,
) -> Result<TxnPhase, Unrouted> {
    let request = Request::TxnInquire {
        txn,
        anchor: TxnAnchor {
            table: anchor.table,
            key: blob(&anchor.key),
        },
        part,
    };
    match routed_call(state, anchor, &request).await? {
        Response::TxnPhase(p) => Ok(p),
        other => Err(Unrouted::Failed(format!(
            "answered {other:?} to TxnInquire"
        ))),
    }
}

/// The shard's cluster client (see `ShardTxns::client`).
async fn txn_client(state: &ShardState) -> Result<&Client, String> {
    let Some(coordinator) = state.repl.coordinator() else {
        return Err("the cluster is not known yet (not enlisted)".into());
    };
    state
        .txns
        .client
        .get_or_try_init(|| async {
            let credentials = state.gate.as_client();
            let config = ClientConfig {
                auth_token: credentials.token.clone(),
                tls: credentials.tls.clone(),
                op_timeout: PEER_CALL_TIMEOUT,
                ..ClientConfig::default()
            };
            Client::connect_with(&coordinator, config).await
        })
        .await
        .map_err(|e| format!("cannot reach the coordinator at {coordinator}: {e}"))
}

/// One request to another shard, with a bound on its time. Err carries the
/// refusal's status, if it was one.
async fn peer_call(
    state: &ShardState,
    addr: &str,
    request: &Request<'_>,
) -> Result<Response<'static>, (Option<Status>, String)> {
    let call = async {
        let conn = RpcConn::open(addr, state.gate.as_client())
            .await
            .map_err(|e| (None, e.to_string()))?;
        let reply = conn
            .call(request)
            .await
            .map_err(|e| (None, e.to_string()))?;
        if reply.status != Status::Ok {
            return Err((
                Some(reply.status),
                format!("{}: {}", reply.status, reply.error_message()),
            ));
        }
        match reply.decode().map_err(|e| (None, e.to_string()))? {
            Response::TxnPhase(p) => Ok(Response::TxnPhase(p)),
            Response::TxnDecided {
                committed,
                commit_ts,
            } => Ok(Response::TxnDecided {
                committed,
                commit_ts,
            }),
            other => Err((None, format!("unexpected answer {other:?}"))),
        }
    };
    match tokio::time::timeout(PEER_CALL_TIMEOUT, call).await {
        Ok(r) => r.map_err(|(s, e)| (s, format!("participant {addr}: {e}"))),
        Err(_) => Err((
            None,
            format!(
                "participant {addr} did not answer within {} ms",
                PEER_CALL_TIMEOUT.as_millis()
            ),
        )),
    }
}

/// A fresh timestamp from the coordinator's oracle (a commit's, decided
/// here for an orphan or a one-phase commit under snapshot reads; a
/// snapshot floor), through the shard's cluster client.
pub(crate) async fn oracle_timestamp(state: &ShardState) -> Result<u64, String> {
    let client = txn_client(state).await?;
    match tokio::time::timeout(PEER_CALL_TIMEOUT, client.timestamp()).await {
        Ok(Ok(ts)) => Ok(ts),
        Ok(Err(e)) => Err(format!("the timestamp oracle refused: {e}")),
        Err(_) => Err(format!(
            "the timestamp oracle did not answer within {} ms",
            PEER_CALL_TIMEOUT.as_millis()
        )),
    }
}
