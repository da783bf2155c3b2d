//! The CLI as a user meets it: `--cluster` before or after the command,
//! closed pipes, values from stdin or a file, a load that fails part-way,
//! and the errors of common mistakes.

use crate::common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use common::{Proc, cli, free_port, insitu_bin};

/// An `insitu up` (default server count, small memory) on a free port.
fn start_up() -> (Proc, String, tempfile::TempDir) {
    let (up, _, addr, dir) = common::start_up(2, 128);
    (up, addr, dir)
}

/// Run `insitu ARGS` with no INSITU_CLUSTER (only what the arguments say).
fn bare(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(insitu_bin())
        .args(args)
        .env_remove("INSITU_CLUSTER")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cluster_flag_works_before_and_after_the_command() {
    let (_up, addr, _dir) = start_up();
    let (code, out, err) = bare(&["--cluster", &addr, "table", "create", "a", "--tablets", "2"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = bare(&["table", "create", "b", "--cluster", &addr]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = bare(&["table", "--cluster", &addr, "list"]);
    assert!(
        code == 0 && out.contains("a\t") && out.contains("b\t"),
        "{out}{err}"
    );
    assert_eq!(bare(&["--cluster", &addr, "put", "a", "k", "v"]).0, 0);
    assert_eq!(bare(&["--cluster", &addr, "get", "a", "k"]).1, "v\n");
    // A deadline: the key is there, then gone; a zero TTL is refused.
    let (code, out, err) = bare(&["--cluster", &addr, "put", "a", "brief", "v", "--ttl", "1"]);
    assert!(code == 0 && out.contains("expires in 1 s"), "{out}{err}");
    assert_eq!(bare(&["--cluster", &addr, "get", "a", "brief"]).1, "v\n");
    let (code, _, err) = bare(&["--cluster", &addr, "put", "a", "k", "v", "--ttl", "0"]);
    assert!(code != 0 && err.contains("--ttl"), "{err}");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (code, _, err) = bare(&["--cluster", &addr, "get", "a", "brief"]);
    assert!(code != 0 && err.contains("brief"), "{err}");
    let (code, out, err) = bare(&["--cluster", &addr, "count", "a"]);
    assert!(code == 0 && out == "1\n", "{out}{err}");
    // The explicit flag wins over the environment.
    let (code, out, _) = cli("127.0.0.1:1", &["--cluster", &addr, "get", "a", "k"]);
    assert!(code == 0 && out == "v\n", "{out}");
}

#[test]
fn cluster_flag_is_refused_by_the_server_roles() {
    let (code, _, err) = bare(&["up", "--cluster", "127.0.0.1:1", "--port", "0"]);
    assert!(code == 1 && err.contains("--port"), "{err}");
    let (code, _, err) = bare(&["--cluster", "127.0.0.1:1", "server"]);
    assert!(code == 1 && err.contains("--coordinator"), "{err}");
}

/// Start `insitu ARGS` with stdout a pipe whose reader is already closed.
fn with_closed_stdout(addr: &str, args: &[&str]) -> std::process::Output {
    let mut child = Command::new(insitu_bin())
        .args(args)
        .env("INSITU_CLUSTER", addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Our end of the pipe is the only reader: with it closed, the command's
    // first write fails with EPIPE (the command connects before it prints).
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_stdout_ends_printing_commands_quietly() {
    let (_up, addr, _dir) = start_up();
    assert_eq!(cli(&addr, &["table", "create", "t", "--tablets", "2"]).0, 0);
    for i in 0..50 {
        assert_eq!(cli(&addr, &["put", "t", &format!("k{i}"), "v"]).0, 0);
    }
    let commands: [&[&str]; 6] = [
        &["status"],
        &["table", "list"],
        &["scan", "t"],
        &["get", "t", "k1"],
        &["count", "t"],
        &["put", "t", "k", "v"],
    ];
    for args in commands {
        let out = with_closed_stdout(&addr, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "insitu {args:?}: {err}");
        assert!(err.is_empty(), "insitu {args:?} wrote to stderr: {err}");
    }
    // `insitu status | head -c1`: a reader that takes one byte and leaves.
    let mut child = Command::new(insitu_bin())
        .args(["scan", "t"])
        .env("INSITU_CLUSTER", &addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut one = [0u8; 1];
    stdout.read_exact(&mut one).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(0) && !err.contains("panicked"),
        "{:?} {err}",
        out.status
    );
}

/// 512 KiB of printable bytes (no newline, so `get` adds exactly one).
fn big_value() -> Vec<u8> {
    (0..512 * 1024u32).map(|i| b'a' + (i % 26) as u8).collect()
}

#[test]
fn put_reads_a_large_value_from_stdin_or_a_file() {
    let (_up, addr, dir) = start_up();
    assert_eq!(cli(&addr, &["table", "create", "t"]).0, 0);
    let value = big_value();

    let mut child = Command::new(insitu_bin())
        .args(["put", "t", "from-stdin", "-"])
        .env("INSITU_CLUSTER", &addr)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let to_write = value.clone();
    let writer = std::thread::spawn(move || stdin.write_all(&to_write));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let path = dir.path().join("value.bin");
    std::fs::write(&path, &value).unwrap();
    let (code, out, err) = cli(
        &addr,
        &["put", "t", "from-file", "--file", path.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{out}{err}");

    for key in ["from-stdin", "from-file"] {
        let out = Command::new(insitu_bin())
            .args(["get", "t", key])
            .env("INSITU_CLUSTER", &addr)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout.len(), value.len() + 1, "{key}");
        assert_eq!(&out.stdout[..value.len()], &value[..], "{key}");
    }

    // A value and --file together: refused, nothing written.
    let (code, _, err) = cli(
        &addr,
        &["put", "t", "both", "v", "--file", path.to_str().unwrap()],
    );
    assert!(code == 2 && err.contains("--file"), "{err}");
    let (code, _, err) = cli(&addr, &["put", "t", "none"]);
    assert!(code == 2 && err.contains("VALUE"), "{err}");
    let (code, _, err) = cli(&addr, &["put", "t", "k", "--file", "/no/such/file"]);
    assert!(code == 1 && err.contains("/no/such/file"), "{err}");
    assert_eq!(cli(&addr, &["get", "t", "both"]).0, 1);
}

#[test]
fn a_load_that_fails_part_way_says_how_far_it_got() {
    let (_up, addr, dir) = start_up();
    assert_eq!(cli(&addr, &["table", "create", "t", "--tablets", "2"]).0, 0);
    // Batches of 2: lines 1-2, 3-4, then 5 and the oversized value of line 6
    // (over the servers' 1 MiB value limit); lines 7-8 are never read.
    let mut csv = String::new();
    for i in 1..=5 {
        csv.push_str(&format!("k{i},v{i}\n"));
    }
    csv.push_str(&format!("huge,{}\n", "x".repeat(1100 * 1024)));
    csv.push_str("k7,v7\nk8,v8\n");
    let path = dir.path().join("in.csv");
    std::fs::write(&path, csv).unwrap();
    let (code, out, err) = cli(
        &addr,
        &["load", "t", path.to_str().unwrap(), "--batch", "2"],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("batch 3"), "{err}");
    assert!(err.contains("line 6"), "{err}");
    assert!(err.contains("\"huge\""), "{err}");
    assert!(
        err.contains("5 objects were written (1 of them from this batch)"),
        "{err}"
    );
    assert_eq!(cli(&addr, &["count", "t"]).1, "5\n");

    // A line that does not parse: what was written before it is reported.
    std::fs::write(&path, "a,1\nb,2\nc,3\nnot-a-pair\n").unwrap();
    let (code, _, err) = cli(
        &addr,
        &["load", "t", path.to_str().unwrap(), "--batch", "2"],
    );
    assert!(code == 1 && err.contains("line 4"), "{err}");
    assert!(
        err.contains("2 objects were written (batch 1), nothing from line 3 on"),
        "{err}"
    );
    std::fs::write(&path, "bad\n").unwrap();
    let (code, _, err) = cli(&addr, &["load", "t", path.to_str().unwrap()]);
    assert!(code == 1 && err.contains("nothing was written"), "{err}");
}

#[test]
fn common_mistakes_get_errors_that_say_what_to_do() {
    let (_up, addr, _dir) = start_up();
    let (code, _, err) = cli(&addr, &["get", "nosuch", "k"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("unknown table \"nosuch\"") && err.contains("insitu table list"),
        "{err}"
    );
    let (code, _, err) = bare(&["--cluster", "nonsense", "status"]);
    assert!(code == 1 && err.contains("HOST:PORT"), "{err}");
    let dead = format!("127.0.0.1:{}", free_port());
    let (code, _, err) = bare(&["--cluster", &dead, "status"]);
    assert!(code == 1 && err.contains("is `insitu up` running"), "{err}");
    // The OS error is said once, not repeated by the error chain.
    assert_eq!(err.matches("refused").count(), 1, "{err}");
}
