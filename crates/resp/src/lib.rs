//! The Redis protocol (RESP2 and RESP3) for insitu: commands cut from a
//! client's bytes (`codec`), replies written in the connection's protocol
//! (`reply`), and what each command means over a `Store` (`exec`,
//! `strings`, `expiry`, `keys`). Keys expire as in Redis: the `Store` keeps
//! each key's deadline and hides it once past. Cluster clients discover the
//! store's slot layout, or one node serving every slot, and are redirected
//! (`MOVED`) to a key's node once they learned the layout (`cluster`). The server adapts its shards
//! to `Store`; nothing here knows sockets or insitu's own wire format.

pub mod cluster;
pub mod codec;
pub mod command;
pub mod exec;
mod expiry;
pub mod glob;
mod keys;
pub mod multi;
pub mod reply;
pub mod session;
pub mod store;
mod strings;

pub use codec::{Limits, Parsed, ProtocolError, parse};
pub use exec::{execute, prefetch};
pub use reply::Proto;
pub use session::{Session, Settings};
pub use store::{
    ClusterNode, Commit, Cond, ExpiringKeys, MemStore, MemTx, Put, Rewrite, ScanPage, Store,
    StoreError, Transactional, Versioned,
};

#[cfg(test)]
mod tests;
