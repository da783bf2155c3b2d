//! The async `Client`: connecting, and the retry loop every routed request
//! goes through (point operations are in `point`, table administration is in
//! `admin`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use insitu_protocol::{Request, Response, Status, TabletInfo};

use insitu_auth::{Credentials, Token};
use insitu_tls::ClientTls;

use crate::error::ClientError;
use crate::routing::{Endpoint, EndpointPool, Retry, RouteCache, TableRoute, call_endpoint};
use crate::rpc::Reply;

/// A value and its version, as `read` returns it (`None`: no such object).
pub type Found = Option<(Bytes, u64)>;

/// One outcome per item of a multi-operation, in the caller's order.
pub type PerItem<T> = Vec<Result<T, ClientError>>;

/// Tunables of a `Client`.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Total time one operation may take, retries, back-offs, map refreshes
    /// and reconnects included. Past it the operation fails with
    /// `ClientError::GaveUp` (or `Timeout` if a reply never came).
    pub op_timeout: Duration,
    /// How many bytes of objects one `Enumerate` RPC asks a shard for.
    pub enumerate_batch_bytes: u32,
    /// Presented on every connection this client opens (the cluster's
    /// client token); None for a cluster without authentication.
    /// `Client::connect` takes it from the environment (`with_env_token`).
    pub auth_token: Option<Token>,
    /// Dial over TLS, trusting these CAs (`--tls-ca`); None for a cluster
    /// without TLS. `Client::connect` takes it from `INSITU_TLS_CA`.
    pub tls: Option<ClientTls>,
}

impl ClientConfig {
    /// `self` with the token and the TLS trust taken from the environment
    /// where not set already (`with_env_token`, `with_env_tls`).
    pub fn with_env(self) -> Result<ClientConfig, ClientError> {
        self.with_env_token()?.with_env_tls()
    }

    /// `self` with `tls` from `INSITU_TLS_CA` (a CA file) if not set already.
    pub fn with_env_tls(mut self) -> Result<ClientConfig, ClientError> {
        if self.tls.is_none()
            && let Some(tls) = Credentials::tls_from_env()
        {
            self.tls = Some(tls.map_err(|e| ClientError::Tls(Arc::new(e)))?);
        }
        Ok(self)
    }

    /// What every connection of this client presents.
    pub(crate) fn credentials(&self) -> Credentials {
        Credentials {
            token: self.auth_token.clone(),
            tls: self.tls.clone(),
        }
    }

    /// `self` with `auth_token` taken from the environment if it is not set
    /// already: `INSITU_AUTH_TOKEN` (the token), else `INSITU_AUTH_TOKEN_FILE`
    /// (a file holding it). An unusable token is an error.
    pub fn with_env_token(mut self) -> Result<ClientConfig, ClientError> {
        if self.auth_token.is_none()
            && let Some(token) = Token::client_from_env()
        {
            self.auth_token = Some(token.map_err(|e| ClientError::Token(Arc::new(e)))?);
        }
        Ok(self)
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            op_timeout: Duration::from_secs(10),
            enumerate_batch_bytes: 1 << 20,
            auth_token: None,
            tls: None,
        }
    }
}

/// A connection to an insitu cluster. Cheap to clone (clones share the
/// connections and the tablet-map cache); `Send + Sync`.
///
/// # Retry policy
/// Every routed request (point ops, each request of a multi-op, each
/// enumerate step) is retried within `ClientConfig::op_timeout`:
/// - `Status::UnknownTablet` / `StaleMap`: refresh the table's map from the
///   coordinator and retry (the first time at once, later after a back-off);
/// - `Status::Retry` (tablet being moved): back off (1 ms doubling to 50 ms),
///   refresh the map and retry;
/// - connection failure: drop the cached connection, back off, refresh the
///   map and retry on a new connection;
/// - `Status::UnknownTable`: not retried; the cached map is dropped;
/// - any other status: returned as `ClientError::Status(status, message)`.
///
/// All of it within `ClientConfig::op_timeout` (default 10 s); then the
/// operation fails with `ClientError::GaveUp` carrying the last error, or
/// with `ClientError::Timeout` if a reply never came. The hot path of a
/// point operation (map cached, shard answers) does no map refresh and no
/// allocation besides the request buffer and the reply.
///
/// A request that went out on a connection that then dropped may have been
/// applied. Reads and plain (unconditional) writes and removes are retried
/// anyway: a repeated plain write stores the same value again, but it can
/// land after another client's later write to the same key (last writer wins,
/// and the "last" may be the retry). Increments and operations with reject
/// rules are *not* retried after such a failure (repeating them could apply
/// an increment twice or report a spurious conflict): they fail with
/// `ClientError::Closed` and their outcome is unknown.
#[derive(Clone)]
pub struct Client {
    /// Shared state, so clones are one reference count.
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// The coordinator: tables, tablet maps, servers.
    pub(crate) coordinator: Arc<Endpoint>,
    /// One connection per shard address, shared by all tables.
    pub(crate) pool: EndpointPool,
    /// Tablet maps by table id, table ids by name.
    pub(crate) routes: RouteCache,
    /// Time budget and batch sizes.
    pub(crate) config: ClientConfig,
    /// Callers waiting for a timestamp, who share requests (`oracle.rs`).
    pub(crate) timestamps: crate::oracle::Timestamps,
}

