//! The server roles keep serving when nobody reads their output: `insitu up
//! | head -1` closes the pipe after the first line, and a banner line
//! written to a closed stdout (or a notice to a closed stderr) must not
//! panic, since a panic aborts the whole process (and with `up`, the
//! whole cluster).

use crate::common;

use std::time::{Duration, Instant};

use common::{Proc, cli, free_port, ok, spawn_with_closed_output, stop_cleanly, up_args};

/// Run `insitu status` against `cluster` until it lists `servers` live
/// servers; fail at once if one of `procs` has died meanwhile.
fn wait_until_serving(cluster: &str, servers: usize, procs: &mut [&mut Proc]) {
    let want = format!(": {servers} servers");
    // Generous: a healthy start takes well under a second.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for p in procs.iter_mut() {
            if let Some(status) = p.child.try_wait().expect("try_wait") {
                panic!("{} died with {status} while its output was closed", p.name);
            }
        }
        let (code, out, _) = cli(cluster, &["status"]);
        if code == 0 && out.contains(&want) {
            return;
        }
        assert!(Instant::now() < deadline, "never served: {out}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A table, a write and a read through the CLI.
fn put_and_get(cluster: &str) {
    ok(cli(cluster, &["table", "create", "t"]));
    ok(cli(cluster, &["put", "t", "k", "v"]));
    assert_eq!(ok(cli(cluster, &["get", "t", "k"])).trim_end(), "v");
}

#[test]
fn up_serves_and_stops_cleanly_with_its_output_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let args = up_args(2, port, &dir.path().join("data"), 128, &["--no-auth"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut up = spawn_with_closed_output("up", &args);
    let cluster = format!("127.0.0.1:{port}");
    wait_until_serving(&cluster, 2, &mut [&mut up]);
    put_and_get(&cluster);
    // "shutting down..." goes to the closed stderr: still a clean exit.
    stop_cleanly(&mut up.child);
}

#[test]
fn coordinator_and_server_serve_and_stop_cleanly_with_their_output_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port().to_string();
    let cluster = format!("127.0.0.1:{port}");
    // The server starts first, so it logs "cannot enlist with the
    // coordinator yet" warnings into its closed stderr before the
    // coordinator is up: a log line that cannot be written must be dropped,
    // not reported with a panicking `eprintln!` (which once aborted it).
    // No auth flags: each role also warns on the closed stderr that it is open.
    let data = dir.path().join("server");
    let mut server = spawn_with_closed_output(
        "server",
        &[
            "server",
            "--coordinator",
            &cluster,
            "--dir",
            data.to_str().unwrap(),
            "--shards",
            "1",
            "--memory-mb",
            "128",
        ],
    );
    // Its retries start at 100 ms and double: 700 ms cover three warnings.
    std::thread::sleep(Duration::from_millis(700));
    if let Some(status) = server.child.try_wait().expect("try_wait") {
        panic!("server died with {status} while it waited for the coordinator");
    }
    let meta = dir.path().join("coordinator");
    let mut coordinator = spawn_with_closed_output(
        "coordinator",
        &[
            "coordinator",
            "--port",
            &port,
            "--dir",
            meta.to_str().unwrap(),
        ],
    );
    wait_until_serving(&cluster, 1, &mut [&mut coordinator, &mut server]);
    put_and_get(&cluster);
    stop_cleanly(&mut server.child);
    stop_cleanly(&mut coordinator.child);
}
