//! The Redis protocol port (`--resp-port`): every shard accepts RESP
//! connections on the same port (`SO_REUSEPORT`, so the kernel spreads
//! connections over the shards), answers keys its own tablets hold straight
//! from its engine, and forwards the rest through the cluster client (one
//! hop to the owner). The commands' meaning is `insitu-resp`'s; this module
//! is the sockets (`conn.rs`) and the data (`store.rs`).

mod cluster;
mod conn;
mod store;
mod tx;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use insitu_auth::{Credentials, Token};
use insitu_client::{Client, ClientConfig, ClientError};
use insitu_protocol::Status;

pub(crate) use conn::serve;

/// Databases `SELECT` accepts (Redis's default).
pub const DATABASES: u32 = 16;

/// Tablets per shard of a Redis database's table.
///
/// Why more than one: a tablet's index keeps 28 bits of each key hash
/// (`insitu_engine` index prefixes, monotone in the hash), and in a
/// slot-placed table the top 14 bits of the hash are the slot. A tablet of
/// S slots so tells the keys of one slot apart by only 2^28 / S prefixes,
/// and keys sharing a hash tag share a slot: `redis-benchmark --cluster`
/// puts every key of a node under one tag, 1.6M keys in one slot of an
/// 8,192-slot tablet, ~50 per prefix, each compared in the log (60 % of the
/// shard's time in the probe). Eight tablets per shard give each 1/8 of
/// the slots and 8x the prefixes per slot: `SET` went from 363,000 to
/// 570,000 requests/s there. The price is a head segment per tablet.
pub const TABLETS_PER_SHARD: usize = 8;

/// Tablets of a new Redis table in a cluster of `shards` shards (at most
/// 1,024, so a table of a large cluster stays a bounded map).
fn tablets_for(shards: usize) -> u32 {
    (shards.max(1) * TABLETS_PER_SHARD).min(1024) as u32
}

/// What the server's RESP port needs, shared by its shards.
#[derive(Clone)]
pub struct RespConfig {
    /// The coordinator the embedded client asks for tables and maps.
    pub coordinator: String,
    /// The insitu table that holds database 0; database n is `{table}.db{n}`.
    pub table: String,
    /// What the embedded client presents to the cluster (the client token
    /// and TLS trust).
    pub credentials: Credentials,
    /// The password `AUTH` takes (the cluster's client token); None: no
    /// authentication.
    pub password: Option<Token>,
    /// The port clients reach (reported by `INFO` and `CONFIG GET port`).
    pub port: u16,
    /// Bounds on one command; the bulk limit is the engine's value limit.
    pub limits: insitu_resp::Limits,
    /// The engine's value limit (`APPEND`/`SETRANGE` may grow a value to it).
    pub max_value_bytes: usize,
    /// The node id cluster clients see (`CLUSTER MYID`): random per server
    /// start, the same on every shard, since a connection may reach any.
    pub node_id: String,
}

/// A fresh node id: 40 hex digits, as Redis's.
pub fn new_node_id() -> String {
    (0..5)
        .map(|_| format!("{:08x}", fastrand::u32(..)))
        .collect()
}

/// A RESP listener handed to a shard.
pub struct RespListen {
    /// Bound with `SO_REUSEPORT` by the server before the shard starts.
    pub listener: std::net::TcpListener,
    pub config: Arc<RespConfig>,
}

