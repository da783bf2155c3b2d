//! Where a request goes and how it is retried: the cached tablet maps, one
//! connection per address, the back-off and the retry bookkeeping.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use insitu_auth::Credentials;
use insitu_protocol::{Request, Status, TableInfo, TabletInfo};

use crate::client::{Again, gave_up, since};
use crate::error::ClientError;
use crate::rpc::{Reply, RpcConn};

/// One remote address (a shard or the coordinator) and its cached
/// connections: one for point requests and one for whole-tablet scans and
/// queries. Why two: a server answers a connection's requests in order, so
/// a scan (which may wait, e.g. a snapshot read waiting for a transaction's
/// decision) would hold every request pipelined behind it on the same
/// connection, the decision it waits for included.
pub(crate) struct Endpoint {
    /// "host:port" to connect to.
    pub(crate) addr: String,
    /// Point requests, transactions, metadata.
    point: Lane,
    /// `Scan` and `Query` requests.
    bulk: Lane,
    /// Token (for the `Hello`) and TLS trust of every connection opened.
    credentials: Credentials,
}

/// One cached connection of an endpoint.
#[derive(Default)]
struct Lane {
    /// The live connection, if any. A std mutex: held only to clone or swap,
    /// never across an await, so the hot path pays one uncontended lock.
    conn: Mutex<Option<RpcConn>>,
    /// Serialises (re)connecting so concurrent callers open one socket, not many.
    connecting: tokio::sync::Mutex<()>,
}

impl Lane {
    fn cached(&self) -> Option<RpcConn> {
        match &*self.conn.lock().expect("endpoint conn") {
            Some(c) if !c.is_closed() => Some(c.clone()),
            _ => None,
        }
    }

    fn drop_if_closed(&self) {
        let mut slot = self.conn.lock().expect("endpoint conn");
        if slot.as_ref().is_some_and(|c| c.is_closed()) {
            *slot = None;
        }
    }
}

impl Endpoint {
    fn new(addr: &str, credentials: Credentials) -> Endpoint {
        Endpoint {
            credentials,
            addr: addr.to_string(),
            point: Lane::default(),
            bulk: Lane::default(),
        }
    }

    /// The cached connection for point requests, or a new one if there is
    /// none or it closed.
    pub(crate) async fn conn(&self, deadline: Instant) -> Result<RpcConn, ClientError> {
        self.lane_conn(&self.point, deadline).await
    }

    /// The connection for `request`: the bulk one for scans, queries and
    /// snapshot reads (they may wait for a transaction's decision, which
    /// must not queue behind them on the point connection).
    pub(crate) async fn conn_for(
        &self,
        request: &Request<'_>,
        deadline: Instant,
    ) -> Result<RpcConn, ClientError> {
        match request {
            Request::Scan { .. } | Request::Query { .. } | Request::SnapshotRead { .. } => {
                self.lane_conn(&self.bulk, deadline).await
            }
            _ => self.lane_conn(&self.point, deadline).await,
        }
    }

    async fn lane_conn(&self, lane: &Lane, deadline: Instant) -> Result<RpcConn, ClientError> {
        if let Some(c) = lane.cached() {
            return Ok(c);
        }
        self.connect_slow(lane, deadline).await
    }

    #[cold]
    async fn connect_slow(&self, lane: &Lane, deadline: Instant) -> Result<RpcConn, ClientError> {
        let _guard = lane.connecting.lock().await;
        if let Some(c) = lane.cached() {
            return Ok(c);
        }
        let budget = deadline.saturating_duration_since(Instant::now());
        let conn = match tokio::time::timeout(budget, RpcConn::open(&self.addr, &self.credentials))
            .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(ClientError::from_rpc(&self.addr, e)),
            Err(_) => {
                return Err(ClientError::Timeout {
                    addr: self.addr.clone(),
                    after: budget,
                });
            }
        };
        *lane.conn.lock().expect("endpoint conn") = Some(conn.clone());
        Ok(conn)
    }

    /// Forget the cached connections that have closed (a live one that
    /// another caller opened meanwhile is kept).
    pub(crate) fn drop_if_closed(&self) {
        self.point.drop_if_closed();
        self.bulk.drop_if_closed();
    }
}

/// Endpoints by address, shared by all tables so one shard gets one
/// connection per lane.
#[derive(Default)]
pub(crate) struct EndpointPool {
    /// Address -> endpoint; entries are never removed (an address is small).
    by_addr: RwLock<HashMap<String, Arc<Endpoint>>>,
    /// Every endpoint presents this (the client's token and TLS trust).
    credentials: Credentials,
}

impl EndpointPool {
    pub(crate) fn new(credentials: Credentials) -> EndpointPool {
        EndpointPool {
            by_addr: RwLock::default(),
            credentials,
        }
    }

    pub(crate) fn get(&self, addr: &str) -> Arc<Endpoint> {
        if let Some(e) = self.by_addr.read().expect("endpoint pool").get(addr) {
            return e.clone();
        }
        self.by_addr
            .write()
            .expect("endpoint pool")
            .entry(addr.to_string())
            .or_insert_with(|| Arc::new(Endpoint::new(addr, self.credentials.clone())))
            .clone()
    }
}

