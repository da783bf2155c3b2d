//! Dead servers through the CLI, with real processes: a killed server is
//! found dead by the coordinator's pings and its tablets go to the live
//! server; `insitu server remove ID`; `insitu status` shows server states and
//! the tablets waiting for recovery. Waits poll for a state (never a timing).

use crate::common;

use common::Cluster;

#[test]
fn killed_and_removed_servers_in_status() {
    let mut cluster = Cluster::start(2, 1);
    let (code, out, err) = cluster.cli(&["table", "create", "t", "--tablets", "4"]);
    assert_eq!(code, 0, "{out}{err}");
    let out = cluster.status_until("two live servers", |o| o.contains(": 2 servers"));
    assert!(out.contains(" up "), "{out}");

    // Server 1's process is killed: declared dead, its tablets recovered onto
    // server 2 (for now re-created empty), and it is forgotten.
    cluster.servers[0].kill();
    let out = cluster.status_until("server 1 gone", |o| {
        o.contains(": 1 servers") && !o.contains("waiting for recovery")
    });
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("2 up")),
        "{out}"
    );
    let (code, out, err) = cluster.cli(&["put", "t", "k", "v"]);
    assert_eq!(code, 0, "{out}{err}");

    // An unknown id is refused, naming it.
    let (code, out, err) = cluster.cli(&["server", "remove", "99"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("no server with id 99"), "{err}");

    // The operator removes the last live server: dead at once; with no live
    // server left, every tablet waits for recovery.
    let (code, out, err) = cluster.cli(&["server", "remove", "2"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("server 2 declared dead"), "{out}");
    let (code, out, err) = cluster.cli(&["status"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(": 0 servers (1 dead)"), "{out}");
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("2 dead")),
        "{out}"
    );
    assert!(out.contains("4 tablets waiting for recovery"), "{out}");
    assert!(
        out.contains("table \"t\": tablets 0 (server 2), 1 (server 2)"),
        "{out}"
    );
}
