//! What one RESP connection remembers between commands, and what the server
//! tells every connection.

use bytes::Bytes;

use crate::reply::Proto;

/// Checks an `AUTH` password (constant time, by the token's own compare).
pub type PasswordCheck = Box<dyn Fn(&[u8]) -> bool>;

/// Settings shared by every connection of a server.
pub struct Settings {
    /// Checks an `AUTH` password; None: authentication is off.
    pub auth: Option<PasswordCheck>,
    /// How many databases `SELECT` accepts (Redis's default is 16).
    pub databases: u32,
    /// The port clients reach (for `INFO` and `CONFIG GET port`).
    pub port: u16,
    /// This server's node id for cluster clients (`CLUSTER MYID`): 40 hex
    /// digits, stable while the server runs.
    pub node_id: String,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            auth: None,
            databases: 16,
            port: 0,
            node_id: "0".repeat(40),
        }
    }
}

/// One connection's state.
#[derive(Debug, Default)]
pub struct Session {
    /// The selected database (`SELECT`).
    pub db: u32,
    /// RESP2 until `HELLO 3`.
    pub proto: Proto,
    /// Whether `AUTH` (or `HELLO ... AUTH`) succeeded; ignored with auth off.
    pub authenticated: bool,
    /// `CLIENT SETNAME`.
    pub name: Option<Bytes>,
    /// `CLIENT ID`: unique per server process.
    pub id: u64,
    /// The (ip, port) this connection reached: the node `CLUSTER SLOTS`
    /// and friends describe (None: the settings' port, no ip).
    pub local: Option<(String, u16)>,
    /// The client asked for the cluster layout (`CLUSTER SLOTS | SHARDS |
    /// NODES`, `READONLY`, `ASKING`): a cluster client, which follows
    /// `MOVED`. Keys of other nodes are redirected only on such a
    /// connection; a plain client has them forwarded.
    pub cluster: bool,
    /// Set by `QUIT`: the connection closes after this reply.
    pub closing: bool,
    /// Commands queued since `MULTI` (None: not in a transaction).
    pub queued: Option<Vec<Vec<Bytes>>>,
    /// A command refused while queueing: `EXEC` answers `EXECABORT`.
    pub queue_failed: bool,
    /// `WATCH`ed keys: (db, key, version seen; 0 = absent). `EXEC` runs
    /// only if every one is unchanged.
    pub watched: Vec<(u32, Bytes, u64)>,
}

impl Session {
    pub fn new(id: u64) -> Session {
        Session {
            id,
            ..Session::default()
        }
    }
}
