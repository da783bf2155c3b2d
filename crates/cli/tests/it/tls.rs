//! TLS with real processes: `insitu up --tls` and standalone roles with
//! `insitu tls init` files. Every hop is TLS (client -> coordinator and
//! shards, coordinator -> servers, server -> coordinator at enlistment,
//! server -> server for replication, tablet moves and recovery), and each
//! is exercised below; a plaintext peer gets no insitu reply on any port; a
//! client trusting another CA is refused; the data is intact throughout.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{cli, free_port, insitu_command, ok, start};
use insitu_client::{BlockingClient, ClientConfig, ClientTls, RpcConn, Token};
use insitu_protocol::Request;

const KEYS: usize = 200;

fn token(path: &Path) -> Token {
    Token::from_file(path).expect("token file")
}

fn tls_config(token: &Token, ca: &Path) -> ClientConfig {
    ClientConfig {
        auth_token: Some(token.clone()),
        tls: Some(ClientTls::from_ca_file(ca).expect("CA file")),
        op_timeout: Duration::from_secs(10),
        ..ClientConfig::default()
    }
}

/// `cli` with `--auth-token-file` and `--tls-ca`.
fn cli_tls(addr: &str, token_file: &Path, ca: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec![
        "--auth-token-file",
        token_file.to_str().expect("utf-8 path"),
        "--tls-ca",
        ca.to_str().expect("utf-8 path"),
    ];
    all.extend_from_slice(args);
    cli(addr, &all)
}

/// A plaintext peer sending valid insitu frames to a TLS port gets no
/// insitu reply: the handshake fails and the connection is closed.
fn plaintext_gets_nothing(addr: &str) {
    common::rt().block_on(async {
        let conn = RpcConn::connect(addr).await.expect("TCP connect");
        let reply = conn
            .call_timeout(&Request::Ping, Duration::from_secs(10))
            .await;
        assert!(
            reply.is_err(),
            "{addr} answered a plaintext Ping: {:?}",
            reply.map(|r| r.status)
        );
    });
}

