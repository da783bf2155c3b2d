//! Who may send what: every listener (storage shard, backup service,
//! coordinator) passes each decoded request through one `Gate` before it
//! reaches anything else.
//!
//! Two secrets, two roles:
//! - the client token (`Role::Client`): data, pushdown, transactions and
//!   the coordinator's metadata requests: everything a user of the store
//!   does;
//! - the cluster credential (`Role::Member`): also the requests only the
//!   cluster's own processes send each other: tablet take/drop/migrate/
//!   activate, migration batches, recovery, replication, enlistment. A client
//!   that could send those could drop a tablet, ship one to any address, or
//!   retire a live server (issue: "Operating insitu safely").
//!
//! A connection's first request must be `Hello` with one of the two; any
//! other first request, or a wrong token, gets `Unauthenticated` and the
//! connection is closed, so an unauthenticated peer never reaches the engine.

use insitu_protocol::{Request, Status};

use insitu_tls::ClientTls;

use crate::{Credentials, Token};

/// What a connection authenticated as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Presented the client token: no cluster-internal requests.
    Client,
    /// Presented the cluster credential (or the cluster has no
    /// authentication): every request.
    Member,
}

/// Per-connection state the gate keeps: the role, once authenticated.
#[derive(Debug, Default)]
pub struct Session {
    /// None until a `Hello` is accepted (with authentication on).
    role: Option<Role>,
}

impl Session {
    pub fn role(&self) -> Option<Role> {
        self.role
    }
}

/// What a listener does with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Serve it.
    Proceed,
    /// It was a `Hello` and was accepted: answer `Welcome { member }`.
    Welcome { member: bool },
    /// Answer the error `status` with `message`; if `close`, then close the
    /// connection (authentication failures: a guesser pays a connection
    /// per guess).
    Refuse {
        status: Status,
        message: String,
        close: bool,
    },
}

/// The secrets a listener accepts. Shared by all connections (cheap to clone).
#[derive(Clone, Debug, Default)]
pub struct Gate {
    /// Accepted for `Role::Client`. None (with `member` None too): the
    /// cluster runs without authentication.
    client: Option<Token>,
    /// Accepted for `Role::Member`.
    member: Option<Token>,
    /// What this process presents when it dials another member: the
    /// cluster credential and the cluster's TLS trust.
    as_member: Credentials,
    /// What it presents where the cluster credential must not go (an
    /// address a client named): the client token, same TLS trust.
    as_client: Credentials,
}

impl Gate {
    /// A gate that lets everything through (`--no-auth`): every connection
    /// is a member, `Hello` is answered `Welcome` whatever its token.
    pub fn open() -> Gate {
        Gate::default()
    }

    /// A gate that requires `client` or `member` on every connection.
    pub fn new(client: Token, member: Token) -> Gate {
        assert!(
            client != member,
            "the client token and the cluster credential must differ, or every client is a member"
        );
        Gate {
            as_member: Credentials::with_token(Some(member.clone())),
            as_client: Credentials::with_token(Some(client.clone())),
            client: Some(client),
            member: Some(member),
        }
    }

    /// Dial peers over TLS, trusting `tls`'s CAs (`--tls-ca`).
    pub fn with_dial_tls(mut self, tls: Option<ClientTls>) -> Gate {
        self.as_member.tls = tls.clone();
        self.as_client.tls = tls;
        self
    }

    /// What this process presents to other members.
    pub fn as_member(&self) -> &Credentials {
        &self.as_member
    }

    /// What this process presents where it must not show the cluster
    /// credential (a transaction's primary, an address a client named).
    pub fn as_client(&self) -> &Credentials {
        &self.as_client
    }

    pub fn requires_auth(&self) -> bool {
        self.client.is_some() || self.member.is_some()
    }

    fn role_of(&self, presented: &[u8]) -> Option<Role> {
        // Both compared every time, so timing says nothing about which matched.
        let member = self.member.as_ref().is_some_and(|t| t.matches(presented));
        let client = self.client.as_ref().is_some_and(|t| t.matches(presented));
        if member {
            Some(Role::Member)
        } else if client {
            Some(Role::Client)
        } else {
            None
        }
    }

    /// Decide `request` on the connection whose state is `session`.
    pub fn admit(&self, session: &mut Session, request: &Request<'_>) -> Admission {
        if !self.requires_auth() {
            return match request {
                Request::Hello { .. } => Admission::Welcome { member: true },
                _ => Admission::Proceed,
            };
        }
        if let Request::Hello { token } = request {
            return match self.role_of(token) {
                Some(role) => {
                    session.role = Some(role);
                    Admission::Welcome {
                        member: role == Role::Member,
                    }
                }
                None => {
                    session.role = None;
                    Admission::Refuse {
                        status: Status::Unauthenticated,
                        message: "authentication failed: the token is not this cluster's \
                                  (check INSITU_AUTH_TOKEN or --auth-token-file); closing"
                            .into(),
                        close: true,
                    }
                }
            };
        }
        match session.role {
            None => Admission::Refuse {
                status: Status::Unauthenticated,
                message: format!(
                    "authentication required: this cluster needs a token before {} \
                     (set INSITU_AUTH_TOKEN or give --auth-token-file); closing",
                    request.name()
                ),
                close: true,
            },
            Some(Role::Client) if is_cluster_internal(request) => Admission::Refuse {
                status: Status::Forbidden,
                message: format!(
                    "{} is a cluster-internal request: it needs the cluster credential, \
                     not a client token",
                    request.name()
                ),
                close: false,
            },
            Some(_) => Admission::Proceed,
        }
    }
}