/// Bind `shards` listeners on `host:port` sharing the port (0: a free port
/// chosen by the first bind), each already listening and non-blocking.
///
/// `SO_REUSEPORT` would also let another process of the same user bind the
/// port and silently take a share of the connections (another cluster!).
/// So unless `join` says a server of this same process already listens
/// there (`insitu up`'s servers share one port), the port must first be
/// free for an ordinary bind, which fails while anyone listens on it.
pub fn bind(
    host: &str,
    port: u16,
    shards: usize,
    join: bool,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::net::ToSocketAddrs;
    if port != 0 && !join {
        drop(std::net::TcpListener::bind((host, port))?);
    }
    let mut port = port;
    let mut out = Vec::with_capacity(shards);
    for _ in 0..shards {
        let addr = (host, port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{host} resolves to no address")))?;
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        // Every shard listens on the same port; the kernel spreads new
        // connections over them.
        socket.set_reuse_port(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        socket.set_nonblocking(true)?;
        let listener: std::net::TcpListener = socket.into();
        port = listener.local_addr()?.port();
        out.push(listener);
    }
    Ok(out)
}

/// Per-server connection ids (`CLIENT ID`).
static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_client_id() -> u64 {
    NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed)
}

/// One shard's RESP state: the embedded client (made on first use, as the
/// coordinator may not be reachable when the shard starts) and the table ids
/// of the databases seen.
pub struct RespShard {
    pub config: Arc<RespConfig>,
    pub settings: insitu_resp::Settings,
    client: tokio::sync::OnceCell<Client>,
    /// db -> table id, once the table is known to exist.
    tables: RefCell<HashMap<u32, u64>>,
    /// server id -> its RESP port (0: none), asked once per server
    /// (`ShardStats`): where cluster clients are sent. A server that comes
    /// back after being declared dead has a new id, so an entry never goes
    /// stale.
    resp_ports: RefCell<HashMap<u64, u16>>,
}

impl RespShard {
    pub fn new(config: Arc<RespConfig>) -> RespShard {
        let password = config.password.clone();
        let settings = insitu_resp::Settings {
            auth: password
                .map(|t| Box::new(move |p: &[u8]| t.matches(p)) as Box<dyn Fn(&[u8]) -> bool>),
            databases: DATABASES,
            port: config.port,
            node_id: config.node_id.clone(),
        };
        RespShard {
            config,
            settings,
            client: tokio::sync::OnceCell::new(),
            tables: RefCell::new(HashMap::new()),
            resp_ports: RefCell::new(HashMap::new()),
        }
    }

    pub async fn client(&self) -> Result<&Client, ClientError> {
        self.client
            .get_or_try_init(|| async {
                let config = ClientConfig {
                    auth_token: self.config.credentials.token.clone(),
                    tls: self.config.credentials.tls.clone(),
                    // SCAN pages are small (COUNT 10 by default): fetch
                    // little more than a page per step.
                    enumerate_batch_bytes: 64 * 1024,
                    ..ClientConfig::default()
                };
                Client::connect_with(&self.config.coordinator, config).await
            })
            .await
    }

    pub fn table_name(&self, db: u32) -> String {
        match db {
            0 => self.config.table.clone(),
            n => format!("{}.db{n}", self.config.table),
        }
    }

    /// The table of `db` if already known here (no request is made).
    pub fn cached_table(&self, db: u32) -> Option<u64> {
        self.tables.borrow().get(&db).copied()
    }

    /// The table of `db`: None if it does not exist and `create` is false.
    pub async fn table(&self, db: u32, create: bool) -> Result<Option<u64>, ClientError> {
        if let Some(&id) = self.tables.borrow().get(&db) {
            return Ok(Some(id));
        }
        let client = self.client().await?;
        let name = self.table_name(db);
        let id = match client.open_table(&name).await {
            Ok(t) => t.id,
            Err(ClientError::Status(Status::UnknownTable, _)) if !create => return Ok(None),
            Err(ClientError::Status(Status::UnknownTable, _)) => {
                // `TABLETS_PER_SHARD` tablets per shard in the cluster, so
                // keys spread over every core from the start; placed by
                // hash slot, so Redis Cluster clients can be told which
                // server serves a key.
                let shards: usize = client
                    .list_servers()
                    .await?
                    .iter()
                    .map(|s| s.shard_addrs.len())
                    .sum();
                match client
                    .create_table_by_slot(&name, tablets_for(shards))
                    .await
                {
                    Ok(t) => t.id,
                    // Another connection created it first.
                    Err(ClientError::Status(Status::TableExists, _)) => {
                        client.open_table(&name).await?.id
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        self.tables.borrow_mut().insert(db, id);
        Ok(Some(id))
    }

    /// The RESP port of server `server_id`, one of whose shards is at
    /// `shard_addr` (0: it serves none).
    pub async fn resp_port_of(&self, server_id: u64, shard_addr: &str) -> Result<u16, ClientError> {
        if let Some(&port) = self.resp_ports.borrow().get(&server_id) {
            return Ok(port);
        }
        let port = self
            .client()
            .await?
            .shard_stats(shard_addr)
            .await?
            .resp_port;
        self.resp_ports.borrow_mut().insert(server_id, port);
        Ok(port)
    }

    /// Forget `db`'s table id (it was dropped: look it up again).
    pub fn forget(&self, db: u32) {
        self.tables.borrow_mut().remove(&db);
    }
}

#[cfg(test)]
mod tests {
    use super::{TABLETS_PER_SHARD, tablets_for};

    #[test]
    fn a_redis_table_has_tablets_per_shard_up_to_the_cap() {
        assert_eq!(
            tablets_for(0),
            TABLETS_PER_SHARD as u32,
            "no shard listed yet"
        );
        assert_eq!(tablets_for(1), 8);
        assert_eq!(tablets_for(6), 48);
        assert_eq!(tablets_for(128), 1024);
        assert_eq!(tablets_for(100_000), 1024, "a bounded map");
    }
}
