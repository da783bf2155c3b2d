//! Authentication with real processes: `insitu up` (on by default) and
//! standalone roles with `insitu auth init` files. A peer without the
//! cluster's token reaches nothing on any port (coordinator, shards, backup
//! services), a client token cannot send cluster-internal requests, and the
//! data is intact afterwards. The cluster's own traffic (tablet creation,
//! replication, a tablet move, a recovery) works with the credential.

use crate::common;

use std::path::Path;

use common::{cli, cli_with_token, free_port, insitu_command, ok, start};
use insitu_client::{BlockingClient, ClientConfig, Credentials, RpcConn, RpcError, Status, Token};
use insitu_protocol::{Request, TabletState, blob};

const KEYS: usize = 200;

/// `insitu server` with one shard and 64 MiB, enlisting with `coordinator`,
/// data in `dir`, then `extra`.
fn server_args(coordinator: &str, dir: &Path, extra: &[&str]) -> Vec<String> {
    let dir = dir.to_str().expect("utf-8 path");
    let base = [
        "server",
        "--coordinator",
        coordinator,
        "--dir",
        dir,
        "--shards",
        "1",
        "--memory-mb",
        "64",
    ];
    base.iter().chain(extra).map(|a| a.to_string()).collect()
}

fn token(path: &Path) -> Token {
    Token::from_file(path).expect("token file")
}

/// `request` on a fresh connection that presents `token` (None: nothing):
/// the reply's status and message.
fn status_of(addr: &str, token: Option<&Token>, request: &Request<'_>) -> (Status, String) {
    common::rt().block_on(async {
        let credentials = Credentials::with_token(token.cloned());
        let conn = RpcConn::open(addr, &credentials).await.expect("connect");
        let reply = conn.call(request).await.expect("a reply");
        (reply.status, reply.error_message())
    })
}

/// After an anonymous request was refused, the peer closed the connection.
fn refused_and_closed(addr: &str, request: &Request<'_>) {
    common::rt().block_on(async {
        let conn = RpcConn::connect(addr).await.expect("connect");
        let reply = conn.call(request).await.expect("a reply");
        assert_eq!(
            reply.status,
            Status::Unauthenticated,
            "{} to {addr} without a token: {}",
            request.name(),
            reply.error_message()
        );
        assert!(
            reply.error_message().contains("authentication required"),
            "{}",
            reply.error_message()
        );
        // The connection is closed: the next call fails.
        let next = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            conn.call(&Request::Ping),
        )
        .await
        .expect("closed, not hanging");
        assert!(
            next.is_err(),
            "{addr} kept serving an unauthenticated connection"
        );
    });
}

/// Control requests a hostile peer would send (issue: one raw `DropTablet`
/// lost keys; `TakeTablet(Receiving)` left keys answering Retry; `Enlist`
/// retired a live server; `MigrateTablet` ships a tablet anywhere).
fn control_requests(table: u64, attacker: &str) -> Vec<Request<'_>> {
    vec![
        Request::DropTablet {
            table,
            start_hash: 0,
            only_if_not_serving: false,
        },
        Request::TakeTablet {
            table,
            start_hash: 0,
            end_hash: u64::MAX / 4,
            map_version: u64::MAX,
            state: TabletState::Receiving,
            migration: 1,
        },
        Request::MigrateTablet {
            table,
            start_hash: 0,
            dest_addr: attacker.to_string(),
            migration: 1,
        },
        Request::ActivateTablet {
            table,
            start_hash: 0,
            map_version: u64::MAX,
            writes: true,
        },
    ]
}

fn all_keys_intact(addr: &str, client_token: &Token, table: &str) {
    let config = ClientConfig {
        auth_token: Some(client_token.clone()),
        ..ClientConfig::default()
    };
    let client = BlockingClient::connect_with(addr, config).expect("connect with the token");
    common::all_keys_intact(&client, table, KEYS);
}

