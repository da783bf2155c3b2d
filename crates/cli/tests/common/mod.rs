//! Test harness: real `insitu` processes on loopback, killed when dropped.
#![allow(dead_code)]

pub mod pushdown;
pub mod typed;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

#[allow(unused_imports)] // each test binary uses a different subset
pub use insitu_testkit::{Proc, on_path, rng};

pub fn insitu_bin() -> &'static str {
    env!("CARGO_BIN_EXE_insitu")
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    insitu_testkit::free_port().expect("a free loopback port")
}

/// `insitu ARGS` with warnings-only logging.
pub fn insitu_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(insitu_bin());
    // Warnings only, unless a person chasing a failure asks for more
    // (`INSITU_TEST_LOG=info,insitu_server::txn=debug cargo test ...`): the
    // processes' stderr reaches the test's output.
    let log = std::env::var("INSITU_TEST_LOG").unwrap_or_else(|_| "warn".into());
    cmd.args(args).env("INSITU_LOG", log);
    cmd
}

/// Start `insitu ARGS`, wait until its stdout prints a line containing `ready`, return that line.
pub fn start(name: &str, args: &[&str], ready: &str) -> (Proc, String) {
    let ready = ready.to_string();
    Proc::spawn(insitu_command(args), name, move |l| l.contains(&ready))
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// Start `insitu ARGS` with stdout and stderr pipes whose read ends are
/// already closed (what `insitu up | head -1` leaves once `head` has exited):
/// every line the process prints meets EPIPE. Returns at once; nothing
/// tells when it is ready, so poll it (e.g. with `insitu status`).
pub fn spawn_with_closed_output(name: &str, args: &[&str]) -> Proc {
    let (out_reader, out_writer) = std::io::pipe().expect("pipe");
    let (err_reader, err_writer) = std::io::pipe().expect("pipe");
    // Closed before the child writes anything, so no line can slip into
    // the pipe's buffer unread: the result does not depend on timing.
    drop((out_reader, err_reader));
    let child = insitu_command(args)
        .stdin(Stdio::null())
        .stdout(out_writer)
        .stderr(err_writer)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    Proc {
        child,
        name: name.to_string(),
    }
}

/// Send SIGTERM to `child` and expect a clean exit (status 0).
pub fn stop_cleanly(child: &mut std::process::Child) {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(sent.unwrap().success(), "kill -TERM {pid}");
    let status = child.wait().unwrap();
    assert!(status.success(), "insitu up exited with {status}");
}

/// A coordinator plus storage servers, each its own process.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub coordinator: Proc,
    pub servers: Vec<Proc>,
    /// The id each of `servers` enlisted with (same index), as `add_server`
    /// started them: how a test finds the process of a server it picked by id.
    pub server_ids: Vec<u64>,
    /// Extra `insitu coordinator` arguments, given again at every restart
    /// (R is taken from the command line at each start).
    pub coordinator_args: Vec<String>,
    /// Environment variables of every server started from now on (e.g.
    /// `INSITU_CRASH_AT`).
    pub server_env: Vec<(String, String)>,
}

impl Cluster {
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn start(servers: usize, shards: usize) -> Cluster {
        Cluster::start_with(servers, shards, &[])
    }

    /// `start`, with extra `insitu coordinator` arguments (e.g. `--replicas 0`).
    pub fn start_with(servers: usize, shards: usize, coordinator_args: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let coordinator_args: Vec<String> =
            coordinator_args.iter().map(|a| a.to_string()).collect();
        let coordinator = start_coordinator_with(dir.path(), port, &coordinator_args);
        let mut c = Cluster {
            dir,
            port,
            coordinator,
            servers: Vec::new(),
            server_ids: Vec::new(),
            coordinator_args,
            server_env: Vec::new(),
        };
        for _ in 0..servers {
            c.add_server(shards);
        }
        c
    }

    /// Start one more server (`server-N`); returns the id it enlisted with.
    pub fn add_server(&mut self, shards: usize) -> u64 {
        let i = self.servers.len();
        let (p, id) = self.start_server_with_id(i, shards);
        self.servers.push(p);
        self.server_ids.push(id);
        id
    }

    /// Start server `i` on its own data directory (`server-i`): a restart of
    /// a killed server `i` finds its replicas there again.
    pub fn start_server(&self, i: usize, shards: usize) -> Proc {
        self.start_server_with_id(i, shards).0
    }

