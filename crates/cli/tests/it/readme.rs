//! Every command README.md shows in its `sh` code blocks, and every command
//! the program prints as a hint (`insitu up`'s "try:" line, the hints of its
//! error messages), is run exactly as written, through `sh -c`, against a
//! real `insitu up`. A README command that fails fails this test.
//!
//! What is rewritten, and only that:
//! - the binary: `insitu` is found on PATH (the directory of the binary under
//!   test is put first); `cargo run --release -- ` becomes `insitu ` (the test
//!   does not build a release binary);
//! - ports and the cluster address: `insitu up` gets `--port P` (a free port),
//!   the client commands get `INSITU_CLUSTER=127.0.0.1:P` in their environment
//!   (and an explicit `--cluster 127.0.0.1:7070` becomes `127.0.0.1:P`),
//!   the multi-machine block's coordinator port 7070 becomes a second free port
//!   and the server's `--port 7100` becomes `--port 0` (free ports), and a
//!   `--metrics-port` a free port, since tests must not take fixed ports;
//! - the multi-machine paths under /var/lib/insitu become a temporary
//!   directory (a test may not write there), and `tls init --host HOST`
//!   names 127.0.0.1 (where that block's servers run);
//! - the client token: as the README tells the reader to export
//!   INSITU_AUTH_TOKEN_FILE (which one `sh -c` cannot pass to the next), the
//!   client commands get it in their environment, pointing at the token
//!   `insitu up` wrote; the "try:" hint runs without it, so the printed
//!   `--auth-token-file` must do the work.
//!
//! Input files the commands read (data.csv, bob.json) are created in the
//! temporary working directory, and the tables the data-operation examples
//! name (nums, points) are filled first. Commands that start servers (`up`,
//! `coordinator`, `server`) are started, waited for until ready, and stopped
//! with SIGTERM, which must end them with status 0.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use common::{free_port, insitu_bin};

/// Where and how the commands run.
struct Ctx {
    /// Working directory of every command (input files live here).
    cwd: PathBuf,
    /// PATH with the binary under test first.
    path: String,
    /// The cluster address the client commands get as INSITU_CLUSTER.
    cluster: String,
    /// Port given to `insitu up`.
    up_port: u16,
    /// Port of the multi-machine block's coordinator.
    coordinator_port: u16,
    /// Replaces /var/lib/insitu.
    var_dir: PathBuf,
    /// Replaces `up`'s `--resp-port 6380` and redis-cli's `-p 6380`.
    resp_port: u16,
}

/// A server role started from a printed command; SIGTERM'd when stopped,
/// killed if the test fails first.
struct Running {
    line: String,
    child: Option<Child>,
    /// What it printed on stdout up to its ready line.
    printed: Vec<String>,
    /// Keeps the stdout reader's channel open.
    _lines: Receiver<String>,
}

