//! Child processes for `bench kv`: starting insitu roles and Redis, CPU
//! pinning, and reading CPU time / RSS from /proc. Separate from the run so the
//! orchestration in `kv` reads as the sequence of cases, not process plumbing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use crate::resp;
use insitu_testkit::{Proc, on_path};
use insitu_tls::generate::TlsFiles;

// ---- child processes ---------------------------------------------------------

pub(crate) fn tracing_note(msg: &str) {
    eprintln!("bench kv: {msg}");
}

/// `program args`, prefixed by `taskset -c CPU` when pinning.
pub(crate) fn command(cpu: Option<usize>, program: &Path, args: &[String]) -> Command {
    match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(program).args(args);
            c
        }
        None => {
            let mut c = Command::new(program);
            c.args(args);
            c
        }
    }
}

/// Start an insitu role and wait for the stdout line that starts with `ready`.
pub(crate) fn start_insitu(
    name: &'static str,
    cpu: Option<usize>,
    args: &[String],
    ready: &str,
) -> anyhow::Result<(Proc, String)> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let mut cmd = command(cpu, &exe, args);
    // Warnings only, unless the operator asks for more (`INSITU_LOG=info
    // insitu bench ...` shows e.g. each recovered tablet's fetch and replay
    // times).
    cmd.env(
        "INSITU_LOG",
        std::env::var("INSITU_LOG").unwrap_or_else(|_| "warn".into()),
    );
    let ready = ready.to_string();
    Proc::spawn(cmd, &format!("insitu {name}"), move |l| {
        l.starts_with(&ready)
    })
}

/// CPUs this process may run on (from /proc/self/status).
pub(crate) fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(list) = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
    else {
        return Vec::new();
    };
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        let mut ends = part.split('-').map(|x| x.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => cpus.push(a),
            (Some(Ok(a)), Some(Ok(b))) => cpus.extend(a..=b),
            _ => {}
        }
    }
    cpus
}

/// Pin every thread of this process to `cpu`.
pub(crate) fn pin_self(cpu: usize) -> anyhow::Result<()> {
    pin_self_to(&cpu.to_string())
}

/// Let every thread of this process (and the processes it starts from now
/// on) run on every CPU it was allowed at start (undoes `pin_self`).
pub(crate) fn unpin_self() -> anyhow::Result<()> {
    let cpus: Vec<String> = allowed_cpus_at_start()
        .iter()
        .map(|c| c.to_string())
        .collect();
    anyhow::ensure!(
        !cpus.is_empty(),
        "cannot read the CPUs this process may use"
    );
    pin_self_to(&cpus.join(","))
}

/// The CPUs this process could use before it pinned itself: read once.
fn allowed_cpus_at_start() -> &'static [usize] {
    static CPUS: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    CPUS.get_or_init(allowed_cpus)
}

/// `taskset -a -p -c LIST` on this process.
fn pin_self_to(list: &str) -> anyhow::Result<()> {
    // Remember the CPUs allowed before the first pinning.
    let _ = allowed_cpus_at_start();
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", list, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .context("cannot run taskset")?;
    anyhow::ensure!(status.success(), "taskset failed: {status}");
    Ok(())
}

/// Nanoseconds of CPU every thread of `pid` has used (from schedstat).
pub(crate) fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Resident set size of `pid`, bytes.
pub(crate) fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| anyhow!("no VmRSS for pid {pid}"))?;
    Ok(kb * 1024)
}

// ---- Redis --------------------------------------------------------------------

pub(crate) fn ensure_redis_installed() -> anyhow::Result<()> {
    apt_install("redis-server", || on_path("redis-server"))
}

/// Install the Debian `package` with apt-get unless `present()` already
/// holds; fails if it still does not hold after.
pub(crate) fn apt_install(package: &str, present: impl Fn() -> bool) -> anyhow::Result<()> {
    if present() {
        return Ok(());
    }
    tracing_note(&format!("{package} not found; installing it with apt-get"));
    let ok = Command::new("sh")
        .args([
            "-c",
            &format!(
                "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {package}"
            ),
        ])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok || !present() {
        bail!("{package} is not installed and apt-get could not install it");
    }
    Ok(())
}