/// Run `line` in a shell with the tests' `insitu` first on PATH.
fn sh(line: &str) -> (i32, String, String) {
    let bin_dir = Path::new(common::insitu_bin()).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", line])
        .env("PATH", path)
        .env_remove("INSITU_CLUSTER")
        .env_remove("INSITU_AUTH_TOKEN_FILE")
        .env_remove("INSITU_TLS_CA")
        .output()
        .expect("sh");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn up_with_tls_serves_every_port_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let args = common::up_args(2, port, &data, 128, &["--tls"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_up, try_line) = start("up", &args, "try:");
    let ca = std::fs::canonicalize(data.join("tls/ca.pem")).expect("up wrote its CA");
    let token_file = data.join("auth-token");
    let client_token = token(&token_file);

    // The printed command works exactly as printed, and so does its
    // `export` twin.
    let (command, exports) = try_line
        .split_once("try: ")
        .map(|(_, rest)| rest)
        .and_then(|rest| rest.split_once("   (or export "))
        .expect("a try line with an export");
    assert!(command.contains("--tls-ca"), "{try_line}");
    ok(sh(command));
    let exports = exports.trim_end().trim_end_matches(')');
    let listed = ok(sh(&format!("export {exports}; insitu table list")));
    assert!(listed.contains("demo"), "{listed}");

    // TLS + token: writes (each replicated to the other server: R = 1), a
    // tablet move between the servers, reads.
    ok(cli_tls(
        &addr,
        &token_file,
        &ca,
        &["table", "create", "t", "--tablets", "4"],
    ));
    let client = BlockingClient::connect_with(&addr, tls_config(&client_token, &ca)).unwrap();
    common::write_keys(&client, "t", KEYS);
    let info = client.open_table("t").unwrap();
    let servers = client.list_servers().unwrap();
    assert_eq!(servers.len(), 2);
    let target = common::server_without(&servers, &info.tablets[0].addr);
    let moved = ok(cli_tls(
        &addr,
        &token_file,
        &ca,
        &["tablet", "move", "t", "0", &target.to_string()],
    ));
    assert!(moved.contains("moved"), "{moved}");
    common::all_keys_intact(&client, "t", KEYS);

    // The right token without TLS: refused (the port speaks only TLS).
    let plain = ClientConfig {
        auth_token: Some(client_token.clone()),
        op_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    assert!(BlockingClient::connect_with(&addr, plain).is_err());
    let out = common::cli_with_token(&addr, &token_file, &["table", "list"]);
    assert_ne!(out.0, 0, "a plaintext CLI listed tables: {}", out.1);
    assert!(out.2.contains("--tls-ca"), "no hint: {}", out.2);

    // A client that trusts another CA refuses the cluster's certificates.
    let other = dir.path().join("other-tls");
    ok(cli(
        "127.0.0.1:1",
        &[
            "tls",
            "init",
            other.to_str().unwrap(),
            "--host",
            "127.0.0.1",
        ],
    ));
    let out = cli_tls(
        &addr,
        &token_file,
        &other.join("ca.pem"),
        &["table", "list"],
    );
    assert_ne!(out.0, 0, "another CA's client listed tables: {}", out.1);
    assert!(out.2.contains("certificate"), "{}", out.2);
    assert!(
        BlockingClient::connect_with(&addr, tls_config(&client_token, &other.join("ca.pem")))
            .is_err()
    );

    // Plaintext insitu frames reach nothing: coordinator, every shard, every backup service.
    plaintext_gets_nothing(&addr);
    for s in &servers {
        for shard in &s.shard_addrs {
            plaintext_gets_nothing(shard);
        }
        plaintext_gets_nothing(&s.backup_addr);
    }
    common::all_keys_intact(&client, "t", KEYS);
}

#[test]
fn standalone_roles_with_tls_init_files_recover_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let tls_dir = dir.path().join("tls");
    let auth_dir = dir.path().join("auth");
    ok(cli(
        "127.0.0.1:1",
        &[
            "tls",
            "init",
            tls_dir.to_str().unwrap(),
            "--host",
            "127.0.0.1",
        ],
    ));
    ok(cli(
        "127.0.0.1:1",
        &["auth", "init", auth_dir.to_str().unwrap()],
    ));
    let (ca, cert, key) = (
        tls_dir.join("ca.pem"),
        tls_dir.join("cert.pem"),
        tls_dir.join("key.pem"),
    );
    let token_file = auth_dir.join("auth-token");
    let member_file = auth_dir.join("cluster-token");
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let role_flags = vec![
        "--auth-token-file".to_string(),
        path(&token_file),
        "--cluster-token-file".to_string(),
        path(&member_file),
        "--tls-cert".to_string(),
        path(&cert),
        "--tls-key".to_string(),
        path(&key),
        "--tls-ca".to_string(),
        path(&ca),
    ];

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let cdir = dir.path().join("coordinator");
    let mut args = vec![
        "coordinator".to_string(),
        "--port".into(),
        port.to_string(),
        "--dir".into(),
        path(&cdir),
        "--replicas".into(),
        "1".into(),
    ];
    args.extend(role_flags.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_coordinator, _) = start("coordinator", &args, "insitu coordinator at");

    let server_args = |i: usize, flags: &[String]| -> Vec<String> {
        let mut a = vec![
            "server".to_string(),
            "--coordinator".into(),
            addr.clone(),
            "--dir".into(),
            path(&dir.path().join(format!("server-{i}"))),
            "--shards".into(),
            "1".into(),
            "--memory-mb".into(),
            "64".into(),
        ];
        a.extend(flags.iter().cloned());
        a
    };
    let mut servers = Vec::new();
    for i in 0..2 {
        let args = server_args(i, &role_flags);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        servers.push(start("server", &args, "insitu server").0);
    }

    // A certificate without the CA to check its peers with: refused at once.
    let half: Vec<String> = role_flags[..8].to_vec();
    let args = server_args(9, &half);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = insitu_command(&args)
        .env_remove("INSITU_TLS_CA")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without --tls-ca: {err}");
    assert!(err.contains("--tls-cert without --tls-ca"), "{err}");

    ok(cli_tls(
        &addr,
        &token_file,
        &ca,
        &["table", "create", "s", "--tablets", "4"],
    ));
    let client_token = token(&token_file);
    let client = BlockingClient::connect_with(&addr, tls_config(&client_token, &ca)).unwrap();
    common::write_keys(&client, "s", KEYS);
    assert_eq!(
        ok(cli_tls(&addr, &token_file, &ca, &["get", "s", "k7"])),
        "v7\n"
    );

    // A recovery crosses TLS on every hop (coordinator -> server
    // RecoverTablet, server -> the backups' replicas): remove a server and
    // every key comes back.
    let victim = client.list_servers().unwrap()[1].id;
    servers[1].kill();
    ok(cli_tls(
        &addr,
        &token_file,
        &ca,
        &["server", "remove", &victim.to_string()],
    ));
    common::all_keys_intact(&client, "s", KEYS);
}
