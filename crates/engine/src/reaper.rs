//! Segment buffers handed back to the allocator off the caller's thread.
//!
//! Why: a segment buffer is 2 MiB, above the allocator's mmap threshold or
//! at the top of its heap, so dropping one is a `munmap` or a heap trim. On
//! a virtual machine that costs 0.3-0.7 ms of the dropping thread's CPU
//! (page-table teardown, TLB shootdown), measured as the longest overwrite
//! calls in CPU time (`insitu bench engine`, `max_write_stall_cpu_us`) once
//! cleaning ran in slices. The budget keeps a few freed buffers as spares
//! (`Budget::free`); the ones it cannot keep come here, and one thread per
//! process drops them, so a shard's write never pays for a free.
//!
//! The budget stops counting a buffer when it is handed over; the memory
//! goes back to the system microseconds later, when the thread drops it.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};

/// The reaper's queue, started on first use; `None` if its thread could
/// not be started (then buffers are dropped where they are released).
static REAPER: OnceLock<Option<Sender<Vec<u8>>>> = OnceLock::new();

/// Buffers released so far in this process (tests check that a free the
/// budget does not keep comes here).
static RELEASED: AtomicU64 = AtomicU64::new(0);

/// Buffers handed to `release` so far in this process.
#[cfg(test)]
pub(crate) fn released() -> u64 {
    RELEASED.load(Ordering::Relaxed)
}

/// Start the reaper thread if it is not running yet. Called when an
/// engine's budget is made, so that no write pays for starting a thread
/// (0.1 ms or more here) when its first segment is freed.
pub(crate) fn start() {
    reaper();
}

/// Drop `buf` on the reaper thread (or here, if there is none).
pub(crate) fn release(buf: Vec<u8>) {
    RELEASED.fetch_add(1, Ordering::Relaxed);
    match reaper() {
        // A send fails only if the thread ended: drop the buffer here.
        Some(tx) => drop(tx.send(buf)),
        None => drop(buf),
    }
}

/// The reaper's queue, its thread started on the first call.
fn reaper() -> &'static Option<Sender<Vec<u8>>> {
    REAPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        std::thread::Builder::new()
            .name("insitu-reaper".into())
            .spawn(move || {
                // Ends when every sender is gone, i.e. never before exit.
                for buf in rx {
                    drop(buf);
                }
            })
            .ok()
            .map(|_| tx)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_buffers_are_dropped_off_this_thread() {
        // Many releases from several threads go through one queue and
        // none blocks or panics; the buffers' memory is the reaper's to
        // drop (not observable here beyond the calls returning).
        let handles: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..100 {
                        release(vec![7u8; 64 * 1024]);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a releasing thread panicked");
        }
        assert!(
            REAPER.get().is_some_and(|r| r.is_some()),
            "the reaper thread runs"
        );
    }
}