/// A table's tablet map, ready for routing.
pub(crate) struct TableRoute {
    /// The map as the coordinator sent it, tablets sorted by `start_hash`.
    pub(crate) info: TableInfo,
    /// `info.tablets[i].start_hash`, contiguous for a cache-friendly binary search.
    starts: Vec<u64>,
    /// `endpoints[i]` serves `info.tablets[i]`.
    endpoints: Vec<Arc<Endpoint>>,
}

impl TableRoute {
    pub(crate) fn new(mut info: TableInfo, pool: &EndpointPool) -> TableRoute {
        info.tablets.sort_by_key(|t| t.start_hash);
        let starts = info.tablets.iter().map(|t| t.start_hash).collect();
        let endpoints = info.tablets.iter().map(|t| pool.get(&t.addr)).collect();
        TableRoute {
            info,
            starts,
            endpoints,
        }
    }

    /// Index of the tablet whose range contains `hash`.
    #[inline]
    pub(crate) fn locate(&self, hash: u64) -> Option<usize> {
        let i = self.starts.partition_point(|&s| s <= hash).checked_sub(1)?;
        (hash <= self.info.tablets[i].end_hash).then_some(i)
    }

    #[inline]
    pub(crate) fn tablet(&self, i: usize) -> &TabletInfo {
        &self.info.tablets[i]
    }

    #[inline]
    pub(crate) fn endpoint(&self, i: usize) -> &Arc<Endpoint> {
        &self.endpoints[i]
    }

    pub(crate) fn map_version(&self) -> u64 {
        self.info.map_version
    }
}

/// Cached tablet maps by table id, and table ids by name.
#[derive(Default)]
pub(crate) struct RouteCache {
    /// Table id -> its routable map. Replaced whole on refresh, so readers
    /// holding an `Arc` keep a consistent snapshot.
    by_id: RwLock<HashMap<u64, Arc<TableRoute>>>,
    /// Table name -> id, filled by `open_table` / `create_table`.
    by_name: RwLock<HashMap<String, u64>>,
}

impl RouteCache {
    #[inline]
    pub(crate) fn get(&self, table: u64) -> Option<Arc<TableRoute>> {
        self.by_id.read().expect("route cache").get(&table).cloned()
    }

    /// Install `info` unless a newer map of the same table is already cached.
    pub(crate) fn install(&self, info: TableInfo, pool: &EndpointPool) -> Arc<TableRoute> {
        let id = info.id;
        let name = info.name.clone();
        let mut by_id = self.by_id.write().expect("route cache");
        let route = match by_id.get(&id) {
            Some(old) if old.map_version() > info.map_version => old.clone(),
            _ => {
                let r = Arc::new(TableRoute::new(info, pool));
                by_id.insert(id, r.clone());
                r
            }
        };
        drop(by_id);
        self.by_name.write().expect("route cache").insert(name, id);
        route
    }

    pub(crate) fn id_of(&self, name: &str) -> Option<u64> {
        self.by_name.read().expect("route cache").get(name).copied()
    }

    pub(crate) fn evict_id(&self, table: u64) {
        let removed = self.by_id.write().expect("route cache").remove(&table);
        if let Some(r) = removed {
            let mut by_name = self.by_name.write().expect("route cache");
            if by_name.get(&r.info.name) == Some(&table) {
                by_name.remove(&r.info.name);
            }
        }
    }

    pub(crate) fn evict_name(&self, name: &str) {
        let id = self.by_name.write().expect("route cache").remove(name);
        if let Some(id) = id {
            self.by_id.write().expect("route cache").remove(&id);
        }
    }
}

/// Exponential back-off: 1 ms doubling to 50 ms.
pub(crate) struct Backoff {
    /// The next sleep.
    next: Duration,
}

impl Backoff {
    pub(crate) const FIRST: Duration = Duration::from_millis(1);
    pub(crate) const MAX: Duration = Duration::from_millis(50);

    pub(crate) fn new() -> Backoff {
        Backoff { next: Self::FIRST }
    }

    /// Sleep the next step (never past `deadline`), then double it.
    pub(crate) async fn wait(&mut self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(self.next.min(left)).await;
        self.next = (self.next * 2).min(Self::MAX);
    }
}

/// The bookkeeping every retry loop shares: attempts, back-off, the deadline.
/// A loop calls `attempt` before each try and `again` after each failed one.
pub(crate) struct Retry {
    /// When the operation began: give-ups and timeouts report time since.
    start: Instant,
    /// When the operation's time budget runs out.
    deadline: Instant,
    /// Tries so far, reported by a give-up.
    attempts: u32,
    /// The sleep between tries.
    backoff: Backoff,
}

impl Retry {
    pub(crate) fn new(deadline: Instant) -> Retry {
        Retry {
            start: Instant::now(),
            deadline,
            attempts: 0,
            backoff: Backoff::new(),
        }
    }

