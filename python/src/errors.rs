//! The exception hierarchy and the mapping from `ClientError` to it.
//!
//! ```text
//! insitu.Error
//!  +-- NotFound         an object a condition required does not exist
//!  +-- UnknownTable     no table of that name (or it was dropped)
//!  +-- Conflict         a conditional write refused (object exists, wrong version), a transaction conflict
//!  |    +-- TableExists create_table of a name already taken
//!  +-- Timeout          no reply, or retries did not succeed, within the timeout
//!  +-- ConnectionError  cannot connect, or the connection dropped
//!  +-- Unavailable      the cluster cannot serve it right now (tablet moving, no servers)
//!  +-- DataLost         no object under the key, but one may have existed: its tablet's objects were lost
//!  +-- OutOfMemory      a server has no room (memory or replica disk)
//!  +-- TooLarge         key, value or request over the protocol's limits
//!  +-- BadRequest       the server refused the request as invalid
//!  |    +-- SqlError    SQL that does not parse or plan (unknown table or column, wrong types)
//!  +-- AuthenticationError  no token, a wrong one, or a client token sent a cluster-internal request
//! ```
//! Each exception carries `status`: the server status name (e.g.
//! `"UnknownTable"`) when the server sent one, else `None`.

use insitu_client::{ClientError, Status};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(
    insitu,
    Error,
    PyException,
    "Base class of every error the insitu client raises."
);
pyo3::create_exception!(
    insitu,
    NotFound,
    Error,
    "An object that the operation's condition required does not exist."
);
pyo3::create_exception!(
    insitu,
    UnknownTable,
    Error,
    "No table of that name (or it was dropped since it was opened)."
);
pyo3::create_exception!(
    insitu,
    Conflict,
    Error,
    "A conditional operation was refused (the object exists, or has another \
     version), or a transaction did not commit because it conflicted: run it again."
);
pyo3::create_exception!(
    insitu,
    TableExists,
    Conflict,
    "create_table of a name that is already taken."
);
pyo3::create_exception!(
    insitu,
    AuthenticationError,
    Error,
    "The cluster refused the connection's token (none given, or not the cluster's; \
     see INSITU_AUTH_TOKEN), or the token may not send that request."
);
pyo3::create_exception!(
    insitu,
    Timeout,
    Error,
    "No reply, or no success after retries, within the client's timeout."
);
pyo3::create_exception!(
    insitu,
    ConnectionError,
    Error,
    "A connection could not be opened or closed before the reply arrived \
     (for a write, whether it was applied is then unknown)."
);
pyo3::create_exception!(
    insitu,
    Unavailable,
    Error,
    "The cluster cannot serve the request right now (a tablet is moving, no \
     servers); retrying later may succeed."
);
pyo3::create_exception!(
    insitu,
    DataLost,
    Error,
    "No object under the key now, but one may have existed: the key's tablet \
     lost its objects with a server that held them in memory only (R = 0). \
     Retrying does not help; `insitu table ack-loss TABLE` acknowledges the loss."
);
pyo3::create_exception!(
    insitu,
    OutOfMemory,
    Error,
    "A server has no room for the data (memory budget or replica disk)."
);
pyo3::create_exception!(
    insitu,
    TooLarge,
    Error,
    "A key, a value or a request exceeds the protocol's limits."
);
pyo3::create_exception!(
    insitu,
    BadRequest,
    Error,
    "The server refused the request as invalid (empty key, not a number, bad plan)."
);
pyo3::create_exception!(
    insitu,
    SqlError,
    BadRequest,
    "SQL that does not parse, or that names an unknown table or column or mixes \
     types (`Client.sql`); the message is the planner's."
);

/// Register every exception class on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("UnknownTable", py.get_type::<UnknownTable>())?;
    m.add("Conflict", py.get_type::<Conflict>())?;
    m.add("TableExists", py.get_type::<TableExists>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("ConnectionError", py.get_type::<ConnectionError>())?;
    m.add("Unavailable", py.get_type::<Unavailable>())?;
    m.add("DataLost", py.get_type::<DataLost>())?;
    m.add("OutOfMemory", py.get_type::<OutOfMemory>())?;
    m.add("TooLarge", py.get_type::<TooLarge>())?;
    m.add("BadRequest", py.get_type::<BadRequest>())?;
    m.add("SqlError", py.get_type::<SqlError>())?;
    m.add("AuthenticationError", py.get_type::<AuthenticationError>())?;
    Ok(())
}

/// The exception for a server status.
fn for_status(status: Status, msg: String) -> PyErr {
    use Status::*;
    match status {
        UnknownTable => self::UnknownTable::new_err(msg),
        TableExists => self::TableExists::new_err(msg),
        ObjectDoesntExist => NotFound::new_err(msg),
        ObjectExists | WrongVersion | Status::Conflict => self::Conflict::new_err(msg),
        OutOfMemory | NoSpace => self::OutOfMemory::new_err(msg),
        KeyTooLarge | ValueTooLarge => TooLarge::new_err(msg),
        BadRequest | EmptyKey | NotANumber => self::BadRequest::new_err(msg),
        Status::DataLost => self::DataLost::new_err(msg),
        Retry | StaleMap | UnknownTablet | NoServers | Fenced | CursorExpired | SnapshotTooOld => {
            Unavailable::new_err(msg)
        }
        Unauthenticated | Forbidden => AuthenticationError::new_err(msg),
        Ok | Internal | Truncated | UnknownServer => Error::new_err(msg),
    }
}

/// The exception class for `e` (without its message's context).
fn classify(e: &ClientError, msg: String) -> PyErr {
    match e {
        ClientError::Status(status, _) => for_status(*status, msg),
        ClientError::Connect { .. } | ClientError::Closed(_) => ConnectionError::new_err(msg),
        ClientError::Timeout { .. } => Timeout::new_err(msg),
        // Out of time while retrying: a connection failure stays one (the
        // server is down), anything else is a timeout.
        ClientError::GaveUp { last, .. } if last.is_connection() => ConnectionError::new_err(msg),
        ClientError::GaveUp { .. } => Timeout::new_err(msg),
        ClientError::RequestTooLarge { .. } => TooLarge::new_err(msg),
        ClientError::Protocol { .. }
        | ClientError::Unexpected { .. }
        | ClientError::NoTablet { .. }
        | ClientError::TxnOutcomeUnknown { .. }
        | ClientError::Runtime(_) => Error::new_err(msg),
        ClientError::Token(_) => AuthenticationError::new_err(msg),
        // An unusable CA file: the caller's configuration, like a bad argument.
        ClientError::Tls(_) => pyo3::exceptions::PyValueError::new_err(msg),
    }
}

/// Convert a client error into its Python exception, with `status` set.
pub fn to_py(py: Python<'_>, e: ClientError) -> PyErr {
    let err = classify(&e, e.to_string());
    let status = e.status().map(|s| format!("{s:?}"));
    // Setting an attribute on a fresh exception object cannot fail in
    // practice; if it did, the exception is still the right one.
    let _ = err.value(py).setattr("status", status);
    err
}