/// Requests only cluster members send each other. Exhaustive (no `_` arm),
/// so a new request cannot be added without deciding which side it is on.
pub fn is_cluster_internal(request: &Request<'_>) -> bool {
    use Request::*;
    match request {
        TakeTablet { .. }
        | DropTablet { .. }
        | MigrateTablet { .. }
        | MigrateBatch { .. }
        | ActivateTablet { .. }
        | RecoverTablet { .. }
        | ServerDown { .. }
        | BackupWrite { .. }
        | BackupList { .. }
        | BackupRead { .. }
        | BackupForget { .. }
        | MarkLost { .. }
        | Enlist { .. } => true,
        // Transactions' peer requests stay open to clients: a participant
        // asks the owner of an anchor key named in a client's `TxnPrepare`
        // (found through the maps, as a client finds it), so it presents the
        // client token, never the cluster credential. Resolving or
        // inquiring about a transaction is what a client holding the data
        // could cause anyway (by aborting or by going silent).
        Ping
        | Hello { .. }
        | Read { .. }
        | Write { .. }
        | Remove { .. }
        | Increment { .. }
        | MultiRead { .. }
        | SnapshotRead { .. }
        | MultiWrite { .. }
        | MultiRemove { .. }
        | Enumerate { .. }
        | ShardStats { .. }
        | RemoveServer { .. }
        | AckLoss { .. }
        | AcceptLoss { .. }
        | CreateTable { .. }
        | DropTable { .. }
        | CreateIndex { .. }
        | DropIndex { .. }
        | OpenTable { .. }
        | TableMap { .. }
        | ListTables
        | ListServers
        | MoveTablet { .. }
        | Scan { .. }
        | Query { .. }
        | TxnPrepare { .. }
        | TxnDecide { .. }
        | TxnResolve { .. }
        | TxnInquire { .. }
        // A client takes timestamps for its own transactions and snapshots.
        | Timestamps { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_protocol::blob;

    fn tokens() -> (Token, Token) {
        (
            Token::parse(b"client-token-0123456789", "t").unwrap(),
            Token::parse(b"member-token-0123456789", "t").unwrap(),
        )
    }

    fn drop_tablet() -> Request<'static> {
        Request::DropTablet {
            table: 1,
            start_hash: 0,
            only_if_not_serving: false,
        }
    }

    fn read() -> Request<'static> {
        Request::Read {
            table: 1,
            key: blob(b"k"),
        }
    }

    #[test]
    fn an_open_gate_admits_everything_as_a_member() {
        let gate = Gate::open();
        let mut s = Session::default();
        assert_eq!(gate.admit(&mut s, &drop_tablet()), Admission::Proceed);
        let hello = Request::Hello {
            token: blob(b"anything"),
        };
        assert_eq!(
            gate.admit(&mut s, &hello),
            Admission::Welcome { member: true }
        );
    }

    #[test]
    fn without_hello_every_request_is_refused_and_closes() {
        let (c, m) = tokens();
        let gate = Gate::new(c, m);
        for request in [Request::Ping, read(), drop_tablet()] {
            let mut s = Session::default();
            match gate.admit(&mut s, &request) {
                Admission::Refuse {
                    status,
                    close,
                    message,
                } => {
                    assert_eq!(status, Status::Unauthenticated);
                    assert!(close);
                    assert!(message.contains("authentication required"), "{message}");
                }
                other => panic!("{request:?} admitted: {other:?}"),
            }
        }
    }

    #[test]
    fn a_wrong_token_is_refused_and_a_client_cannot_send_control_requests() {
        let (c, m) = tokens();
        let gate = Gate::new(c.clone(), m.clone());
        let mut s = Session::default();
        let wrong = Request::Hello {
            token: blob(b"client-token-0123456788"),
        };
        assert!(matches!(
            gate.admit(&mut s, &wrong),
            Admission::Refuse {
                status: Status::Unauthenticated,
                close: true,
                ..
            }
        ));
        assert_eq!(s.role(), None);

        let hello = Request::Hello {
            token: blob(c.as_bytes()),
        };
        assert_eq!(
            gate.admit(&mut s, &hello),
            Admission::Welcome { member: false }
        );
        assert_eq!(gate.admit(&mut s, &read()), Admission::Proceed);
        let timestamps = Request::Timestamps { count: 1 };
        assert_eq!(gate.admit(&mut s, &timestamps), Admission::Proceed);
        match gate.admit(&mut s, &drop_tablet()) {
            Admission::Refuse {
                status,
                close,
                message,
            } => {
                assert_eq!(status, Status::Forbidden);
                assert!(!close);
                assert!(
                    message.contains("DropTablet is a cluster-internal request"),
                    "{message}"
                );
            }
            other => panic!("control request admitted for a client: {other:?}"),
        }

        let mut s = Session::default();
        let hello = Request::Hello {
            token: blob(m.as_bytes()),
        };
        assert_eq!(
            gate.admit(&mut s, &hello),
            Admission::Welcome { member: true }
        );
        assert_eq!(gate.admit(&mut s, &drop_tablet()), Admission::Proceed);
    }

    #[test]
    fn a_failed_hello_drops_an_earlier_role() {
        let (c, m) = tokens();
        let gate = Gate::new(c, m.clone());
        let mut s = Session::default();
        gate.admit(
            &mut s,
            &Request::Hello {
                token: blob(m.as_bytes()),
            },
        );
        gate.admit(
            &mut s,
            &Request::Hello {
                token: blob(b"nope-nope-nope-nope"),
            },
        );
        assert_eq!(s.role(), None);
        assert!(matches!(
            gate.admit(&mut s, &read()),
            Admission::Refuse { .. }
        ));
    }
}