    /// Count the next try; returns its number (1 for the first).
    pub(crate) fn attempt(&mut self) -> u32 {
        self.attempts += 1;
        self.attempts
    }

    /// After a failed try: sleep a back-off step if it asks for one (never
    /// past the deadline); `Err` (a give-up carrying its error) once time is up.
    pub(crate) async fn again(&mut self, again: Again) -> Result<(), ClientError> {
        if again.backoff && Instant::now() < self.deadline {
            self.backoff.wait(self.deadline).await;
        }
        if Instant::now() >= self.deadline {
            return Err(gave_up(self.start, self.attempts, again.err));
        }
        Ok(())
    }

    /// A final error, its timeout reported as the whole operation's time.
    pub(crate) fn fail(&self, e: ClientError) -> ClientError {
        since(self.start, e)
    }
}

/// One request to one endpoint (the coordinator, or a shard for requests
/// not routed by key). Connection failures and `Retry` are retried with
/// back-off until `deadline` when `idempotent`; otherwise only a failure to
/// connect (nothing was sent) is. The reply's status is the caller's to check.
pub(crate) async fn call_endpoint(
    ep: &Endpoint,
    request: &Request<'_>,
    idempotent: bool,
    deadline: Instant,
) -> Result<Reply, ClientError> {
    let mut retry = Retry::new(deadline);
    loop {
        retry.attempt();
        let err = match ep.conn(deadline).await {
            Err(e) if e.is_connection() => e,
            Err(e) => return Err(retry.fail(e)),
            Ok(conn) => match conn
                .call_timeout(request, deadline.saturating_duration_since(Instant::now()))
                .await
            {
                Ok(reply) if reply.status == Status::Retry && idempotent => {
                    ClientError::Status(Status::Retry, reply.error_message())
                }
                Ok(reply) => return Ok(reply),
                Err(e) => {
                    ep.drop_if_closed();
                    let e = ClientError::from_rpc(&ep.addr, e);
                    if !e.is_connection() || !idempotent {
                        return Err(retry.fail(e));
                    }
                    e
                }
            },
        };
        retry.again(Again { err, backoff: true }).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_keyhash::HashRange;

    fn table(ranges: &[HashRange]) -> TableInfo {
        TableInfo {
            id: 3,
            name: "t".into(),
            // Deliberately unsorted: the route sorts.
            tablets: ranges
                .iter()
                .rev()
                .enumerate()
                .map(|(i, r)| TabletInfo {
                    start_hash: r.start,
                    end_hash: r.end,
                    server_id: i as u64,
                    shard: 0,
                    addr: format!("127.0.0.1:{}", 1000 + r.start % 7),
                    map_version: 1,
                    lost_from: 0,
                })
                .collect(),
            map_version: 5,
            schema: None,
            indexes: Vec::new(),
        }
    }

    #[test]
    fn locate_finds_the_covering_tablet() {
        let pool = EndpointPool::new(Credentials::none());
        let ranges = HashRange::split_even(4);
        let route = TableRoute::new(table(&ranges), &pool);
        for r in &ranges {
            for h in [r.start, r.end, r.start + (r.end - r.start) / 2] {
                let i = route.locate(h).expect("covered");
                assert_eq!(route.tablet(i).start_hash, r.start, "hash {h:#x}");
                assert_eq!(route.endpoint(i).addr, route.tablet(i).addr);
            }
        }
    }

    #[test]
    fn locate_reports_gaps() {
        let pool = EndpointPool::new(Credentials::none());
        let route = TableRoute::new(
            table(&[
                HashRange {
                    start: 100,
                    end: 199,
                },
                HashRange {
                    start: 300,
                    end: 399,
                },
            ]),
            &pool,
        );
        assert_eq!(route.locate(99), None);
        assert_eq!(route.locate(200), None);
        assert_eq!(route.locate(400), None);
        assert_eq!(route.locate(u64::MAX), None);
        assert_eq!(route.tablet(route.locate(150).unwrap()).start_hash, 100);
        assert_eq!(route.tablet(route.locate(399).unwrap()).start_hash, 300);
    }

    #[test]
    fn one_endpoint_per_address() {
        let pool = EndpointPool::new(Credentials::none());
        let a = pool.get("127.0.0.1:1");
        let b = pool.get("127.0.0.1:1");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &pool.get("127.0.0.1:2")));
    }

    #[test]
    fn cache_keeps_the_newer_map() {
        let pool = EndpointPool::new(Credentials::none());
        let cache = RouteCache::default();
        let mut newer = table(&HashRange::split_even(2));
        newer.map_version = 9;
        cache.install(newer, &pool);
        let mut older = table(&HashRange::split_even(3));
        older.map_version = 4;
        let kept = cache.install(older, &pool);
        assert_eq!(kept.map_version(), 9);
        assert_eq!(cache.get(3).unwrap().info.tablets.len(), 2);
        assert_eq!(cache.id_of("t"), Some(3));
        cache.evict_name("t");
        assert!(cache.get(3).is_none());
    }
}
