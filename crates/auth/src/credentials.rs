//! What a process presents when it dials a peer: a token for the `Hello`
//! (who we are) and the CA it trusts for TLS (who the peer must be).
//! Built once per role and shared by every connection that role opens.

use insitu_tls::ClientTls;

use crate::Token;

/// Environment variable naming the CA file a client trusts (`--tls-ca`).
pub const ENV_TLS_CA: &str = "INSITU_TLS_CA";

#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// Presented in the connection's `Hello`; None: the cluster runs
    /// without authentication.
    pub token: Option<Token>,
    /// Dial with TLS, trusting these CAs; None: plain TCP.
    pub tls: Option<ClientTls>,
}

impl Credentials {
    /// Plain TCP, no token: for clusters without authentication or TLS.
    pub fn none() -> Credentials {
        Credentials::default()
    }

    pub fn with_token(token: Option<Token>) -> Credentials {
        Credentials { token, tls: None }
    }

    /// The TLS trust from `INSITU_TLS_CA`, if set (a path to a PEM file).
    pub fn tls_from_env() -> Option<Result<ClientTls, insitu_tls::TlsError>> {
        let path = std::env::var_os(ENV_TLS_CA).filter(|p| !p.is_empty())?;
        Some(ClientTls::from_ca_file(std::path::Path::new(&path)))
    }
}
