//! Authentication: the secrets (`token`) and who may send which request
//! (`gate`). Listeners call `Gate::admit` on every decoded request; the
//! client presents its token in a `Hello` when it opens a connection
//! (`credentials`: the token and the TLS trust a dialler uses).

pub mod credentials;
pub mod gate;
pub mod token;

pub use credentials::{Credentials, ENV_TLS_CA};
pub use gate::{Admission, Gate, Role, Session, is_cluster_internal};
pub use token::{ENV_AUTH_TOKEN, ENV_AUTH_TOKEN_FILE, ENV_CLUSTER_TOKEN, Token, TokenError};
