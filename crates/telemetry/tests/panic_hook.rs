//! The server processes' panic hook, in a real process: this test binary
//! runs itself again as a child (switched by an environment variable), the
//! child installs the hook and panics in a spawned thread while its main
//! thread sleeps; the whole child must die of SIGABRT.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

/// Set in the child: run the panicking side instead of the checks.
const CHILD: &str = "INSITU_PANIC_HOOK_TEST_CHILD";

/// How long the child's main thread sleeps: if the hook did not abort, the
/// child exits normally after this (and the parent fails the test).
const CHILD_SLEEP: Duration = Duration::from_secs(3);

/// The child's side: hook, then a panic on a thread that is not main.
fn child() -> ! {
    insitu_telemetry::abort_on_panic();
    std::thread::Builder::new()
        .name("worker".into())
        .spawn(|| panic!("boom in a worker thread"))
        .expect("spawn");
    std::thread::sleep(CHILD_SLEEP);
    // Reached only if the panic left the process running.
    std::process::exit(0);
}

#[test]
fn a_panic_in_any_thread_aborts_the_whole_process() {
    if std::env::var_os(CHILD).is_some() {
        child();
    }
    let started = Instant::now();
    let out = Command::new(std::env::current_exe().expect("test binary"))
        // Only this test, with output not captured: the hook's report goes
        // to the real stderr, where the parent reads it.
        .args([
            "--exact",
            "a_panic_in_any_thread_aborts_the_whole_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(6),
        "the child must die of SIGABRT, not {:?}; stderr:\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("boom in a worker thread"),
        "the panic is reported first: {stderr}"
    );
    assert!(
        stderr
            .contains("a thread panicked; stopping the process so no half-updated state is served"),
        "the hook says why the process stops: {stderr}"
    );
    // Aborted at the panic, not at the end of the main thread's sleep.
    assert!(started.elapsed() < CHILD_SLEEP, "{:?}", started.elapsed());
}