/// What a failed attempt asks the retry loop to do.
pub(crate) struct Again {
    /// The error to report if time runs out.
    pub(crate) err: ClientError,
    /// Sleep a back-off step before the next attempt.
    pub(crate) backoff: bool,
}

/// Check a reply's status: `Ok` passes, anything else becomes `ClientError::Status`.
pub(crate) fn check_ok(reply: &Reply) -> Result<(), ClientError> {
    if reply.status == Status::Ok {
        Ok(())
    } else {
        Err(ClientError::Status(reply.status, reply.error_message()))
    }
}

pub(crate) fn decode<'r>(reply: &'r Reply, addr: &str) -> Result<Response<'r>, ClientError> {
    reply.decode().map_err(|e| ClientError::from_rpc(addr, e))
}

/// The error for an operation out of time after `attempts` tries, `last` failing last.
pub(crate) fn gave_up(start: Instant, attempts: u32, last: ClientError) -> ClientError {
    match last {
        // Already a give-up (e.g. of the map refresh): don't nest.
        e @ ClientError::GaveUp { .. } => e,
        last => ClientError::GaveUp {
            after: start.elapsed(),
            attempts,
            last: Box::new(last),
        },
    }
}

/// Report a timeout as the whole operation's time, not the last call's remainder.
pub(crate) fn since(start: Instant, e: ClientError) -> ClientError {
    match e {
        ClientError::Timeout { addr, .. } => ClientError::Timeout {
            addr,
            after: start.elapsed(),
        },
        e => e,
    }
}

impl Client {
    /// Connect to the coordinator at `coordinator_addr` ("host:port"),
    /// presenting the token in `INSITU_AUTH_TOKEN` if it is set, over TLS
    /// if `INSITU_TLS_CA` names a CA file.
    pub async fn connect(coordinator_addr: &str) -> Result<Client, ClientError> {
        Client::connect_with(coordinator_addr, ClientConfig::default().with_env()?).await
    }

    pub async fn connect_with(
        coordinator_addr: &str,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        let pool = EndpointPool::new(config.credentials());
        let coordinator = pool.get(coordinator_addr);
        let deadline = Instant::now() + config.op_timeout;
        coordinator.conn(deadline).await?;
        let client = Client {
            inner: Arc::new(Inner {
                coordinator,
                pool,
                routes: RouteCache::default(),
                config,
                timestamps: Default::default(),
            }),
        };
        // One round trip, so a cluster that refuses this client (no token,
        // or a wrong one) says so here rather than at the first operation.
        let reply = client.coord_call(&Request::Ping, true, deadline).await?;
        check_ok(&reply)?;
        Ok(client)
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    // ---- coordinator ---------------------------------------------------

    /// One request to the coordinator; see `call_endpoint`.
    pub(crate) async fn coord_call(
        &self,
        request: &Request<'_>,
        idempotent: bool,
        deadline: Instant,
    ) -> Result<Reply, ClientError> {
        call_endpoint(&self.inner.coordinator, request, idempotent, deadline).await
    }

    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.inner.config.op_timeout
    }

