//! The one error type of the client library.

use std::sync::Arc;
use std::time::Duration;

use insitu_protocol::{ProtocolError, Status};

use crate::rpc::RpcError;

/// Why a client operation failed.
///
/// `Clone` so that one failed request of a multi-operation can report the
/// same error for each of its keys (I/O errors are shared behind an `Arc`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The server refused the request (or one object of a multi-operation):
    /// its status and the message it sent (may be empty).
    #[error("{}", status_text(*.0, .1))]
    Status(Status, String),

    /// A TCP connection could not be opened. The I/O error is part of the
    /// message and deliberately not a `source()`: error reporters that print
    /// the chain (`anyhow`'s `{:#}`) would otherwise show it twice.
    #[error("cannot connect to {addr}: {error}")]
    Connect {
        addr: String,
        error: Arc<std::io::Error>,
    },

    /// The connection closed before the reply arrived. For a request that may
    /// have been sent, whether it was applied is unknown.
    #[error("connection to {0} closed before the reply arrived")]
    Closed(String),

    /// No reply within the operation's time budget.
    #[error("no reply from {addr} within {after:.1?}")]
    Timeout { addr: String, after: Duration },

    /// Retries (map refreshes, reconnects, back-offs) did not succeed within
    /// the operation's time budget; `last` is the last error seen.
    #[error("gave up after {after:.1?} and {attempts} attempts; last error: {last}")]
    GaveUp {
        after: Duration,
        attempts: u32,
        last: Box<ClientError>,
    },

    /// One request would not fit a frame (a single item larger than the
    /// frame limit; batches are split by the client and never hit this).
    #[error("request body of {len} bytes exceeds the frame limit of {max} bytes")]
    RequestTooLarge { len: usize, max: usize },

    /// A reply could not be decoded. (In the message, not a `source()`, as
    /// for `Connect`.)
    #[error("protocol error with {addr}: {error}")]
    Protocol {
        addr: String,
        error: Arc<ProtocolError>,
    },

    /// A well-formed reply that does not answer the request that was sent.
    #[error("unexpected reply from {addr}: {what}")]
    Unexpected { addr: String, what: String },

    /// No tablet of the table covers a key's hash even after a map refresh.
    #[error("table {table} has no tablet covering hash {hash:#018x}")]
    NoTablet { table: u64, hash: u64 },

    /// A transaction's commit may or may not have happened: the shard that
    /// decides it did not answer. Not retried (running it again could apply
    /// it twice); read the keys to find out.
    #[error("transaction {txn:#x}: outcome unknown: {why}")]
    TxnOutcomeUnknown { txn: u64, why: String },

    /// The blocking wrapper could not build its runtime.
    #[error("cannot start the client runtime: {0}")]
    Runtime(String),

    /// The client's token (from `INSITU_AUTH_TOKEN` or a file) is not usable.
    #[error("{0}")]
    Token(Arc<insitu_auth::TokenError>),

    /// The client's TLS trust (`INSITU_TLS_CA`, `--tls-ca`) is not usable.
    #[error("{0}")]
    Tls(Arc<insitu_tls::TlsError>),
}

fn status_text(status: Status, message: &str) -> String {
    if message.is_empty() {
        format!("{status} ({status:?})")
    } else {
        format!("{status} ({status:?}): {message}")
    }
}

impl ClientError {
    /// The server status of a `Status` error.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientError::Status(s, _) => Some(*s),
            ClientError::GaveUp { last, .. } => last.status(),
            _ => None,
        }
    }

    /// A connection-level failure: the endpoint may be gone or replaced, so
    /// the right reaction is to drop the connection and refresh the map.
    pub fn is_connection(&self) -> bool {
        matches!(self, ClientError::Connect { .. } | ClientError::Closed(_))
    }

    /// Convert an `RpcError` from a call to `addr`.
    pub(crate) fn from_rpc(addr: &str, e: RpcError) -> ClientError {
        match e {
            RpcError::Connect { addr, source } => ClientError::Connect {
                addr,
                error: Arc::new(source),
            },
            RpcError::Closed(addr) => ClientError::Closed(addr),
            RpcError::Timeout(after) => ClientError::Timeout {
                addr: addr.to_string(),
                after,
            },
            RpcError::Protocol(ProtocolError::FrameTooLarge { len, max }) => {
                ClientError::RequestTooLarge { len, max }
            }
            RpcError::Protocol(source) => ClientError::Protocol {
                addr: addr.to_string(),
                error: Arc::new(source),
            },
            RpcError::Unexpected(what) => ClientError::Unexpected {
                addr: addr.to_string(),
                what,
            },
            RpcError::Refused {
                addr,
                status,
                message,
            } => ClientError::Status(status, format!("{addr}: {message}")),
        }
    }

    pub(crate) fn unexpected(addr: &str, what: impl Into<String>) -> ClientError {
        ClientError::Unexpected {
            addr: addr.to_string(),
            what: what.into(),
        }
    }
}
