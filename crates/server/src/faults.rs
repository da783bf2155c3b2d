//! Crash and fault injection for tests: with `INSITU_CRASH_AT` set to
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
//! - `prepare-after-records`: a participant with several parts wrote every
//!   part's prepared record and made them durable (`txn.rs`, `prepare`),
//!   and its vote has not left.
//! - `decide-after-apply`: a participant applied a client's direct commit
//!   to every part and made it durable (`txn.rs`, `decide`), and has not
//!   answered.
//!
//! `INSITU_FAULT_AT`, in the same form, injects a state instead of a crash:
//! - `prepare-lose-part-records`: a participant with several parts writes
//!   its vote record and not its other parts' records, as a crash that
//!   kept the vote record's log and lost the others would leave them
//!   (`txn_durable::write_prepared`; `txn_proof` must then find no vote).
//! - `decide-lose-vote-part`: a participant that took the prepare from the
//!   client (not one a recovery brought back) applying a commit skips its
//!   vote part's group (its vote record stays, its
//!   writes there are not made), as a crash that kept its other parts'
//!   groups and lost that one would leave them (`txn_apply.rs`; a recovered
//!   vote record must then be proven `Committed` by a sibling's commit
//!   record, `txn_proof`).
//! - `prepare-no-promise`: the prepare gives up the log room it promised
//!   its decision, as a part taken back from its record by a recovery on a
//!   shard without room has none (`txn_room::room_for_commit`).
//! - `move-oracle-fails`, keyed by a *table* id instead: a tablet of that
//!   table moving out finds the timestamp oracle unreachable when it needs
//!   a bound on its commits (`migrate.rs`, `commit_ts_bound`), so it
//!   carries none and its destination learns a floor itself.

use std::sync::OnceLock;

/// The armed crash point and transaction, read from the environment once.
static CRASH: OnceLock<Option<(String, u64)>> = OnceLock::new();
/// The armed fault point and transaction, read from the environment once.
static FAULT: OnceLock<Option<(String, u64)>> = OnceLock::new();

fn armed(
    cell: &'static OnceLock<Option<(String, u64)>>,
    var: &str,
) -> &'static Option<(String, u64)> {
    cell.get_or_init(|| {
        let value = std::env::var(var).ok()?;
        let (point, txn) = value.split_once(':')?;
        let txn = u64::from_str_radix(txn.trim_start_matches("0x"), 16).ok()?;
        Some((point.to_string(), txn))
    })
}

fn is_armed(armed: &Option<(String, u64)>, point: &str, txn: u64) -> bool {
    armed.as_ref().is_some_and(|(p, t)| p == point && *t == txn)
}

/// Abort the process here if `INSITU_CRASH_AT` names `point` and `txn`.
pub(crate) fn crash_point(point: &str, txn: u64) {
    if is_armed(armed(&CRASH, "INSITU_CRASH_AT"), point, txn) {
        eprintln!("INSITU_CRASH_AT={point}:{txn:#x} reached: the server aborts");
        std::process::abort();
    }
}

/// Whether `INSITU_CRASH_AT` names `point` and `txn` (a caller first makes
/// the step's effects durable, so the crash lands after them).
pub(crate) fn crash_armed(point: &str, txn: u64) -> bool {
    is_armed(armed(&CRASH, "INSITU_CRASH_AT"), point, txn)
}

/// Whether `INSITU_FAULT_AT` names `point` and `txn`.
pub(crate) fn fault_at(point: &str, txn: u64) -> bool {
    let hit = is_armed(armed(&FAULT, "INSITU_FAULT_AT"), point, txn);
    if hit {
        tracing::warn!(
            txn,
            "INSITU_FAULT_AT={point}:{txn:#x} reached: fault injected"
        );
    }
    hit
}