    /// `start_server`, and the id the server enlisted with (from its
    /// "insitu server ID up, ..." line).
    pub fn start_server_with_id(&self, i: usize, shards: usize) -> (Proc, u64) {
        let sdir: PathBuf = self.dir.path().join(format!("server-{i}"));
        let shards = shards.to_string();
        let mut command = insitu_command(&[
            "server",
            "--coordinator",
            &self.addr(),
            "--dir",
            sdir.to_str().expect("utf-8 path"),
            "--shards",
            &shards,
            "--memory-mb",
            "256",
        ]);
        command.envs(self.server_env.iter().map(|(k, v)| (k, v)));
        let (p, line) = Proc::spawn(command, &format!("server-{i}"), |l| {
            l.contains("up, shards at")
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
        let id = line
            .strip_prefix("insitu server ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("no server id in {line:?}"));
        (p, id)
    }

    /// kill -9 the server that enlisted as `id` (started by `add_server`).
    pub fn kill_server(&mut self, id: u64) {
        let i = self
            .server_ids
            .iter()
            .position(|&s| s == id)
            .unwrap_or_else(|| panic!("no server {id} was started here"));
        self.servers[i].kill();
    }

    pub fn restart_coordinator(&mut self) {
        self.coordinator.kill();
        self.coordinator =
            start_coordinator_with(self.dir.path(), self.port, &self.coordinator_args);
    }

    /// Run a CLI command against this cluster; returns (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        cli(&self.addr(), args)
    }

    /// The trimmed stdout of a CLI command that must succeed against this cluster.
    pub fn answer(&self, args: &[&str]) -> String {
        ok(self.cli(args)).trim().to_string()
    }

    /// The trimmed answer of `insitu count TABLE --where FILTER` (which must succeed).
    pub fn count_where(&self, table: &str, filter: &str) -> String {
        self.answer(&["count", table, "--where", filter])
    }

    /// Run `insitu status` (which must succeed) until `pred` accepts its
    /// output, at most ~30 s; `what` names the awaited state in the panic.
    pub fn status_until(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        status_until(&self.addr(), what, pred)
    }
}

/// `Cluster::status_until` for any cluster address.
pub fn status_until(cluster: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..300 {
        let (code, out, err) = cli(cluster, &["status"]);
        assert_eq!(code, 0, "{out}{err}");
        if pred(&out) {
            return out;
        }
        last = out;
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("status never showed {what}:\n{last}");
}

pub fn start_coordinator(dir: &Path, port: u16) -> Proc {
    start_coordinator_with(dir, port, &[])
}

/// `start_coordinator` with extra arguments.
pub fn start_coordinator_with(dir: &Path, port: u16, extra: &[String]) -> Proc {
    let cdir = dir.join("coordinator");
    let cdir = cdir.to_str().expect("utf-8 path").to_string();
    let port = port.to_string();
    let mut args = vec!["coordinator", "--port", &port, "--dir", &cdir];
    args.extend(extra.iter().map(String::as_str));
    // The old process's port may take a moment to free up.
    let (p, _) = Proc::spawn_retrying(
        || insitu_command(&args),
        "coordinator",
        |l| l.contains("insitu coordinator at"),
        Duration::from_secs(20),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    p
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

/// `cli` with `input` on its standard input (e.g. statements for the SQL
/// shell, which reads lines from a pipe).
pub fn cli_with_input(cluster: &str, args: &[&str], input: &str) -> (i32, String, String) {
    use std::io::Write as _;
    let mut child = Command::new(insitu_bin())
        .args(args)
        .env("INSITU_CLUSTER", cluster)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run insitu");
    // Dropped after writing: the shell sees the end of its input.
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(input.as_bytes()).expect("write stdin");
    drop(stdin);
    let out = child.wait_with_output().expect("wait for insitu");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `cli` presenting the client token in `token_file` (`--auth-token-file`).
pub fn cli_with_token(cluster: &str, token_file: &Path, args: &[&str]) -> (i32, String, String) {
    let file = token_file.to_str().expect("utf-8 path");
    let mut all = vec!["--auth-token-file", file];
    all.extend_from_slice(args);
    cli(cluster, &all)
}

/// The runtime the tests drive their clients on.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// `insitu up`'s arguments for a test cluster: `servers` servers of one
/// shard and `memory_mb` each, on `port`, data under `data`, then `extra`.
pub fn up_args(
    servers: usize,
    port: u16,
    data: &Path,
    memory_mb: usize,
    extra: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = [
        "up",
        "--servers",
        &servers.to_string(),
        "--shards",
        "1",
        "--port",
        &port.to_string(),
        "--dir",
        data.to_str().expect("utf-8 path"),
        "--memory-mb",
        &memory_mb.to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// Start `insitu up` with `up_args` and wait for the line containing `ready`.
pub fn start_up_with(servers: usize, port: u16, data: &Path, extra: &[&str], ready: &str) -> Proc {
    let args = up_args(servers, port, data, 128, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start("up", &args, ready).0
}

/// A running `insitu up` of `servers` servers (1 shard each, `memory_mb` each)
/// on a free port: the process, its "insitu is up" line, the address clients
/// use, and the temp dir holding its data (dropped last).
pub fn start_up(servers: usize, memory_mb: usize) -> (Proc, String, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let data = dir.path().join("data");
    // These tests are about the commands, not authentication (`auth.rs`
    // and `restart.rs` run `up` with it on).
    let args = up_args(servers, port, &data, memory_mb, &["--no-auth"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (up, line) = start("up", &args, "insitu is up");
    (up, line, format!("127.0.0.1:{port}"), dir)
}

/// The stdout of a command that must succeed (its output shown if not).
pub fn ok(out: (i32, String, String)) -> String {
    assert_eq!(out.0, 0, "stdout: {}\nstderr: {}", out.1, out.2);
    out.1
}

/// The stderr of a command that must fail.
pub fn fails(out: (i32, String, String)) -> String {
    assert_ne!(out.0, 0, "expected a failure; stdout: {}", out.1);
    out.2
}

/// Run a CLI command that must fail and whose stderr must name each of `want`.
pub fn fails_saying(cluster: &Cluster, args: &[&str], want: &[&str]) {
    let (code, out, err) = cluster.cli(args);
    assert_ne!(code, 0, "{args:?} should fail: {out}");
    for w in want {
        assert!(err.contains(w), "{args:?}: {err:?} lacks {w:?}");
    }
}

/// A typed table `users` (id, name, age NULL-able, score decimal) over 4
/// tablets with three rows: alice (31, 10.50), bob (NULL age, 3.25),
/// carol (45, -1).
pub fn users_table(cluster: &Cluster) {
    ok(cluster.cli(&[
        "table",
        "create",
        "users",
        "--schema",
        "id int64, name utf8, age int32 null, score decimal(10,2)",
        "--key",
        "id",
        "--tablets",
        "4",
    ]));
    ok(cluster.cli(&[
        "insert",
        "users",
        "1,alice,31,10.50",
        "2,bob,,3.25",
        "3,carol,45,-1",
    ]));
}

/// The id of a server none of whose shards is `shard_addr`: where a tablet
/// held there can move.
pub fn server_without(servers: &[insitu_client::ServerInfo], shard_addr: &str) -> u64 {
    servers
        .iter()
        .find(|s| !s.shard_addrs.iter().any(|a| a == shard_addr))
        .expect("a server without that shard")
        .id
}

/// Write `k0..k{n}` = `v0..v{n}` into `table`.
pub fn write_keys(client: &insitu_client::BlockingClient, table: &str, n: usize) {
    let t = client.open_table(table).expect("open").id;
    for i in 0..n {
        client
            .write(t, format!("k{i}"), format!("v{i}"))
            .expect("write");
    }
}

/// Every key `write_keys` wrote reads back its value.
pub fn all_keys_intact(client: &insitu_client::BlockingClient, table: &str, n: usize) {
    let t = client.open_table(table).expect("open").id;
    for i in 0..n {
        let got = client.read(t, format!("k{i}")).expect("read");
        assert_eq!(
            got.map(|(v, _)| v.to_vec()),
            Some(format!("v{i}").into_bytes()),
            "key k{i} lost"
        );
    }
}

/// The index (in `tablets`) of the tablet holding `key` of `info`'s table.
pub fn tablet_of(info: &insitu_protocol::TableInfo, key: &str) -> usize {
    let hash = insitu_keyhash::key_hash(info.id, key.as_bytes());
    info.tablets
        .iter()
        .position(|t| (t.start_hash..=t.end_hash).contains(&hash))
        .expect("the tablets cover every hash")
}
