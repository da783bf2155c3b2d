//! Test harness: real `insitu` processes on loopback, killed when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn insitu_bin() -> &'static str {
    env!("CARGO_BIN_EXE_insitu")
}

/// A port that was free a moment ago (bind :0, read it, release it).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind :0");
    l.local_addr().expect("local addr").port()
}

/// A child process that is killed when dropped.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    /// Start `insitu ARGS`, wait until its stdout prints a line containing `ready`, return that line.
    pub fn start(name: &str, args: &[&str], ready: &str) -> (Proc, String) {
        let mut child = Command::new(insitu_bin())
            .args(args)
            .env("INSITU_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let ready = ready.to_string();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent && line.contains(&ready) {
                    let _ = tx.send(line);
                    sent = true;
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{name} did not become ready"));
        (
            Proc {
                child,
                name: name.to_string(),
            },
            line,
        )
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A coordinator plus storage servers, each its own process.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub coordinator: Proc,
    pub servers: Vec<Proc>,
}

impl Cluster {
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn start(servers: usize, shards: usize) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let coordinator = start_coordinator(dir.path(), port);
        let mut c = Cluster {
            dir,
            port,
            coordinator,
            servers: Vec::new(),
        };
        for _ in 0..servers {
            c.add_server(shards);
        }
        c
    }

    pub fn add_server(&mut self, shards: usize) {
        let i = self.servers.len();
        let sdir: PathBuf = self.dir.path().join(format!("server-{i}"));
        let shards = shards.to_string();
        let (p, _) = Proc::start(
            &format!("server-{i}"),
            &[
                "server",
                "--coordinator",
                &self.addr(),
                "--dir",
                sdir.to_str().expect("utf-8 path"),
                "--shards",
                &shards,
                "--memory-mb",
                "256",
            ],
            "up, shards at",
        );
        self.servers.push(p);
    }

    pub fn restart_coordinator(&mut self) {
        self.coordinator.kill();
        self.coordinator = start_coordinator(self.dir.path(), self.port);
    }

    /// Run a CLI command against this cluster; returns (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        cli(&self.addr(), args)
    }
}

pub fn start_coordinator(dir: &Path, port: u16) -> Proc {
    let cdir = dir.join("coordinator");
    let port = port.to_string();
    let started = Instant::now();
    loop {
        // The old process's port may take a moment to free up.
        let attempt = std::panic::catch_unwind(|| {
            Proc::start(
                "coordinator",
                &[
                    "coordinator",
                    "--port",
                    &port,
                    "--dir",
                    cdir.to_str().expect("utf-8 path"),
                ],
                "insitu coordinator at",
            )
        });
        match attempt {
            Ok((p, _)) => return p,
            Err(e) if started.elapsed() > Duration::from_secs(20) => std::panic::resume_unwind(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

pub fn cli(cluster: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(insitu_bin())
        .args(args)
        .env("INSITU_CLUSTER", cluster)
        .output()
        .expect("run insitu");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Deterministic pseudo-random numbers (xorshift), so failures reproduce.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
