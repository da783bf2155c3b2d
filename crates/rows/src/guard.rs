//! Readers of untrusted bytes that panic instead of refusing: Arrow IPC
//! (`arrow_ipc`) and Parquet panic on some damaged inputs (a buffer slice
//! past its end, an unknown type; found by `tests.rs`'s damaged-stream
//! proptest and the CLI's damaged Parquet test). `guarded` runs such a read
//! with a panic turned into an error, and the panic not reported by the
//! process's hook (the error says it).
//!
//! Why a thread-local flag and a hook installed once, not a hook swapped per
//! call: readers run on several threads at once (a client's concurrent
//! answers), and take/set of the process-wide hook by two threads in
//! parallel can leave either one's hook in place for good. The hook installed
//! here wraps whatever hook was set before it (the servers' abort-on-panic
//! included) and calls it for every panic outside a guarded read.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

thread_local! {
    /// Whether this thread is inside `guarded` (its panics are the read's).
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

/// Installs the filtering hook, once per process.
static FILTER: Once = Once::new();

/// Run `read`; a panic in it becomes `Err("{what}: ...")` with the panic's
/// message. Not for code that keeps state across the panic: a reader's
/// state is dropped with it.
pub fn guarded<T>(what: &str, read: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    FILTER.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(Cell::get) {
                report(info);
            }
        }));
    });
    let was = GUARDED.with(|g| g.replace(true));
    let outcome = catch_unwind(AssertUnwindSafe(read));
    GUARDED.with(|g| g.set(was));
    match outcome {
        Ok(result) => result,
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no reason given");
            Err(format!("{what}: {why}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::guarded;

    #[test]
    fn a_panic_becomes_an_error_and_later_panics_are_still_panics() {
        let r: Result<(), String> = guarded("reading x", || panic!("slice past the end"));
        assert_eq!(r.unwrap_err(), "reading x: slice past the end");
        assert_eq!(guarded("reading y", || Ok(7)), Ok(7));
        assert_eq!(
            guarded::<()>("reading z", || Err("refused".into())),
            Err("refused".into())
        );
        // Outside a guarded read a panic unwinds as before.
        assert!(std::panic::catch_unwind(|| panic!("outside")).is_err());
    }
}