impl Running {
    /// SIGTERM, and the exit must be clean.
    fn stop(mut self) {
        let mut child = self.child.take().expect("running");
        let pid = child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(
            sent.is_ok_and(|s| s.success()),
            "cannot signal {}",
            self.line
        );
        let status = child.wait().expect("wait");
        assert!(
            status.success(),
            "`{}` exited with {status} on SIGTERM",
            self.line
        );
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The line a server role prints once it is ready.
fn ready_marker(role: &str) -> Option<&'static str> {
    match role {
        "up" => Some("Ctrl-C to stop"),
        "coordinator" => Some("insitu coordinator at"),
        "server" => Some("up, shards at"),
        _ => None,
    }
}

/// The printed command as it will run: binary and ports rewritten (see the
/// file comment). `None` for what is not run here.
fn rewrite(line: &str, ctx: &Ctx) -> Option<String> {
    let line = line.trim();
    if line.starts_with("cargo test") || line.starts_with("scripts/test") {
        // The test suite itself, which this test is part of.
        return None;
    }
    if line.starts_with("pip install ./python") {
        // The Python client: `scripts/test` installs it and runs its tests.
        return None;
    }
    if line.starts_with("printf ") && line.contains(" > ") && !line.contains("..") {
        // Writes an example input file into the test's directory.
        return Some(line.to_string());
    }
    if let Some(rest) = line.strip_prefix("redis-cli ") {
        // A Redis client against `up`'s RESP port (run in `up`'s directory,
        // where the token file the line reads lives).
        return Some(format!(
            "redis-cli {}",
            rest.replace("-p 6380", &format!("-p {}", ctx.resp_port))
        ));
    }
    if line.starts_with("export INSITU_") {
        // What it sets must work on its own: run it (comment dropped) with a
        // client command after it, without the harness's token (see the
        // main loop).
        let export = line.split(" #").next().unwrap_or(line).trim();
        return Some(format!("{export} && insitu table list"));
    }
    let mut line = match line.strip_prefix("cargo run --release -- ") {
        Some(rest) => format!("insitu {rest}"),
        None => line.to_string(),
    };
    assert!(
        line.starts_with("insitu "),
        "a command this test does not know how to run: {line:?} (teach tests/it/readme.rs)"
    );
    let role = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let role = role.as_str();
    if role == "up" && !line.contains("--port") {
        line = line.replacen("insitu up", &format!("insitu up --port {}", ctx.up_port), 1);
    }
    line = line.replace(
        "--resp-port 6380",
        &format!("--resp-port {}", ctx.resp_port),
    );
    if role == "coordinator" {
        line = line.replace("--port 7070", &format!("--port {}", ctx.coordinator_port));
    }
    if role == "tls" {
        // The certificate must name the address this test's processes dial.
        line = line.replace("--host HOST", "--host 127.0.0.1");
    }
    if let Some((before, after)) = line.split_once("--metrics-port ") {
        // A fixed metrics port becomes a free one.
        let rest = after.split_once(' ').map_or("", |(_, r)| r);
        line = format!("{before}--metrics-port {} {rest}", free_port())
            .trim_end()
            .to_string();
    }
    if ready_marker(role).is_none() {
        // An explicit --cluster at the default address points at this test's `up`.
        line = line.replace("127.0.0.1:7070", &ctx.cluster);
    }
    if role == "server" {
        line = line
            .replace("HOST:7070", &format!("127.0.0.1:{}", ctx.coordinator_port))
            .replace("--port 7100", "--port 0");
    }
    Some(line.replace("/var/lib/insitu", ctx.var_dir.to_str().expect("utf-8 path")))
}

/// The client token `insitu up` (run in `ctx.cwd`, default --dir) wrote.
fn up_token_file(ctx: &Ctx) -> PathBuf {
    ctx.cwd.join("insitu-data").join("auth-token")
}

fn sh(line: &str, ctx: &Ctx, cluster: &str) -> Command {
    let mut c = sh_without_token(line, ctx, cluster);
    c.env("INSITU_AUTH_TOKEN_FILE", up_token_file(ctx));
    c
}

fn sh_without_token(line: &str, ctx: &Ctx, cluster: &str) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(line)
        .current_dir(&ctx.cwd)
        .env_remove("INSITU_AUTH_TOKEN_FILE")
        .env_remove("INSITU_AUTH_TOKEN")
        .env("PATH", &ctx.path)
        .env("INSITU_CLUSTER", cluster)
        .env("INSITU_LOG", "warn");
    c
}

