//! Crash injection for process-level tests: with `INSITU_CRASH_AT` set to
//! `POINT:TXN` (a point below, a transaction id in hex), the server aborts
//! the moment it reaches `POINT` for transaction `TXN`, as a `kill -9` at
//! exactly that step would stop it. Unset (always, outside such tests), a
//! check is one load of a value read once.
//!
//! Why an environment variable and not a flag: it is no operator's option,
//! so `--help` does not show it; a test sets it on the processes it starts.
//! Why keyed by a transaction id: the other transactions of the same
//! servers go on normally, so the crash lands on one known step.
//!
//! Points:
//! - `prepare-after-part-records`: a participant with several parts made
//!   every part's record but its vote record durable (`txn.rs`, `prepare`),
//!   and has not written the vote record.

use std::sync::OnceLock;

/// The armed point and transaction, read from the environment once.
static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();

fn armed() -> &'static Option<(String, u64)> {
    ARMED.get_or_init(|| {
        let value = std::env::var("INSITU_CRASH_AT").ok()?;
        let (point, txn) = value.split_once(':')?;
        let txn = u64::from_str_radix(txn.trim_start_matches("0x"), 16).ok()?;
        Some((point.to_string(), txn))
    })
}

/// Abort the process here if `INSITU_CRASH_AT` names `point` and `txn`.
pub(crate) fn crash_point(point: &str, txn: u64) {
    if let Some((armed_point, armed_txn)) = armed()
        && armed_point == point
        && *armed_txn == txn
    {
        eprintln!("INSITU_CRASH_AT={point}:{txn:#x} reached: the server aborts");
        std::process::abort();
    }
}