/// One blocking RESP call (set-up and INFO only, never in a timed case).
pub(crate) fn redis_call(addr: SocketAddr, args: &[&[u8]]) -> anyhow::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut out: Vec<u8> = Vec::new();
    resp::command(&mut out, args);
    s.write_all(&out)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some((reply, _)) = resp::parse(&buf)? {
            return Ok(match reply {
                resp::Reply::Bulk(b) | resp::Reply::Simple(b) => b.to_vec(),
                other => format!("{other:?}").into_bytes(),
            });
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            bail!("redis closed the connection");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

pub(crate) fn redis_info_field(
    addr: SocketAddr,
    section: &str,
    field: &str,
) -> anyhow::Result<String> {
    let info = redis_call(addr, &[b"INFO", section.as_bytes()])?;
    let info = String::from_utf8_lossy(&info);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| anyhow!("redis INFO {section} has no {field}"))
}

/// A running `redis-server`.
pub(crate) struct Redis {
    pub proc: Proc,
    /// The plain port: PING and INFO (never measured) go here.
    pub plain: SocketAddr,
    /// The TLS port, when started with TLS files.
    pub tls: Option<SocketAddr>,
}

/// Start Redis on `dir`: in memory only (`appendfsync` None: no RDB, no
/// AOF), or with `appendonly yes` and the given `appendfsync` policy; with
/// `tls`, also a TLS port with those files (no client certificates).
pub(crate) fn start_redis(
    cpu: Option<usize>,
    dir: &Path,
    appendfsync: Option<&str>,
    tls: Option<&TlsFiles>,
) -> anyhow::Result<Redis> {
    start_redis_with(cpu, dir, appendfsync, tls, &[])
}

/// `start_redis` with `extra` flags after the others (later flags win).
pub(crate) fn start_redis_with(
    cpu: Option<usize>,
    dir: &Path,
    appendfsync: Option<&str>,
    tls: Option<&TlsFiles>,
    extra: &[String],
) -> anyhow::Result<Redis> {
    ensure_redis_installed()?;
    let port = insitu_testkit::free_port()?;
    let mut args = insitu_testkit::redis_server_args(port);
    args.extend(
        [
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--dir",
            &dir.display().to_string(),
            "--logfile",
            "redis.log",
        ]
        .map(String::from),
    );
    if let Some(policy) = appendfsync {
        // Later flags win: turn the AOF on with the given fsync policy.
        args.extend(["--appendonly", "yes", "--appendfsync", policy].map(String::from));
    }
    let tls_addr = match tls {
        Some(files) => {
            let tls_port = insitu_testkit::free_port()?;
            args.extend([
                "--tls-port".to_string(),
                tls_port.to_string(),
                "--tls-cert-file".into(),
                files.cert.display().to_string(),
                "--tls-key-file".into(),
                files.key.display().to_string(),
                "--tls-ca-cert-file".into(),
                files.ca.display().to_string(),
                "--tls-auth-clients".into(),
                "no".into(),
            ]);
            Some(SocketAddr::from(([127, 0, 0, 1], tls_port)))
        }
        None => None,
    };
    args.extend_from_slice(extra);
    let child = command(cpu, Path::new("redis-server"), &args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start redis-server")?;
    let proc = Proc {
        child,
        name: "redis-server".to_string(),
    };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match redis_call(addr, &[b"PING"]) {
            Ok(r) if r == b"PONG" => {
                return Ok(Redis {
                    proc,
                    plain: addr,
                    tls: tls_addr,
                });
            }
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => {
                // Its log says why (a port it could not bind, a bad flag).
                let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                bail!(
                    "redis-server did not answer PING: {other:?}; the end of its log:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            }
        }
    }
}
