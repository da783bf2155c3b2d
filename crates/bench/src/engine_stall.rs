//! The longest engine call, and what else happened during it: the
//! overwrite phase of `insitu bench engine` times every call on its own,
//! and asks the kernel around each one whether the thread was switched out
//! or faulted a page meanwhile. Why: on a shared machine a call that took
//! milliseconds may have spent them off the CPU, and the bound is on
//! the engine's own work. Both figures are reported: the longest call
//! whatever happened, and the longest one the kernel did not interrupt.
//!
//! A control runs the same way in the same run: calls of fixed work (value
//! copies into random slots of a pre-touched buffer) sized so that their
//! mean equals the overwrites' mean. Why the same mean: the chance that a
//! call is hit by a preemption or the host's steal grows with the time spent
//! inside calls, so a control of shorter calls would see fewer of them and
//! understate what the machine adds.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;

/// The bound the issue sets on one engine call.
pub(crate) const STALL_BOUND_NS: u64 = 500_000;

/// What timing a run of calls saw.
pub(crate) struct CallTimes {
    /// Every call's wall time, ns.
    pub call_ns: Histogram<u64>,
    /// The calls' own time, summed (not the loop's, with its clock reads).
    pub wall_total: Duration,
    /// The longest call's CPU time on this thread, ns. Unreliable on a
    /// virtual machine (calls were seen charged 400 us of CPU in 2 us of
    /// wall time), kept for comparison with earlier runs.
    pub cpu_ns_max: u64,
    pub calls_over_bound_cpu: u64,
    /// The longest call in which `work` reported doing extra work (the
    /// cleaner moved entries), and the longest in which it reported none.
    pub working_ns_max: u64,
    pub plain_ns_max: u64,
    /// The most extra work one call reported (entries the cleaner moved).
    pub work_max: u64,
    /// The longest call during which the thread was not switched out
    /// (voluntarily or not) and faulted no page: the engine's own time.
    pub undisturbed_ns_max: u64,
    pub undisturbed_calls_over_bound: u64,
    /// Calls during which the thread was switched out or faulted a page.
    pub disturbed_calls: u64,
}

/// Time `calls.len()` calls of `call` on `state`, each on its own.
/// `work_done` is a running total of extra work, read between calls
/// (outside the timing); it sees `state` too, hence the shared argument
/// rather than two closures capturing it.
pub(crate) fn time_calls<S>(
    calls: &[u32],
    state: &mut S,
    mut call: impl FnMut(&mut S, u32) -> Result<()>,
    mut work_done: impl FnMut(&S) -> u64,
) -> Result<CallTimes> {
    let mut t = CallTimes {
        call_ns: Histogram::new_with_bounds(1, 60_000_000_000, 3)?,
        wall_total: Duration::ZERO,
        cpu_ns_max: 0,
        calls_over_bound_cpu: 0,
        working_ns_max: 0,
        plain_ns_max: 0,
        work_max: 0,
        undisturbed_ns_max: 0,
        undisturbed_calls_over_bound: 0,
        disturbed_calls: 0,
    };
    for &i in calls {
        let work_before = work_done(state);
        let kernel_before = ThreadEvents::now();
        let cpu_before = thread_cpu_ns();
        let started = Instant::now();
        call(state, i)?;
        let wall = started.elapsed();
        let cpu_ns = thread_cpu_ns().saturating_sub(cpu_before);
        let disturbed = ThreadEvents::now() != kernel_before;
        let wall_ns = wall.as_nanos().max(1) as u64;
        t.wall_total += wall;
        t.call_ns.saturating_record(wall_ns);
        t.cpu_ns_max = t.cpu_ns_max.max(cpu_ns);
        t.calls_over_bound_cpu += u64::from(cpu_ns > STALL_BOUND_NS);
        let work = work_done(state) - work_before;
        t.work_max = t.work_max.max(work);
        let slot = if work > 0 {
            &mut t.working_ns_max
        } else {
            &mut t.plain_ns_max
        };
        *slot = (*slot).max(wall_ns);
        if disturbed {
            t.disturbed_calls += 1;
        } else {
            t.undisturbed_ns_max = t.undisturbed_ns_max.max(wall_ns);
            t.undisturbed_calls_over_bound += u64::from(wall_ns > STALL_BOUND_NS);
        }
    }
    Ok(t)
}

