//! Tokens on the command line: which ones a server role accepts and
//! presents (`RoleAuthArgs`), where `insitu up` keeps its own, the client
//! commands' token, and `insitu auth init`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use insitu_auth::{ENV_CLUSTER_TOKEN, Gate, Token};

use crate::ClusterArg;

/// File names `insitu up` and `insitu auth init` use inside their directory.
pub const AUTH_TOKEN_FILE: &str = "auth-token";
pub const CLUSTER_TOKEN_FILE: &str = "cluster-token";

/// The flags of the roles that run servers (`coordinator`, `server`). The
/// client token's file is the global `--auth-token-file`, shared with the
/// client commands.
#[derive(clap::Args, Debug)]
pub struct RoleAuthArgs {
    /// The cluster credential: what the coordinator and the servers present
    /// to each other; cluster-internal requests (tablet control, replication,
    /// enlistment) are refused without it. Keep it off client machines.
    /// Default: the INSITU_CLUSTER_TOKEN environment variable.
    #[arg(long, value_name = "FILE")]
    cluster_token_file: Option<PathBuf>,
    /// Run without authentication: any process that reaches a port can
    /// read, write and administer the cluster. For throwaway local clusters.
    #[arg(long, conflicts_with = "cluster_token_file")]
    no_auth: bool,
}

/// The banner a cluster without authentication prints at start.
pub fn no_auth_warning() -> &'static str {
    "WARNING: authentication is OFF: any process that can reach these ports can read, \
     write and drop every table and send cluster-internal requests"
}

/// The client token: `--auth-token-file`, else INSITU_AUTH_TOKEN, else the
/// file INSITU_AUTH_TOKEN_FILE names (`Token::client_from_env`: the order
/// the libraries use too), else none.
pub fn client_token(cluster: &ClusterArg) -> anyhow::Result<Option<Token>> {
    if let Some(path) = &cluster.auth_token_file {
        return Ok(Some(Token::from_file(path)?));
    }
    Token::client_from_env()
        .transpose()
        .map_err(anyhow::Error::from)
}

/// The gate of a standalone `insitu coordinator` or `insitu server`.
///
/// Both tokens, or `--no-auth`. With neither the role still starts (so a
/// local experiment needs no set-up) but says loudly that it is open.
pub fn role_gate(args: &RoleAuthArgs, cluster: &ClusterArg) -> anyhow::Result<Gate> {
    if args.no_auth {
        // Through `note`: these roles run under the abort-on-panic hook.
        crate::cluster::note(format_args!("{}", no_auth_warning()));
        return Ok(Gate::open());
    }
    let client = client_token(cluster)?;
    let member = match &args.cluster_token_file {
        Some(path) => Some(Token::from_file(path)?),
        None => Token::from_env(ENV_CLUSTER_TOKEN).transpose()?,
    };
    match (client, member) {
        (Some(client), Some(member)) => {
            anyhow::ensure!(
                client != member,
                "the client token and the cluster credential are the same: \
                 every client could then send cluster-internal requests; use two \
                 different tokens (`insitu auth init DIR` writes both)"
            );
            Ok(Gate::new(client, member))
        }
        (None, None) => {
            crate::cluster::note(format_args!(
                "{} (give --auth-token-file and --cluster-token-file, made by \
                 `insitu auth init DIR`, or pass --no-auth to say this is intended)",
                no_auth_warning()
            ));
            Ok(Gate::open())
        }
        (Some(_), None) => anyhow::bail!(
            "--auth-token-file without the cluster credential: give --cluster-token-file \
             (or INSITU_CLUSTER_TOKEN); servers and the coordinator need both"
        ),
        (None, Some(_)) => anyhow::bail!(
            "the cluster credential without a client token: give --auth-token-file \
             (or INSITU_AUTH_TOKEN); servers and the coordinator need both"
        ),
    }
}

/// Create (or keep) `auth-token` and `cluster-token` in `dir`. Returns the
/// gate and the client token file's absolute path.
pub fn init_dir(dir: &Path) -> anyhow::Result<(Gate, PathBuf, bool)> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let client_path = dir.join(AUTH_TOKEN_FILE);
    let (client, created_client) = Token::load_or_create(&client_path)?;
    let (member, created_member) = Token::load_or_create(&dir.join(CLUSTER_TOKEN_FILE))?;
    anyhow::ensure!(
        client != member,
        "{} and {} hold the same token; delete both and start again",
        client_path.display(),
        dir.join(CLUSTER_TOKEN_FILE).display()
    );
    let absolute = std::fs::canonicalize(&client_path).unwrap_or(client_path);
    Ok((
        Gate::new(client, member),
        absolute,
        created_client || created_member,
    ))
}

#[derive(clap::Subcommand)]
pub enum AuthCmd {
    /// Write a new client token (DIR/auth-token) and cluster credential
    /// (DIR/cluster-token), each readable by this user only; existing files
    /// are kept. Give every machine of the cluster both files; give clients
    /// only the auth-token.
    Init {
        /// Directory for the two files (created if missing).
        dir: PathBuf,
    },
}

pub fn run(cmd: AuthCmd) -> anyhow::Result<()> {
    match cmd {
        AuthCmd::Init { dir } => {
            let (_, client_path, created) = init_dir(&dir)?;
            let verb = if created {
                "wrote"
            } else {
                "kept the existing"
            };
            crate::outln!(
                "{verb} {} and {}",
                client_path.display(),
                client_path.with_file_name(CLUSTER_TOKEN_FILE).display()
            )?;
            Ok(())
        }
    }
}