#[test]
fn up_requires_its_token_on_every_port_and_keeps_control_requests_for_members() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _up = common::start_up_with(2, port, &data, &[], "insitu is up");
    let client_file = data.join("auth-token");
    let client_token = token(&client_file);
    let member_token = token(&data.join("cluster-token"));
    assert_ne!(client_token, member_token);

    // The CLI without a token: one clear error naming the way out.
    let err = common::fails(cli(&addr, &["table", "list"]));
    assert!(
        err.contains("authentication required") && err.contains("INSITU_AUTH_TOKEN"),
        "{err}"
    );
    // A wrong token, from the environment.
    let out = std::process::Command::new(common::insitu_bin())
        .args(["table", "list"])
        .env("INSITU_CLUSTER", &addr)
        .env("INSITU_AUTH_TOKEN", "not-the-token-0123456789")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("not this cluster's"),
        "{err}"
    );

    // With the token: the cluster's own traffic works (tablets created on
    // both servers, R = 1 replication, a tablet move between servers).
    ok(cli_with_token(
        &addr,
        &client_file,
        &["table", "create", "t", "--tablets", "4"],
    ));
    let config = ClientConfig {
        auth_token: Some(client_token.clone()),
        ..ClientConfig::default()
    };
    let client = BlockingClient::connect_with(&addr, config).unwrap();
    let info = client.open_table("t").unwrap();
    common::write_keys(&client, "t", KEYS);
    let servers = client.list_servers().unwrap();
    assert_eq!(servers.len(), 2);
    let target = common::server_without(&servers, &info.tablets[0].addr);
    let moved = ok(cli_with_token(
        &addr,
        &client_file,
        &["tablet", "move", "t", "0", &target.to_string()],
    ));
    assert!(moved.contains("moved"), "{moved}");

    let attacker = "127.0.0.1:1";
    let mut shard_ports: Vec<String> = servers.iter().flat_map(|s| s.shard_addrs.clone()).collect();
    shard_ports.sort();
    let backups: Vec<String> = servers.iter().map(|s| s.backup_addr.clone()).collect();
    let backup_requests = |master: u64| {
        vec![
            Request::BackupList {
                cluster: 0,
                master,
                fence: true,
            },
            Request::BackupForget { cluster: 0, master },
        ]
    };

    // Anonymous: every request on every port is refused, and the connection closed.
    let key = b"k1".to_vec();
    let data_requests = [
        Request::Read {
            table: info.id,
            key: blob(&key),
        },
        Request::Write {
            expires_at_ms: 0,
            table: info.id,
            key: blob(&key),
            value: blob(b"overwritten"),
            rules: Default::default(),
        },
        Request::Ping,
    ];
    for shard in &shard_ports {
        for r in data_requests
            .iter()
            .chain(&control_requests(info.id, attacker))
        {
            refused_and_closed(shard, r);
        }
    }
    let enlist = Request::Enlist {
        shard_addrs: vec![shard_ports[0].clone()],
        identity: "intruder".into(),
        replace: true,
        backup_addr: String::new(),
    };
    for r in [
        &enlist,
        &Request::ListTables,
        &Request::DropTable { name: "t".into() },
    ] {
        refused_and_closed(&addr, r);
    }
    for backup in &backups {
        for r in backup_requests(servers[0].id) {
            refused_and_closed(backup, &r);
        }
    }

    // A wrong token is refused when the connection opens.
    let wrong = Token::parse(b"wrong-token-0123456789", "test").unwrap();
    let refused = common::rt().block_on(RpcConn::open(
        &shard_ports[0],
        &Credentials::with_token(Some(wrong)),
    ));
    assert!(
        matches!(
            refused,
            Err(RpcError::Refused {
                status: Status::Unauthenticated,
                ..
            })
        ),
        "{:?}",
        refused.err()
    );

    // The client token: data yes, cluster-internal requests no.
    for shard in &shard_ports {
        for r in control_requests(info.id, attacker) {
            let (status, message) = status_of(shard, Some(&client_token), &r);
            assert_eq!(
                status,
                Status::Forbidden,
                "{} with a client token: {message}",
                r.name()
            );
            assert!(message.contains("cluster-internal"), "{message}");
        }
    }
    let (status, message) = status_of(&addr, Some(&client_token), &enlist);
    assert_eq!(
        status,
        Status::Forbidden,
        "Enlist with a client token: {message}"
    );
    for backup in &backups {
        for r in backup_requests(servers[0].id) {
            let (status, message) = status_of(backup, Some(&client_token), &r);
            assert_eq!(
                status,
                Status::Forbidden,
                "{} with a client token: {message}",
                r.name()
            );
        }
    }
    // The cluster credential is a member's: past the gate (refused, if at
    // all, by the request's own checks, never as Forbidden).
    let (status, _) = status_of(&backups[0], Some(&member_token), &Request::Ping);
    assert_eq!(status, Status::Ok);

    // Nothing above changed the data: every key, every value.
    all_keys_intact(&addr, &client_token, "t");
    let (code, out, _) = cli_with_token(&addr, &client_file, &["status"]);
    assert!(code == 0 && out.contains("2 servers"), "{out}");

    // Recovery with the credential: `restart.rs` (replicas replayed on a
    // restart of `up`) and the standalone test below (a server removed).
}

