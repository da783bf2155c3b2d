//! Helpers shared by insitu's tests and benchmarks, so that starting a child
//! process, finding a free port or drawing reproducible random numbers is
//! written once.
//!
//! - [`proc`]: a child process that is stopped when dropped, started and
//!   waited for until it prints its "ready" line.
//! - [`free_port`]: a loopback port that was free a moment ago.
//! - [`rng`]: a seeded generator, so a failing test reproduces.
//! - [`peer`]: a fake insitu peer (backup, shard, coordinator) on loopback.
//! - [`raw`]: raw request frames on plain sockets, e.g. frames never completed.
//! - [`redis_server_args`]: the flags of a throwaway `redis-server` on loopback.
//! - [`poll_until`]: wait, bounded, for state another task changes.
//! - [`env_or`]: a test's size or seed from the environment, for longer
//!   runs by hand than CI's.

pub mod peer;
pub mod proc;
pub mod raw;

pub use proc::{Proc, on_path};

/// Seeded random numbers: `fastrand`'s wyrand, fast enough for a load
/// generator's per-operation key choice and reproducible from its seed.
pub fn rng(seed: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(seed)
}

pub use fastrand::Rng;

/// Where `free_port` looks: below Linux's default ephemeral range
/// (32768-60999), which the kernel hands to outgoing connections and to
/// binds of port 0.
const FREE_PORTS: std::ops::Range<u32> = 20_000..32_000;

/// A loopback port that was free a moment ago (bound and released here).
///
/// Why not bind port 0: that hands out a port of the ephemeral range, where
/// any outgoing connection (a client of another test in the same process,
/// now that tests share binaries) may take it between this call and the
/// server's bind; measured as an `insitu up` refusing to start with
/// "Address already in use". Here each call of a process takes the next
/// port of `FREE_PORTS` after a start that differs per process (its pid),
/// so two calls of one process never return the same port (until 12,000
/// calls wrap around), outgoing connections never take one, and a port
/// another process holds is skipped by the bind. Callers that start
/// servers may still retry (see `Proc::spawn_retrying`).
pub fn free_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let width = FREE_PORTS.end - FREE_PORTS.start;
    // The first call of a process picks its start from the pid.
    let start = (std::process::id().wrapping_mul(7919)) % width;
    let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    let mut last_error = None;
    for _ in 0..width {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % width;
        let port = (FREE_PORTS.start + offset) as u16;
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(_released_on_drop) => return Ok(port),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| std::io::Error::other("no free port in 20000-31999")))
}

/// The flags of a throwaway `redis-server` on loopback at `port`, in memory
/// only (no RDB snapshots, no AOF): what every comparison with Redis starts
/// with; callers append theirs (later flags win).
pub fn redis_server_args(port: u16) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(String::from)
    .to_vec()
}

/// The number in environment variable `name`, or `default` when it is
/// unset or not a number. What randomized tests read their case count and
/// seed from: CI runs the default, a longer hunt sets the variable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Calls `check` every 5 ms, at most `polls` times, until it returns true;
/// whether it did. For a test that waits on what a server changes on its
/// own time (a buffer filling, a connection closing): bounded, so a
/// regression fails the test instead of hanging it.
pub async fn poll_until(polls: u32, mut check: impl FnMut() -> bool) -> bool {
    for _ in 0..polls {
        if check() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_reproduces_from_its_seed_and_is_uniform_enough() {
        let (mut a, mut b) = (rng(7), rng(7));
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            let x = a.u64(0..10);
            assert_eq!(x, b.u64(0..10));
            counts[x as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn free_port_is_bindable() {
        // Other test processes draw free ports at the same time and may take
        // one between our draw and our bind (the race every caller accepts):
        // one bind out of five draws must work.
        let bound = (0..5).any(|_| {
            let p = free_port().expect("a free port");
            std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()
        });
        assert!(bound, "five free ports in a row could not be bound");
    }

    #[test]
    fn free_ports_of_one_process_differ_and_avoid_the_ephemeral_range() {
        let ports: Vec<u16> = (0..200)
            .map(|_| free_port().expect("a free port"))
            .collect();
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        assert!(
            ports.iter().all(|&p| FREE_PORTS.contains(&u32::from(p))),
            "{ports:?}"
        );
    }
}
