//! PostgreSQL for `insitu bench txn`: a throwaway server (initdb in a temp
//! directory, its own port), the same checkout workload as a pgbench script,
//! and pgbench's figures (transactions, retries, per-transaction latencies
//! from its log).
//!
//! Settings, and why: REPEATABLE READ (PostgreSQL's snapshot isolation: the
//! isolation the issue names; serialization failures are retried by pgbench
//! as our client retries conflicts); prepared statements (`-M prepared`);
//! `synchronous_commit = off` (a commit is acknowledged before its WAL is
//! flushed, flushed within 200 ms: no stronger than insitu's default, which
//! acknowledges once R backups hold the write and fsyncs within 1 s, so
//! PostgreSQL is not made to pay an fsync per commit that insitu does not).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, anyhow, bail};
use insitu_testkit::{Proc, free_port};

use crate::kv_procs::{apt_install, tracing_note};

/// The newest PostgreSQL's binaries (`/usr/lib/postgresql/N/bin`).
pub fn find_bin() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pgbench").exists()).then_some((v, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, b)| b)
}

/// A running throwaway PostgreSQL.
pub struct Postgres {
    bin: PathBuf,
    /// Holds the data directory, the socket and the pgbench logs; removed on drop.
    dir: tempfile::TempDir,
    pub port: u16,
    /// The postmaster (stopped on drop).
    proc: Option<Proc>,
    /// `postgres --version`.
    pub version: String,
}

/// PostgreSQL refuses to run as root: run its programs as `postgres` then.
fn as_pg_user(program: &Path) -> Command {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=postgres", "--regid=postgres", "--init-groups"]);
        c.arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(mut cmd: Command, what: &str) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Postgres {
    /// Install PostgreSQL if missing (apt-get), initdb, start it.
    pub fn start() -> anyhow::Result<Postgres> {
        apt_install("postgresql", || find_bin().is_some())?;
        let bin = find_bin().ok_or_else(|| anyhow!("no PostgreSQL under /usr/lib/postgresql"))?;
        let dir = tempfile::Builder::new()
            .prefix("insitu-bench-pg")
            .tempdir()?;
        // The postgres user must own it when we are root.
        let _ = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status();
        let data = dir.path().join("data");
        let mut initdb = as_pg_user(&bin.join("initdb"));
        initdb.args(["-D"]).arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run(initdb, "initdb")?;
        let port = free_port()?;
        let mut postgres = as_pg_user(&bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.path().display()))
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "default_transaction_isolation=repeatable read",
                "-c",
                "synchronous_commit=off",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=256MB",
                "-c",
                "logging_collector=off",
            ]);
        // Its log goes to stderr; the ready line is read from stdout.
        let shell = format!(
            "exec {} 2>&1",
            std::iter::once(postgres.get_program())
                .chain(postgres.get_args())
                .map(|a| shell_quote(&a.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let mut sh = Command::new("sh");
        sh.arg("-c").arg(shell);
        let (proc, _) = Proc::spawn(sh, "postgres", |l| {
            l.contains("database system is ready to accept connections")
        })?;
        let version = run(
            {
                let mut c = Command::new(bin.join("postgres"));
                c.arg("--version");
                c
            },
            "postgres --version",
        )?
        .trim()
        .to_string();
        Ok(Postgres {
            bin,
            dir,
            port,
            proc: Some(proc),
            version,
        })
    }

    /// Run SQL with psql; its output (unaligned, tuples only).
    pub fn psql(&self, sql: &str) -> anyhow::Result<String> {
        let mut c = Command::new(self.bin.join("psql"));
        c.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args([
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-qAt",
                "-c",
                sql,
            ]);
        run(c, "psql")
    }

    /// Run `script` with pgbench: `clients` connections for `seconds`, the
    /// variables `vars` set (`-D`); failed tries (serialization failures,
    /// deadlocks) retried up to 1000 times.
    pub fn pgbench(
        &self,
        name: &str,
        script: &str,
        clients: usize,
        seconds: f64,
        vars: &[(&str, String)],
    ) -> anyhow::Result<PgRun> {
        let script_path = self.dir.path().join(format!("{name}.sql"));
        std::fs::write(&script_path, script)?;
        let logs = self.dir.path().join(format!("log-{name}-{clients}"));
        std::fs::create_dir_all(&logs)?;
        let mut c = Command::new(self.bin.join("pgbench"));
        c.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
        ])
        .args(["-n", "-M", "prepared", "--max-tries=1000"])
        .args(["-c", &clients.to_string()])
        .args(["-j", &clients.min(2).to_string()])
        .args(["-T", &(seconds.ceil() as u64).max(1).to_string()])
        .arg("-f")
        .arg(&script_path)
        .arg("-l")
        .arg(format!("--log-prefix={}", logs.join("pg").display()));
        for (k, v) in vars {
            c.args(["-D", &format!("{k}={v}")]);
        }
        c.arg("postgres");
        let out = run(c, "pgbench")?;
        let mut latencies_us = Vec::new();
        for entry in std::fs::read_dir(&logs)? {
            let text = std::fs::read_to_string(entry?.path())?;
            for line in text.lines() {
                // client_id transaction_no latency_us script_no epoch us [retries]
                if let Some(us) = line.split_whitespace().nth(2).and_then(|f| f.parse().ok()) {
                    latencies_us.push(us);
                }
            }
        }
        parse_pgbench(&out, latencies_us)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut p) = self.proc.take()
            && !p.stop()
        {
            tracing_note("postgres did not stop within the grace period; killed");
        }
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// What pgbench measured.
#[derive(Debug)]
pub struct PgRun {
    /// Committed transactions.
    pub commits: u64,
    /// Tries that failed and were retried (serialization failures, deadlocks).
    pub retries: u64,
    /// Transactions that failed even after retrying.
    pub failed: u64,
    pub tps: f64,
    /// Latency of every committed transaction, retries included.
    pub latencies_us: Vec<u64>,
}

