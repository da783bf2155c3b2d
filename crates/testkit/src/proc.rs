//! A child process that is stopped when dropped.
//!
//! Servers under test print a line when they are ready to serve; `spawn`
//! waits for it (with a deadline) while a thread keeps draining stdout, so
//! the child never blocks on a full pipe.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};

/// How long a child may take to print its ready line. Generous because CI
/// machines are slow and shared; a healthy start takes milliseconds.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `stop` waits after SIGTERM before it kills.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// A running child; killed (and reaped) when dropped.
pub struct Proc {
    /// The process itself; public so tests can signal or wait on it.
    pub child: Child,
    /// For messages: which role this is ("coordinator", "server-1", ...).
    pub name: String,
}

impl Proc {
    /// Start `cmd` with stdout piped, and wait until it prints a line for which
    /// `ready` is true; return that line. Stdin is closed, stderr inherited.
    pub fn spawn(
        mut cmd: Command,
        name: &str,
        ready: impl Fn(&str) -> bool + Send + 'static,
    ) -> anyhow::Result<(Proc, String)> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("{name}: stdout was not piped"))?;
        let proc = Proc {
            child,
            name: name.to_string(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent && ready(&line) {
                    let _ = tx.send(line);
                    sent = true;
                }
            }
        });
        let line = rx
            .recv_timeout(READY_TIMEOUT)
            .map_err(|_| anyhow!("{name} did not become ready within {READY_TIMEOUT:?}"))?;
        Ok((proc, line))
    }

    /// `spawn` again and again (a fresh command from `make` each time) until it
    /// succeeds or `within` has passed: a port just released by a killed
    /// process can take a moment to become bindable.
    pub fn spawn_retrying(
        make: impl Fn() -> Command,
        name: &str,
        ready: impl Fn(&str) -> bool + Send + Clone + 'static,
        within: Duration,
    ) -> anyhow::Result<(Proc, String)> {
        let started = Instant::now();
        loop {
            match Proc::spawn(make(), name, ready.clone()) {
                Ok(p) => return Ok(p),
                Err(e) if started.elapsed() > within => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM so the child can shut down cleanly; SIGKILL if it lingers.
    /// Returns whether it exited within the grace period.
    pub fn stop(&mut self) -> bool {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether `program` is an executable file on PATH.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_the_ready_line_and_kills_on_drop() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo starting; echo ready 42; sleep 30"]);
        let (p, line) = Proc::spawn(cmd, "sh", |l| l.starts_with("ready")).expect("spawn");
        assert_eq!(line, "ready 42");
        let pid = p.pid();
        drop(p);
        // Dropping killed and reaped it, so its /proc entry is gone.
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "child {pid} still running after drop"
        );
    }

    #[test]
    fn a_child_that_exits_without_the_line_is_an_error() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo nope"]);
        let err = Proc::spawn(cmd, "sh", |l| l == "ready")
            .err()
            .expect("error");
        assert!(err.to_string().contains("did not become ready"), "{err}");
    }
}