    /// Fetch table `table`'s map from the coordinator and cache it, unless a
    /// map newer than `seen_version` is already cached (someone refreshed).
    pub(crate) async fn refresh(
        &self,
        table: u64,
        seen_version: u64,
        deadline: Instant,
    ) -> Result<Arc<TableRoute>, ClientError> {
        if let Some(r) = self.inner.routes.get(table)
            && r.map_version() > seen_version
        {
            return Ok(r);
        }
        let reply = self
            .coord_call(&Request::TableMap { table }, true, deadline)
            .await?;
        if reply.status == Status::UnknownTable {
            self.inner.routes.evict_id(table);
        }
        check_ok(&reply)?;
        match decode(&reply, &self.inner.coordinator.addr)? {
            Response::Table(info) => Ok(self.inner.routes.install(info, &self.inner.pool)),
            other => Err(ClientError::unexpected(
                &self.inner.coordinator.addr,
                format!("{other:?} to TableMap"),
            )),
        }
    }

    /// The address of the shard that owns `key` of table `table` (by id),
    /// from the cached map, or a fresh one with `refresh` (after the
    /// address answered `UnknownTablet`). What a server uses to find the
    /// participant a transaction's anchor names.
    pub async fn owner_of(
        &self,
        table: u64,
        key: &[u8],
        refresh: bool,
    ) -> Result<String, ClientError> {
        let deadline = self.deadline();
        if refresh {
            self.forget_map(table);
        }
        let route = self.route(table, deadline).await?;
        let hash = insitu_keyhash::key_hash(table, key);
        let i = route
            .locate(hash)
            .ok_or(ClientError::NoTablet { table, hash })?;
        Ok(route.endpoint(i).addr.clone())
    }

    /// The tablet of `table` holding `key` (its server, shard and address),
    /// from the cached map (fetched if not cached yet). What the Redis port
    /// uses to send a cluster client to a key's server.
    pub async fn tablet_of(
        &self,
        table: u64,
        key: &[u8],
    ) -> Result<insitu_protocol::TabletInfo, ClientError> {
        let route = self.route(table, self.deadline()).await?;
        let hash = insitu_keyhash::key_hash(table, key);
        let i = route
            .locate(hash)
            .ok_or(ClientError::NoTablet { table, hash })?;
        Ok(route.info.tablets[i].clone())
    }

    /// Drop the cached map of `table`: the next request fetches it again.
    pub(crate) fn forget_map(&self, table: u64) {
        self.inner.routes.evict_id(table);
    }

    /// The cached map of `table`, fetched if not cached yet.
    pub(crate) async fn route(
        &self,
        table: u64,
        deadline: Instant,
    ) -> Result<Arc<TableRoute>, ClientError> {
        match self.inner.routes.get(table) {
            Some(r) => Ok(r),
            None => self.refresh(table, 0, deadline).await,
        }
    }

    /// The hash ranges of every tablet of `table` and the map version they
    /// come from: what a whole-table operation fans out over.
    pub(crate) async fn tablet_ranges(
        &self,
        table: u64,
        deadline: Instant,
    ) -> Result<(Vec<(u64, u64)>, u64), ClientError> {
        let route = self.route(table, deadline).await?;
        let ranges = route
            .info
            .tablets
            .iter()
            .map(|t| (t.start_hash, t.end_hash))
            .collect();
        Ok((ranges, route.map_version()))
    }

    /// Whether the error of a map refresh is worth another try.
    pub(crate) fn refresh_error_is_transient(e: &ClientError) -> bool {
        e.is_connection()
            || matches!(e, ClientError::GaveUp { .. } | ClientError::Timeout { .. })
            || e.status() == Some(Status::Retry)
    }

    // ---- routed requests -------------------------------------------------

