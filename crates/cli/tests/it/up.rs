//! `insitu up`: the embedded cluster answers the CLI and shuts down cleanly.

use crate::common;

use common::{cli, stop_cleanly};

#[test]
fn up_serves_the_cli_and_stops_on_sigterm() {
    let (mut up, line, addr, dir) = common::start_up(2, 256);
    let data = dir.path().join("data");
    assert!(line.contains(&addr), "{line}");
    let (code, out, err) = cli(&addr, &["table", "create", "t", "--tablets", "4"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(cli(&addr, &["put", "t", "k", "v"]).0, 0);
    assert_eq!(cli(&addr, &["get", "t", "k"]).1, "v\n");
    let (code, out, _) = cli(&addr, &["status"]);
    assert!(code == 0 && out.contains("2 servers"), "{out}");

    // SIGTERM: a clean exit with status 0.
    stop_cleanly(&mut up.child);
    assert!(
        data.join("coordinator").exists(),
        "metadata directory created"
    );
}