/// Start a server role and wait until it says it is ready.
fn start(line: &str, ctx: &Ctx) -> Running {
    let role = line.split_whitespace().nth(1).unwrap_or("");
    let ready = ready_marker(role).expect("a server role");
    let mut child = sh(&format!("exec {line}"), ctx, &ctx.cluster)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{line}`: {e}"));
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut running = Running {
        line: line.to_string(),
        child: Some(child),
        printed: Vec::new(),
        _lines: rx,
    };
    loop {
        match running._lines.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => {
                let done = l.contains(ready);
                running.printed.push(l);
                if done {
                    return running;
                }
            }
            Err(_) => panic!("`{line}` did not print {ready:?}"),
        }
    }
}

/// Run a client command; it must succeed. Returns (stdout, stderr).
fn run_ok(line: &str, ctx: &Ctx, cluster: &str) -> (String, String) {
    output_ok(sh(line, ctx, cluster), line)
}

/// Run `command` (the shell running `line`); it must succeed.
fn output_ok(mut command: Command, line: &str) -> (String, String) {
    let out = command.output().expect("run sh");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "`{line}` failed with {}:\n{o}{e}",
        out.status
    );
    (o, e)
}

/// The `sh` code blocks of a Markdown text: one entry per block, its lines.
fn sh_blocks(markdown: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().starts_with("```");
        match (&mut current, fence) {
            (None, true) if line.trim() == "```sh" => current = Some(Vec::new()),
            (Some(_), true) => blocks.push(current.take().expect("open block")),
            (Some(b), false) if !line.trim().is_empty() => b.push(line.to_string()),
            _ => {}
        }
    }
    assert!(current.is_none(), "README.md has an unclosed code block");
    blocks
}

/// Commands quoted in backticks in a program's message, e.g.
/// "(`insitu table list` shows the tables)".
fn quoted_commands(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("insitu "))
        .map(str::to_string)
        .collect()
}

/// The tables the data-operation examples use: `nums` (i64 at 0, f64 at 8,
/// i32 at 16) and `points` (256 f32 features, then a 0/1 label byte).
fn fill_example_tables(ctx: &Ctx) {
    let token = insitu_client::Token::from_file(&up_token_file(ctx)).expect("up's token");
    let config = insitu_client::ClientConfig {
        auth_token: Some(token),
        ..Default::default()
    };
    let client =
        insitu_client::BlockingClient::connect_with(&ctx.cluster, config).expect("connect");
    let nums = client.create_table("nums", 2).expect("create nums").id;
    for i in 0..20i64 {
        let mut v = Vec::new();
        v.extend_from_slice(&i.to_le_bytes());
        v.extend_from_slice(&(i as f64 / 10.0).to_le_bytes());
        v.extend_from_slice(&((i % 4) as i32).to_le_bytes());
        client.write(nums, format!("n{i}"), v).expect("write nums");
    }
    let points = client.create_table("points", 2).expect("create points").id;
    for i in 0..16u32 {
        let label = (i % 2) as u8;
        let mut v = Vec::new();
        for d in 0..256u32 {
            let x = if d == 0 {
                label as f32 * 2.0 - 1.0
            } else {
                (d % 7) as f32 / 7.0
            };
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.push(label);
        client
            .write(points, format!("p{i}"), v)
            .expect("write points");
    }
}

fn write_inputs(dir: &Path) {
    std::fs::write(
        dir.join("data.csv"),
        "carol,\"{\"\"age\"\": 27}\"\ndave,hello\n",
    )
    .unwrap();
    std::fs::write(dir.join("bob.json"), "{\"age\": 40}").unwrap();
}

#[test]
fn every_readme_command_and_printed_hint_runs_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path().join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    write_inputs(&cwd);
    let bin_dir = Path::new(insitu_bin()).parent().expect("bin dir");
    let up_port = free_port();
    let ctx = Ctx {
        cwd,
        path: format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
        cluster: format!("127.0.0.1:{up_port}"),
        up_port,
        coordinator_port: free_port(),
        var_dir: tmp.path().join("var-lib-insitu"),
        resp_port: free_port(),
    };

    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let blocks = sh_blocks(&readme);
    assert!(blocks.len() >= 3, "README.md lost its examples?");
    let mut ran = 0;
    let mut up: Option<Running> = None;
    for block in &blocks {
        // Server roles of this block, stopped at its end (except `up`, which
        // serves the client commands of the blocks after it).
        let mut block_roles = Vec::new();
        // A block whose redis-cli lines were skipped also skips its lines
        // that read the `redis` table they would have written.
        let mut redis_skipped = false;
        for printed in block {
            let Some(line) = rewrite(printed, &ctx) else {
                continue;
            };
            ran += 1;
            let role = line.split_whitespace().nth(1).unwrap_or("");
            if line.starts_with("redis-cli ") && !common::on_path("redis-cli") {
                eprintln!("SKIPPED (redis-cli is not installed): {line}");
                redis_skipped = true;
                continue;
            }
            if redis_skipped && line.split_whitespace().any(|w| w == "redis") {
                eprintln!("SKIPPED (reads what the skipped redis-cli lines wrote): {line}");
                continue;
            }
            if line.starts_with("export ") {
                assert!(
                    up.is_some(),
                    "`{printed}` comes before `insitu up` in README.md"
                );
                output_ok(sh_without_token(&line, &ctx, &ctx.cluster), &line);
            } else if role == "up" {
                assert!(up.is_none(), "README starts `insitu up` twice");
                let running = start(&line, &ctx);
                fill_example_tables(&ctx);
                up = Some(running);
            } else if ready_marker(role).is_some() {
                block_roles.push(start(&line, &ctx));
            } else {
                assert!(
                    up.is_some(),
                    "`{printed}` comes before `insitu up` in README.md"
                );
                run_ok(&line, &ctx, &ctx.cluster);
            }
        }
        for r in block_roles.into_iter().rev() {
            r.stop();
        }
    }
    assert!(ran >= 15, "only {ran} README commands ran");
    let up = up.expect("README.md shows `insitu up`");

    try_hints_of_up(&up.printed, &ctx);
    redis_hint_of_up(&up.printed, &ctx);

    // The commands an error message suggests.
    let out = sh("insitu get nosuch k", &ctx, &ctx.cluster)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let hints = quoted_commands(&String::from_utf8_lossy(&out.stderr));
    assert_eq!(hints.len(), 2, "{}", String::from_utf8_lossy(&out.stderr));
    for h in hints {
        run_ok(&h, &ctx, &ctx.cluster);
    }
    up.stop();
}

