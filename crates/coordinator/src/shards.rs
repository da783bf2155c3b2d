//! Calls from the coordinator to storage shards: one cached `RpcConn` per address.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use insitu_auth::Credentials;
use insitu_client::rpc::RpcConn;
use insitu_protocol::{Request, Status};

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Take / drop / activate a tablet: quick operations on the shard.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);
/// A migration copies a whole tablet; give it time.
pub const MIGRATE_TIMEOUT: Duration = Duration::from_secs(600);

/// Why a call to a shard failed.
#[derive(Debug, Clone)]
pub enum CallError {
    /// No reply: connect failure, closed connection, timeout. The shard may
    /// or may not have acted on the request.
    Transport(String),
    /// The shard replied with an error status: it did not do it.
    Rejected(Status, String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Transport(e) => write!(f, "{e}"),
            CallError::Rejected(status, message) if message.is_empty() => {
                write!(f, "refused: {status}")
            }
            CallError::Rejected(status, message) => write!(f, "refused: {status}: {message}"),
        }
    }
}

/// A new connection to `addr`, bounded by `CONNECT_TIMEOUT`: shared by the
/// cached and the one-off connections so both report a failed connect alike.
async fn connect(addr: &str, member: &Credentials) -> Result<RpcConn, CallError> {
    tokio::time::timeout(CONNECT_TIMEOUT, RpcConn::open(addr, member))
        .await
        .map_err(|_| {
            CallError::Transport(format!(
                "cannot connect to {addr}: timed out after {CONNECT_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| CallError::Transport(e.to_string()))
}

/// Send `request` on `conn` and map the reply to `Ok(())` or the error kind:
/// one place decides what counts as Transport (no reply) vs Rejected.
async fn call_ok(
    conn: &RpcConn,
    addr: &str,
    request: &Request<'_>,
    timeout: Duration,
) -> Result<(), CallError> {
    let reply = conn
        .call_timeout(request, timeout)
        .await
        .map_err(|e| CallError::Transport(format!("{addr}: {e}")))?;
    if reply.status.is_ok() {
        Ok(())
    } else {
        Err(CallError::Rejected(reply.status, reply.error_message()))
    }
}

pub struct ShardPool {
    conns: Mutex<HashMap<String, RpcConn>>,
    /// The cluster credential and TLS trust, presented on every connection
    /// to a server. Shared with the failure detector's ping tasks.
    member: Arc<Credentials>,
}

impl ShardPool {
    pub fn new(member: Credentials) -> ShardPool {
        ShardPool {
            conns: Mutex::default(),
            member: Arc::new(member),
        }
    }

    /// What the coordinator presents to servers.
    pub fn credentials(&self) -> &Arc<Credentials> {
        &self.member
    }

    async fn conn(&self, addr: &str) -> Result<RpcConn, CallError> {
        {
            let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(conn) = conns.get(addr)
                && !conn.is_closed()
            {
                return Ok(conn.clone());
            }
        }
        let conn = connect(addr, &self.member).await?;
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(addr.to_string(), conn.clone());
        Ok(conn)
    }

    /// Call `addr` and expect an Ok reply (whose body is ignored).
    pub async fn call(
        &self,
        addr: &str,
        request: &Request<'_>,
        timeout: Duration,
    ) -> Result<(), CallError> {
        let conn = self.conn(addr).await?;
        call_ok(&conn, addr, request, timeout).await
    }

    /// `ShardStats` of the shard at `addr`, within `timeout`.
    pub async fn shard_stats(
        &self,
        addr: &str,
        timeout: Duration,
    ) -> Result<insitu_protocol::ShardStats, CallError> {
        let conn = self.conn(addr).await?;
        let reply = conn
            .call_timeout(
                &Request::ShardStats {
                    reset_longest_call: false,
                },
                timeout,
            )
            .await
            .map_err(|e| CallError::Transport(format!("{addr}: {e}")))?;
        if !reply.status.is_ok() {
            return Err(CallError::Rejected(reply.status, reply.error_message()));
        }
        match reply.decode() {
            Ok(insitu_protocol::Response::ShardStats(stats)) => Ok(stats),
            Ok(other) => Err(CallError::Transport(format!(
                "{addr}: unexpected reply to ShardStats: {}",
                response_name(&other)
            ))),
            Err(e) => Err(CallError::Transport(format!("{addr}: {e}"))),
        }
    }

    /// Like `call`, on a connection of its own that is closed afterwards: for
    /// a long request (a migration), which would otherwise hold up every
    /// later request to `addr` on the shared connection, since a shard
    /// answers one connection's requests in order.
    pub async fn call_alone(
        &self,
        addr: &str,
        request: &Request<'_>,
        timeout: Duration,
    ) -> Result<(), CallError> {
        let conn = connect(addr, &self.member).await?;
        call_ok(&conn, addr, request, timeout).await
    }

    /// Forget the cached connection to `addr`, if any: the process behind that
    /// address was replaced, and a new request must reach the new one.
    pub fn forget(&self, addr: &str) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(addr);
    }

    /// Forget every connection (their tasks end when the peers close).
    pub fn clear(&self) {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// A reply's kind, for messages.
fn response_name(r: &insitu_protocol::Response<'_>) -> String {
    let text = format!("{r:?}");
    text.split([' ', '(', '{'])
        .next()
        .unwrap_or("?")
        .to_string()
}
