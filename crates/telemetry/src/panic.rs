//! The panic policy of the server processes (`insitu up | coordinator |
//! server`): a panic in any thread ends the whole process.

/// What the hook prints (after the panic's own report) before aborting.
pub const ABORT_MESSAGE: &str =
    "insitu: a thread panicked; stopping the process so no half-updated state is served";

/// Install a panic hook that reports the panic as usual, says why the
/// process stops, and aborts it (SIGABRT).
///
/// Why: a shard thread that panicked mid-request may leave its engine half
/// updated; if the other threads went on serving, clients would meet a dead
/// shard (or worse, its state) while the process looks alive. Better to stop
/// at once, loudly, and let the cluster treat the server as failed.
pub fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        // Not `eprintln!`, which panics on a closed stderr: nothing here may
        // stand between the panic and the abort.
        {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr().lock(), "{ABORT_MESSAGE}");
        }
        std::process::abort();
    }));
}