/// The control: as many calls as `picks`, each copying a `vb`-byte value
/// into `copies` random slots of a pre-touched buffer, with `copies` chosen
/// so that a call's mean wall time is about `mean_ns` (the overwrites').
pub(crate) fn fixed_work_calls(picks: &[u32], vb: usize, mean_ns: f64) -> Result<CallTimes> {
    let slots = picks
        .iter()
        .map(|&i| i as usize + 1)
        .max()
        .unwrap_or(0)
        .max(1);
    // Filled with a non-zero byte so every page is touched here, not by a
    // timed call (a zeroed allocation's pages fault on first write).
    let mut buf = vec![1u8; slots * vb];
    let value = vec![0x5au8; vb];
    // A prime step scatters one call's copies over the buffer, so each one
    // misses the cache as an overwrite's index probe and log append do.
    let mut copy = |i: u32, copies: usize| {
        for j in 0..copies {
            let at = (i as usize + j * 7919) % slots * vb;
            buf[at..at + vb].copy_from_slice(black_box(&value));
            black_box(&buf[at]);
        }
    };
    // Calibrate: the mean of one copy over the first picks (warm, timed as
    // a whole so the clock's cost does not count).
    let sample = &picks[..picks.len().min(100_000)];
    let started = Instant::now();
    for &i in sample {
        copy(i, 1);
    }
    let one_copy_ns = started.elapsed().as_nanos() as f64 / sample.len().max(1) as f64;
    let copies = (mean_ns / one_copy_ns.max(1.0)).round().max(1.0) as usize;
    time_calls(
        picks,
        &mut copy,
        |copy, i| {
            copy(i, copies);
            Ok(())
        },
        |_| 0,
    )
}

/// Counts the kernel keeps per thread of what interrupts it: context
/// switches (voluntary: it blocked; involuntary: it was preempted) and page
/// faults (minor: mapped a page; major: read one in).
#[derive(Clone, Copy, PartialEq, Eq)]
struct ThreadEvents {
    switches_voluntary: i64,
    switches_involuntary: i64,
    faults_minor: i64,
    faults_major: i64,
}

impl ThreadEvents {
    fn now() -> ThreadEvents {
        // SAFETY: an all-zero `rusage` is a valid value of the plain C
        // struct, and `getrusage` only writes into the one it is given, for
        // the call's duration. On failure it stays zeroed, so the counts
        // compare equal ("undisturbed"): the figure can only miss events.
        let ru = unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
            ru
        };
        ThreadEvents {
            switches_voluntary: ru.ru_nvcsw,
            switches_involuntary: ru.ru_nivcsw,
            faults_minor: ru.ru_minflt,
            faults_major: ru.ru_majflt,
        }
    }
}

/// Time the machine's virtual CPUs were ready to run but the host ran
/// something else (steal), all CPUs summed, in ms; `None` where the kernel
/// does not say. Read around the overwrite phase: steal is invisible to a
/// thread's own counters, and is the one cause of a long call no
/// per-call figure here can rule out.
pub(crate) fn steal_ms() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?;
    // "cpu user nice system idle iowait irq softirq steal ...", in clock ticks.
    let steal_ticks: f64 = cpu.split_whitespace().nth(8)?.parse().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks_per_s > 0).then(|| steal_ticks * 1000.0 / ticks_per_s as f64)
}

/// CPU time this thread has used, in ns (user and system; 0 if the clock
/// cannot be read).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration;
    // CLOCK_THREAD_CPUTIME_ID is supported on every Linux this runs on, and
    // a failure leaves `ts` zeroed, which the caller reads as 0.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that sleeps blocks (a voluntary switch): it is counted as
    /// disturbed and left out of the undisturbed maximum, while the plain
    /// maximum sees it. A call that spins is undisturbed unless preempted.
    #[test]
    fn a_blocking_call_is_disturbed() {
        let t = time_calls(
            &[0, 1, 0],
            &mut (),
            |_, i| {
                if i == 1 {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Ok(())
            },
            |_| 0,
        )
        .expect("timed");
        assert!(t.disturbed_calls >= 1, "the sleep switched the thread out");
        assert!(t.plain_ns_max >= 2_000_000, "the sleep is in the wall time");
        assert!(
            t.undisturbed_ns_max < 2_000_000,
            "the sleeping call is not undisturbed: {} ns",
            t.undisturbed_ns_max
        );
    }

    #[test]
    fn the_control_runs_every_call() {
        let picks: Vec<u32> = (0..1000).map(|i| (i * 37) % 500).collect();
        let t = fixed_work_calls(&picks, 100, 1_000.0).expect("control");
        assert_eq!(t.call_ns.len(), 1000);
        assert!(t.wall_total > Duration::ZERO);
    }
}
