//! Transport security: TLS (rustls) on every insitu port.
//!
//! - `ServerTls`: what a listener (storage shard, backup service,
//!   coordinator) presents: its certificate chain and key, from PEM files
//!   (`--tls-cert`, `--tls-key`).
//! - `ClientTls`: what a dialer (client, CLI, Python, and a server or the
//!   coordinator dialling each other) trusts: the CA certificate(s) that sign
//!   the cluster's certificates (`--tls-ca`). It verifies the peer's
//!   certificate against the host name or IP address it dialled, so a
//!   certificate must name every address peers use (`--advertise`).
//! - `Stream`: a plain or TLS TCP stream behind one type, so connection code
//!   is written once for both.
//! - `generate`: a fresh CA and a certificate it signs, for `insitu up --tls`
//!   and `insitu tls init`.
//!
//! Authentication of *who* is connecting stays with tokens (`insitu_auth`);
//! TLS keeps them and the data secret and proves the *server's* identity, so
//! a client never hands its token to an impostor.
//!
//! The crypto provider is ring, named explicitly (no process-wide default to
//! install, so libraries and tests cannot race to set one).

pub mod generate;
pub mod stream;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

pub use stream::{ReadHalf, Stream, WriteHalf};

/// The most a PEM file may hold: certificate chains are a few KiB; this
/// refuses a wrong path (a log, a device) before reading it into memory.
pub const MAX_PEM_FILE_BYTES: u64 = 1 << 20;

/// How long a TLS handshake may take before the dialler gives up. A
/// listener uses its own stall timeout, so a peer that opens a socket and
/// sends nothing holds it no longer than a stalled frame would.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is {bytes} bytes; a PEM file may hold at most {MAX_PEM_FILE_BYTES}")]
    TooBig { path: String, bytes: u64 },
    #[error("{path}: not a PEM {what}: {detail}")]
    Pem {
        path: String,
        what: &'static str,
        detail: String,
    },
    #[error("{path}: no {what} found (expected a PEM block)")]
    Empty { path: String, what: &'static str },
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("cannot create a certificate: {0}")]
    Generate(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|source| TlsError::Read {
        path: shown.clone(),
        source,
    })?;
    if meta.len() > MAX_PEM_FILE_BYTES {
        return Err(TlsError::TooBig {
            path: shown,
            bytes: meta.len(),
        });
    }
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: shown,
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.display().to_string(),
            what: "certificate",
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.display().to_string(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// A listener's TLS side. Cheap to clone (the config is shared).
#[derive(Clone)]
pub struct ServerTls {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl ServerTls {
    /// From a PEM certificate chain (leaf first) and its PEM private key.
    pub fn from_files(cert: &Path, key: &Path) -> Result<ServerTls, TlsError> {
        let chain = certificates(cert)?;
        let key_bytes = read_pem(key)?;
        let key_der = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| TlsError::Pem {
            path: key.display().to_string(),
            what: "private key",
            detail: e.to_string(),
        })?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| {
                TlsError::Config(format!(
                    "{} and {} do not make a certificate and its key: {e}",
                    cert.display(),
                    key.display()
                ))
            })?;
        Ok(ServerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Run the server side of the handshake on an accepted socket, giving
    /// up after `timeout` (a peer that never finishes it holds nothing).
    pub async fn accept(&self, tcp: TcpStream, timeout: Duration) -> std::io::Result<Stream> {
        match tokio::time::timeout(timeout, self.acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => Ok(Stream::Server(Box::new(tls))),
            Ok(Err(e)) => Err(std::io::Error::new(
                e.kind(),
                format!("TLS handshake failed (is the peer using TLS, with our CA?): {e}"),
            )),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "TLS handshake not completed within {} ms",
                    timeout.as_millis()
                ),
            )),
        }
    }
}

/// A dialler's TLS side: the CAs it trusts. Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    /// Trust the CA certificate(s) in a PEM file, and nothing else (no
    /// system roots: a cluster's certificates come from its own CA).
    pub fn from_ca_file(ca: &Path) -> Result<ClientTls, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates(ca)? {
            roots.add(cert).map_err(|e| TlsError::Pem {
                path: ca.display().to_string(),
                what: "CA certificate",
                detail: e.to_string(),
            })?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }

    /// Run the client side of the handshake with `addr` ("host:port", the
    /// address that was dialled): the peer's certificate must be signed by
    /// our CA and name `host`.
    pub async fn connect(&self, addr: &str, tcp: TcpStream) -> std::io::Result<Stream> {
        let host = host_of(addr);
        let name = ServerName::try_from(host.to_string()).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{addr}: {host:?} is not a host name or IP address for TLS: {e}"),
            )
        })?;
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.connector.connect(name, tcp)).await {
            Ok(Ok(tls)) => Ok(Stream::Client(Box::new(tls))),
            Ok(Err(e)) => Err(std::io::Error::new(
                e.kind(),
                format!(
                    "TLS handshake with {addr} failed (is it started with --tls-cert, by a \
                     certificate our --tls-ca signed that names {host}?): {e}"
                ),
            )),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "TLS handshake with {addr} not completed within {} s (is it a TLS port?)",
                    HANDSHAKE_TIMEOUT.as_secs()
                ),
            )),
        }
    }
}

/// The host part of "host:port" ("[v6]:port" too), as a certificate names it.
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[cfg(test)]
mod tests;