/// `insitu up`'s "try:" command, run exactly as printed (with INSITU_CLUSTER
/// pointing nowhere, so the printed `--cluster` must do the work), and its
/// `export INSITU_CLUSTER=...`.
fn try_hints_of_up(printed: &[String], ctx: &Ctx) {
    let text = printed.join("\n");
    let try_line = printed
        .iter()
        .find_map(|l| l.trim().strip_prefix("try: "))
        .unwrap_or_else(|| panic!("no try: hint in\n{text}"));
    let (command, rest) = try_line
        .split_once("   (")
        .expect("try: COMMAND   (or export ...)");
    let dead = format!("127.0.0.1:{}", free_port());
    let (o, _) = output_ok(sh_without_token(command.trim(), ctx, &dead), command);
    assert!(o.contains("created table demo"), "{o}");
    let export = rest
        .strip_prefix("or ")
        .and_then(|r| r.strip_suffix(')'))
        .expect("(or export INSITU_CLUSTER=...)");
    assert!(export.starts_with("export INSITU_CLUSTER="), "{export}");
    let line = format!("{export}; insitu table list");
    let (o, _) = output_ok(sh_without_token(&line, ctx, &dead), &line);
    assert!(o.contains("demo\t"), "{o}");
}

/// `insitu up --resp-port`'s redis-cli line, run exactly as printed (with
/// `ping` after it, as an interactive shell would be typed into).
fn redis_hint_of_up(printed: &[String], ctx: &Ctx) {
    let text = printed.join("\n");
    let line = printed
        .iter()
        .find_map(|l| {
            l.split_once("): ")
                .filter(|(a, _)| a.contains("Redis protocol on"))
                .map(|(_, b)| b.to_string())
        })
        .unwrap_or_else(|| panic!("no Redis protocol hint in\n{text}"));
    assert!(line.starts_with("redis-cli -p "), "{line}");
    if !common::on_path("redis-cli") {
        eprintln!("SKIPPED (redis-cli is not installed): {line}");
        return;
    }
    let command = format!("{line} ping");
    let (o, _) = output_ok(sh_without_token(&command, ctx, &ctx.cluster), &command);
    assert_eq!(o.trim(), "PONG", "{command}");
}