#[test]
fn standalone_roles_use_auth_init_files_and_a_server_without_them_cannot_join() {
    let dir = tempfile::tempdir().unwrap();
    let auth_dir = dir.path().join("auth");
    let out = ok(cli(
        "127.0.0.1:1",
        &["auth", "init", auth_dir.to_str().unwrap()],
    ));
    assert!(out.contains("wrote"), "{out}");
    let again = ok(cli(
        "127.0.0.1:1",
        &["auth", "init", auth_dir.to_str().unwrap()],
    ));
    assert!(again.contains("kept the existing"), "{again}");
    let client_file = auth_dir.join("auth-token");
    let member_file = auth_dir.join("cluster-token");
    let (client_path, member_path) = (client_file.to_str().unwrap(), member_file.to_str().unwrap());

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let cdir = dir.path().join("coord");
    let (_coordinator, _) = start(
        "coordinator",
        &[
            "coordinator",
            "--port",
            &port.to_string(),
            "--dir",
            cdir.to_str().unwrap(),
            "--replicas",
            "1",
            "--auth-token-file",
            client_path,
            "--cluster-token-file",
            member_path,
        ],
        "insitu coordinator at",
    );
    let mut servers = Vec::new();
    for i in 0..2 {
        let sdir = dir.path().join(format!("server-{i}"));
        let args = server_args(
            &addr,
            &sdir,
            &[
                "--auth-token-file",
                client_path,
                "--cluster-token-file",
                member_path,
            ],
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (server, _) = start("server", &args, "insitu server");
        servers.push(server);
    }
    ok(cli_with_token(
        &addr,
        &client_file,
        &["table", "create", "s", "--tablets", "4"],
    ));
    let client_token = token(&client_file);
    let config = ClientConfig {
        auth_token: Some(client_token.clone()),
        ..ClientConfig::default()
    };
    let client = BlockingClient::connect_with(&addr, config).unwrap();
    common::write_keys(&client, "s", KEYS);
    assert_eq!(
        ok(cli_with_token(&addr, &client_file, &["get", "s", "k7"])),
        "v7\n"
    );

    // A server with no token, and one with another cluster's credential:
    // both refused at enlistment, at once (not retried for minutes).
    let other_dir = dir.path().join("other-auth");
    ok(cli(
        "127.0.0.1:1",
        &["auth", "init", other_dir.to_str().unwrap()],
    ));
    let other_member = other_dir.join("cluster-token");
    for extra in [
        vec!["--no-auth"],
        vec![
            "--auth-token-file",
            client_path,
            "--cluster-token-file",
            other_member.to_str().unwrap(),
        ],
    ] {
        let sdir = dir.path().join(format!("intruder-{}", extra.len()));
        let args = server_args(&addr, &sdir, &extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = std::time::Instant::now();
        let out = insitu_command(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} joined: {err}");
        assert!(
            err.contains("authentication") || err.contains("not this cluster's"),
            "{args:?}: {err}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "retried a refusal"
        );
    }
    let status = ok(cli_with_token(&addr, &client_file, &["status"]));
    assert!(status.contains("2 servers"), "{status}");

    // A recovery needs the credential on every hop (coordinator -> server
    // RecoverTablet, server -> backups BackupList/BackupRead): remove a
    // server and every key is back from its replicas.
    let victim = client.list_servers().unwrap()[1].id;
    servers[1].kill();
    // The coordinator may declare it dead (a refused connection is a death
    // at once), recover its tablets and forget it before the command runs:
    // then the command finds no such server. Either way the recovery ran
    // over authenticated hops, which the keys below show.
    let (code, out, err) = cli_with_token(
        &addr,
        &client_file,
        &["server", "remove", &victim.to_string()],
    );
    assert!(
        code == 0 || err.contains(&format!("no server with id {victim} is on record")),
        "stdout: {out}\nstderr: {err}"
    );
    all_keys_intact(&addr, &client_token, "s");
}
