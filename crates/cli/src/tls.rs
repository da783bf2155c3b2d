//! TLS on the command line: the roles' certificate and key (`RoleTlsArgs`),
//! the CA everyone dials with (the global `--tls-ca`), where `insitu up
//! --tls` keeps its own files, and `insitu tls init`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use insitu_tls::generate::{self, TlsFiles};
use insitu_tls::{ClientTls, ServerTls};

use crate::ClusterArg;

/// Where `insitu up --tls` keeps its CA and certificate, under its --dir.
pub const UP_TLS_DIR: &str = "tls";

/// The hosts `insitu up --tls` and `insitu tls init` (by default) name.
pub const LOOPBACK_HOSTS: [&str; 2] = ["localhost", "127.0.0.1"];

/// The flags of the roles that listen (`coordinator`, `server`). The CA
/// they dial each other with is the global `--tls-ca`.
#[derive(clap::Args, Debug)]
pub struct RoleTlsArgs {
    /// Serve TLS on every port of this process with this PEM certificate
    /// chain (leaf first). It must name every address clients and the other
    /// processes dial (--host / --advertise). Needs --tls-key and --tls-ca.
    /// `insitu tls init DIR` makes a CA and a certificate.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

/// The CA the client commands (and roles, to dial each other) trust:
/// `--tls-ca` or INSITU_TLS_CA; None: plain TCP.
pub fn client_tls(cluster: &ClusterArg) -> anyhow::Result<Option<ClientTls>> {
    cluster
        .tls_ca
        .as_deref()
        .map(ClientTls::from_ca_file)
        .transpose()
        .context("--tls-ca")
}

/// A standalone role's TLS: what it serves with and what it dials with.
/// All three files or none: a process that served TLS but dialled its
/// peers in plain TCP (or the reverse) could not talk to them.
pub fn role_tls(
    args: &RoleTlsArgs,
    cluster: &ClusterArg,
) -> anyhow::Result<(Option<ServerTls>, Option<ClientTls>)> {
    let dial = client_tls(cluster)?;
    match (&args.tls_cert, &args.tls_key, dial) {
        (Some(cert), Some(key), Some(dial)) => Ok((
            Some(ServerTls::from_files(cert, key).context("--tls-cert/--tls-key")?),
            Some(dial),
        )),
        (None, None, None) => Ok((None, None)),
        (Some(_), _, None) => anyhow::bail!(
            "--tls-cert without --tls-ca: this process also dials the coordinator and the \
             other servers, and must verify their certificates; give --tls-ca (or INSITU_TLS_CA)"
        ),
        (None, _, Some(_)) => anyhow::bail!(
            "--tls-ca (or INSITU_TLS_CA) without --tls-cert: the other processes of a TLS \
             cluster could not reach this one; give --tls-cert and --tls-key, or unset the CA"
        ),
        (Some(_), None, _) | (None, Some(_), _) => {
            anyhow::bail!("--tls-cert and --tls-key go together")
        }
    }
}

/// `insitu up --tls`: its files under DIR/tls, made on first start and kept.
pub fn up_files(dir: &Path) -> anyhow::Result<(ServerTls, ClientTls, TlsFiles)> {
    let hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
    let (files, _) = generate::load_or_create(&dir.join(UP_TLS_DIR), &hosts)?;
    let ca = std::fs::canonicalize(&files.ca).unwrap_or(files.ca.clone());
    let files = TlsFiles { ca, ..files };
    Ok((
        ServerTls::from_files(&files.cert, &files.key)?,
        ClientTls::from_ca_file(&files.ca)?,
        files,
    ))
}

#[derive(clap::Subcommand)]
pub enum TlsCmd {
    /// Write a new CA (DIR/ca.pem) and a certificate it signs (DIR/cert.pem,
    /// key DIR/key.pem, readable by this user only) that names every --host.
    /// Give every machine of the cluster all three (--tls-ca, --tls-cert,
    /// --tls-key); give clients only ca.pem (--tls-ca). Existing files are
    /// replaced. The CA's own key is not kept: to add a host, run it again
    /// and restart the cluster with the new files.
    Init {
        /// Directory for the files (created if missing).
        dir: PathBuf,
        /// A host name or IP address the certificate names; repeat for
        /// each address clients and servers dial.
        #[arg(long = "host", value_name = "HOST", default_values_t = LOOPBACK_HOSTS.map(String::from))]
        hosts: Vec<String>,
    },
}

pub fn run(cmd: TlsCmd) -> anyhow::Result<()> {
    match cmd {
        TlsCmd::Init { dir, hosts } => {
            let files = generate::create(&dir, &hosts)?;
            crate::outln!(
                "wrote {}, {} and {} for {}",
                files.ca.display(),
                files.cert.display(),
                files.key.display(),
                hosts.join(", ")
            )?;
            Ok(())
        }
    }
}