    /// Send the request `make` builds for the tablet owning `hash` of `table`,
    /// following the retry policy (see `Client`), and hand the first reply
    /// that is neither a routing nor a retry status to `finish`.
    /// `retry_after_send`: whether a request that may have been sent on a
    /// connection that then dropped may be sent again.
    pub(crate) async fn routed<'r, T>(
        &self,
        table: u64,
        hash: u64,
        retry_after_send: bool,
        make: impl Fn(&TabletInfo) -> Request<'r>,
        finish: impl FnOnce(Reply, &TabletInfo, &str) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let deadline = self.deadline();
        let mut retry = Retry::new(deadline);
        let mut seen_version = 0;
        loop {
            let attempts = retry.attempt();
            let again = match self.inner.routes.get(table) {
                None => None,
                Some(route) => {
                    seen_version = route.map_version();
                    match route.locate(hash) {
                        None => Some(Again {
                            err: ClientError::NoTablet { table, hash },
                            backoff: attempts > 1,
                        }),
                        Some(i) => {
                            let ep = route.endpoint(i);
                            let tablet = route.tablet(i);
                            let request = make(tablet);
                            match ep.conn_for(&request, deadline).await {
                                Err(e) if e.is_connection() => Some(Again {
                                    err: e,
                                    backoff: true,
                                }),
                                Err(e) => return Err(retry.fail(e)),
                                Ok(conn) => match conn
                                    .call_timeout(
                                        &request,
                                        deadline.saturating_duration_since(Instant::now()),
                                    )
                                    .await
                                {
                                    Ok(reply) => match reply.status {
                                        Status::UnknownTablet | Status::StaleMap => Some(Again {
                                            err: ClientError::Status(
                                                reply.status,
                                                reply.error_message(),
                                            ),
                                            backoff: attempts > 1,
                                        }),
                                        Status::Retry => Some(Again {
                                            err: ClientError::Status(
                                                Status::Retry,
                                                reply.error_message(),
                                            ),
                                            backoff: true,
                                        }),
                                        Status::UnknownTable => {
                                            self.inner.routes.evict_id(table);
                                            return Err(ClientError::Status(
                                                Status::UnknownTable,
                                                reply.error_message(),
                                            ));
                                        }
                                        _ => return finish(reply, tablet, &ep.addr),
                                    },
                                    Err(e) => {
                                        let e = ClientError::from_rpc(&ep.addr, e);
                                        ep.drop_if_closed();
                                        if !e.is_connection() || !retry_after_send {
                                            return Err(retry.fail(e));
                                        }
                                        Some(Again {
                                            err: e,
                                            backoff: true,
                                        })
                                    }
                                },
                            }
                        }
                    }
                }
            };
            if let Some(again) = again {
                retry.again(again).await?;
            }
            match self.refresh(table, seen_version, deadline).await {
                Ok(_) => {}
                Err(e) if Self::refresh_error_is_transient(&e) => {
                    retry
                        .again(Again {
                            err: e,
                            backoff: true,
                        })
                        .await?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: T) {}

    /// Compile-time: the client and its futures can cross threads (tokio::spawn).
    #[allow(dead_code)]
    fn client_and_futures_are_send(c: Client) {
        send_sync(&c);
        send(c.read(1, b"k"));
        send(c.write(1, b"k", b"v"));
        send(c.increment_i64(1, b"k", 1));
        send(c.multi_read(1, &[b"k"]));
        send(c.multi_write(1, &[(b"k", b"v")]));
        send(c.create_table("t", 1));
        send(c.timestamp());
        let mut cursor = c.enumerate(1);
        send(async move { cursor.next_batch().await });
    }

    #[tokio::test]
    async fn retry_gives_up_at_the_deadline_with_the_last_error() {
        let mut retry = Retry::new(Instant::now() + Duration::from_millis(20));
        // Before the deadline a try without back-off may go again at once.
        assert_eq!(retry.attempt(), 1);
        let again = |backoff| Again {
            err: ClientError::Closed("shard".into()),
            backoff,
        };
        assert!(retry.again(again(false)).await.is_ok());
        let given_up = loop {
            let n = retry.attempt();
            assert!(n < 1000, "back-off must reach the deadline");
            if let Err(e) = retry.again(again(true)).await {
                break (n, e);
            }
        };
        match given_up {
            (n, ClientError::GaveUp { attempts, last, .. }) => {
                assert_eq!(attempts, n);
                assert!(matches!(*last, ClientError::Closed(_)), "{last}");
            }
            (_, other) => panic!("expected a give-up, got {other}"),
        }
    }

    #[test]
    fn status_errors_read_well() {
        let e = ClientError::Status(Status::ObjectExists, "object exists (version 7)".into());
        assert_eq!(
            e.to_string(),
            "object exists (ObjectExists): object exists (version 7)"
        );
        assert_eq!(
            ClientError::Status(Status::Truncated, String::new()).to_string(),
            "not processed: reply full, ask again (Truncated)"
        );
        let g = gave_up(
            Instant::now(),
            3,
            ClientError::Status(Status::Retry, String::new()),
        );
        assert_eq!(g.status(), Some(Status::Retry));
        assert!(g.to_string().contains("3 attempts"), "{g}");
        // Not nested.
        assert!(matches!(
            gave_up(Instant::now(), 9, g),
            ClientError::GaveUp { attempts: 3, .. }
        ));
    }
}