fn field<T: std::str::FromStr>(out: &str, prefix: &str) -> Option<T> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn parse_pgbench(out: &str, latencies_us: Vec<u64>) -> anyhow::Result<PgRun> {
    let missing = |what: &str| anyhow!("pgbench printed no {what:?}:\n{out}");
    Ok(PgRun {
        commits: field(out, "number of transactions actually processed:")
            .ok_or_else(|| missing("transactions actually processed"))?,
        retries: field(out, "total number of retries:").unwrap_or(0),
        failed: field(out, "number of failed transactions:").unwrap_or(0),
        tps: field(out, "tps =").ok_or_else(|| missing("tps"))?,
        latencies_us,
    })
}

/// The checkout transaction as pgbench runs it: 10 random items of
/// `1..=:items` (drawn with replacement, as the insitu side draws them),
/// their stock read, each decremented once, an order row written.
pub fn checkout_script() -> String {
    let ids: Vec<String> = (1..=10).map(|i| format!(":i{i}")).collect();
    let ids = ids.join(", ");
    let mut s = String::new();
    for i in 1..=10 {
        s.push_str(&format!("\\set i{i} random(1, :items)\n"));
    }
    s.push_str("BEGIN;\n");
    s.push_str(&format!(
        "SELECT id, stock FROM items WHERE id IN ({ids});\n"
    ));
    s.push_str(&format!(
        "UPDATE items SET stock = stock - 1 WHERE id IN ({ids});\n"
    ));
    s.push_str(&format!(
        "INSERT INTO orders (client, items) VALUES (:client_id, ARRAY[{ids}]::int[]);\n"
    ));
    s.push_str("END;\n");
    s
}

/// Create and fill the tables the checkout script uses.
pub fn load_checkout(pg: &Postgres, items: u64, stock: i64) -> anyhow::Result<()> {
    pg.psql(&format!(
        "DROP TABLE IF EXISTS items; DROP TABLE IF EXISTS orders; \
         CREATE TABLE items (id int PRIMARY KEY, stock bigint NOT NULL); \
         CREATE TABLE orders (id bigserial PRIMARY KEY, client int NOT NULL, items int[] NOT NULL); \
         INSERT INTO items SELECT g, {stock} FROM generate_series(1, {items}) g;"
    ))?;
    // (Its own call: VACUUM cannot run inside the transaction psql makes of several statements.)
    pg.psql("VACUUM ANALYZE items")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbench_output_parses() {
        let out = "transaction type: x.sql\nnumber of transactions actually processed: 1234\n\
                   number of failed transactions: 0 (0.000%)\nnumber of transactions retried: 5 (0.4%)\n\
                   total number of retries: 7\nlatency average = 1.6 ms\ntps = 246.812345 (without initial connection time)\n";
        let r = parse_pgbench(out, vec![1, 2]).unwrap();
        assert_eq!((r.commits, r.retries, r.failed), (1234, 7, 0));
        assert!((r.tps - 246.812345).abs() < 1e-9);
        assert!(parse_pgbench("garbage", vec![]).is_err());
    }

    #[test]
    fn the_checkout_script_names_ten_items() {
        let s = checkout_script();
        assert_eq!(s.matches("\\set i").count(), 10);
        assert!(s.contains("IN (:i1, :i2, :i3, :i4, :i5, :i6, :i7, :i8, :i9, :i10)"));
    }
}
