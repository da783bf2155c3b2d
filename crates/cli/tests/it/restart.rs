//! `insitu up` restarted on the same data directory: the tables of the
//! previous run are kept, their objects recovered from the replicas on the
//! servers' disks, and they work again on the new run's servers.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{cli_with_token, free_port, insitu_bin, stop_cleanly};

/// A running `insitu up` and every line it printed on stdout so far.
struct Up {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Up {
    fn output(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// SIGTERM, and expect a clean exit.
    fn stop(mut self) {
        stop_cleanly(&mut self.child);
    }
}

/// Start `insitu up` on `dir` and `port`; wait until it printed its last
/// start-up line ("Ctrl-C to stop"). Retries while the port is still taken.
fn start_up(dir: &Path, port: u16) -> Up {
    let started = Instant::now();
    loop {
        let mut child = Command::new(insitu_bin())
            .args(common::up_args(2, port, dir, 256, &[]))
            .env("INSITU_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start insitu up");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let ready = line.contains("Ctrl-C to stop");
                sink.lock().unwrap().push(line);
                if ready {
                    let _ = tx.send(());
                }
            }
        });
        let up = Up { child, lines };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(()) => return up,
            // Stdout closed without the ready line: it exited (port still in use?).
            Err(_) if started.elapsed() < Duration::from_secs(20) => {
                drop(up);
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(_) => panic!("insitu up did not become ready"),
        }
    }
}

#[test]
fn up_restarted_on_its_dir_serves_the_old_tables_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // `up` runs with authentication (its default): the token it writes on
    // the first start must still be the cluster's after the restart.
    let token_file = data.join("auth-token");
    let cli = |addr: &str, args: &[&str]| cli_with_token(addr, &token_file, args);

    let up = start_up(&data, port);
    assert!(
        !up.output().iter().any(|l| l.contains("previous run")),
        "a first run has nothing to warn about: {:?}",
        up.output()
    );
    let (code, out, err) = cli(&addr, &["table", "create", "t", "--tablets", "4"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = cli(&addr, &["put", "t", "k", "v"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(cli(&addr, &["get", "t", "k"]).1, "v\n");
    up.stop();

    // Same directory, same port: a new coordinator process, new servers.
    let up = start_up(&data, port);
    let output = up.output();
    let warning = output
        .iter()
        .find(|l| l.contains("from a previous run kept"))
        .unwrap_or_else(|| panic!("no warning about the kept table in {output:?}"));
    assert!(
        warning.contains("1 table")
            && warning.contains("\"t\"")
            && warning.contains("recovered from the replicas"),
        "{warning}"
    );

    // The old object is back (recovered from the replicas), new writes land.
    let (code, out, err) = cli(&addr, &["get", "t", "k"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "v\n"),
        "the old object is back: {out}{err}"
    );
    let (code, out, err) = cli(&addr, &["put", "t", "k2", "v2"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(cli(&addr, &["get", "t", "k2"]).1, "v2\n");
    let (code, out, err) = cli(&addr, &["put", "t", "k", "again"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(cli(&addr, &["get", "t", "k"]).1, "again\n");
    let (code, out, err) = cli(&addr, &["status"]);
    assert!(code == 0 && out.contains("2 servers"), "{out}{err}");
    up.stop();
}
