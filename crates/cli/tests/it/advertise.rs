//! `insitu server --host 0.0.0.0 --advertise HOST`: bound on every
//! interface, enlisted (and reached by clients) at the advertised host; a
//! server bound to 0.0.0.0 without --advertise is refused at start.

use crate::common;

use common::{cli, fails, free_port, insitu_command, ok, start, start_coordinator};

#[test]
fn a_server_bound_everywhere_is_reached_at_its_advertised_host() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _coordinator = start_coordinator(dir.path(), port);

    // 0.0.0.0 names no address others can use: refused, with the way out.
    let out = insitu_command(&[
        "server",
        "--coordinator",
        &addr,
        "--host",
        "0.0.0.0",
        "--dir",
        dir.path().join("refused").to_str().unwrap(),
        "--shards",
        "1",
        "--memory-mb",
        "64",
        "--no-auth",
    ])
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--advertise"),
        "{err}"
    );

    let sdir = dir.path().join("server");
    let (_server, _) = start(
        "server",
        &[
            "server",
            "--coordinator",
            &addr,
            "--host",
            "0.0.0.0",
            "--advertise",
            "127.0.0.1",
            "--dir",
            sdir.to_str().unwrap(),
            "--shards",
            "2",
            "--memory-mb",
            "64",
            "--no-auth",
        ],
        "insitu server",
    );
    let client = insitu_client::BlockingClient::connect(&addr).unwrap();
    let servers = client.list_servers().unwrap();
    assert_eq!(servers.len(), 1);
    let s = &servers[0];
    assert_eq!(s.shard_addrs.len(), 2);
    for a in s.shard_addrs.iter().chain([&s.backup_addr]) {
        assert!(
            a.starts_with("127.0.0.1:"),
            "enlisted at {a}, not the advertised host"
        );
    }
    // Clients reach the shards at the advertised addresses.
    ok(cli(&addr, &["table", "create", "t", "--tablets", "4"]));
    ok(cli(&addr, &["put", "t", "k", "v"]));
    assert_eq!(ok(cli(&addr, &["get", "t", "k"])), "v\n");
    let err = fails(cli(&addr, &["get", "t", "absent"]));
    assert!(err.contains("absent"), "{err}");
}
