//! Failure detection: every live server is pinged every `ping_interval` at
//! its backup service's address (shard 0's for a server that runs none), and
//! one that answers no ping for `failure_timeout` is declared dead
//! (`death.rs`).
//!
//! Why these rules:
//! - Any reply counts as alive, whatever its status: it proves the process
//!   runs and reads its socket, which is all a ping asks.
//! - One ping per server is in flight at a time, on a connection of the
//!   detector's own (never the shared control connection, where a long
//!   request would hold the ping up), with a timeout of half the failure
//!   timeout (at least one interval).
//! - Dead needs both `failure_timeout` since the last reply AND at least
//!   `MIN_FAILED_PINGS` failed pings since: a coordinator that was itself
//!   stalled (no pings sent) never declares anyone dead for it, and one slow
//!   reply is not a death.
//! - A server first seen (at start, or enlisted) counts as having answered
//!   then: servers of a previous run get a full timeout to answer.
//! - One exception to waiting out the timeout: a server that has answered a
//!   ping of this detector and whose address then *refuses* a connection is
//!   dead at once. A refused connect (the peer's kernel answered the SYN
//!   with a reset) means no process listens on the port: the one that
//!   answered is gone (killed, crashed, stopped), and a process that comes
//!   back on the address is a new incarnation without its memory, which is
//!   what a death declares. Why: silence needs the timeout to tell a dead
//!   process from a slow one, a refusal does not, so the common crash (the
//!   process dies, its host stays up) is detected in about one ping
//!   interval instead of `failure_timeout` (measured: `detect_ms` in
//!   BENCHMARKS.md, "Crash recovery"). A ping that fails on an established
//!   connection retries with one fresh connect to find out which it is. A
//!   server never answered in this run (one on record from a previous run,
//!   being restarted) still gets the full timeout.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use insitu_auth::Credentials;
use insitu_client::rpc::{RpcConn, RpcError};
use insitu_protocol::Request;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::service::Coordinator;

/// Failed pings needed (besides the timeout) to declare a server dead.
const MIN_FAILED_PINGS: u32 = 2;

/// The detector's settings (from `CoordinatorConfig`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub ping_interval: Duration,
    pub failure_timeout: Duration,
}

impl Timing {
    /// Half the failure timeout, at least one interval: two pings fit in a
    /// failure timeout, and a reply slower than this is a failed ping.
    fn ping_timeout(&self) -> Duration {
        (self.failure_timeout / 2).max(self.ping_interval)
    }
}

/// What the detector knows of one live server.
struct Watch {
    /// Where it is pinged (a change of address restarts the watch).
    addr: String,
    /// When its last reply arrived (or when it was first seen).
    last_ok: Instant,
    /// Pings failed since `last_ok`.
    failed: u32,
    /// A ping is on its way: no second one is sent meanwhile.
    in_flight: bool,
    /// It answered a ping of this detector: only then does a refused
    /// connection prove it gone (module comment).
    answered: bool,
    /// Its address refused a connection after it had answered: dead now.
    refused: bool,
}

impl Watch {
    /// Silent for `failure_timeout` AND at least `MIN_FAILED_PINGS` pings
    /// failed since its last reply (see the module comment for why both),
    /// or refusing connections after it had answered.
    fn is_dead(&self, now: Instant, failure_timeout: Duration) -> bool {
        self.refused
            || (self.failed >= MIN_FAILED_PINGS
                && now.duration_since(self.last_ok) >= failure_timeout)
    }

    /// Why it is dead (`is_dead` said so): the text its record keeps.
    fn death_reason(&self, timing: &Timing) -> String {
        if self.refused {
            format!("its address {} refuses connections", self.addr)
        } else {
            format!("no reply to pings for {:?}", timing.failure_timeout)
        }
    }

    /// Take one ping's outcome.
    fn record(&mut self, outcome: &Ping, at: Instant) {
        match outcome {
            Ping::Answered => {
                self.last_ok = at;
                self.failed = 0;
                self.answered = true;
            }
            Ping::Failed(_) => self.failed += 1,
            Ping::Refused(_) => {
                self.failed += 1;
                self.refused = self.answered;
            }
        }
    }
}

/// How one ping ended.
#[derive(Debug)]
enum Ping {
    /// A reply came (any status).
    Answered,
    /// No reply: timed out, or the connection broke (the text says which).
    Failed(String),
    /// The address refused a fresh connection: nothing listens there.
    Refused(String),
}

/// Whether a failed connect was refused by the peer (nothing listens).
fn connect_refused(e: &RpcError) -> bool {
    matches!(e, RpcError::Connect { source, .. }
        if source.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// The detector's connections, one per pinged address.
type Conns = Arc<Mutex<HashMap<String, RpcConn>>>;

/// One ping to `addr` within `timeout` (connecting if needed). A failed
/// connection is dropped, so the next ping reconnects; when the ping failed
/// on an established connection, one fresh connect tells a process that
/// is gone (refused) from one that is only slow or unreachable.
async fn ping(conns: Conns, member: Arc<Credentials>, addr: String, timeout: Duration) -> Ping {
    let lock = || conns.lock().unwrap_or_else(|e| e.into_inner());
    let cached = lock().get(&addr).filter(|c| !c.is_closed()).cloned();
    let reused = cached.is_some();
    let attempt = async {
        let conn = match cached {
            Some(c) => c,
            None => {
                let c = RpcConn::open(&addr, &member).await?;
                lock().insert(addr.clone(), c.clone());
                c
            }
        };
        conn.call(&Request::Ping).await.map(|_reply| ())
    };
    let started = Instant::now();
    let outcome = match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(())) => return Ping::Answered,
        Ok(Err(e)) if connect_refused(&e) => Ping::Refused(e.to_string()),
        Ok(Err(e)) => Ping::Failed(e.to_string()),
        Err(_) => Ping::Failed(format!("no reply within {timeout:?}")),
    };
    lock().remove(&addr);
    let left = timeout.saturating_sub(started.elapsed());
    match outcome {
        // The established connection broke: is anyone still listening?
        Ping::Failed(why) if reused && !left.is_zero() => {
            match tokio::time::timeout(left, RpcConn::open(&addr, &member)).await {
                Ok(Err(e)) if connect_refused(&e) => Ping::Refused(format!("{why}; then {e}")),
                // Connected again (the next ping uses it) or still unsure:
                // this ping failed either way.
                Ok(Ok(c)) => {
                    lock().insert(addr.clone(), c);
                    Ping::Failed(why)
                }
                _ => Ping::Failed(why),
            }
        }
        other => other,
    }
}

/// The detector: runs until `shutdown`.
pub(crate) async fn run_detector(
    coordinator: Arc<Coordinator>,
    timing: Timing,
    shutdown: CancellationToken,
) {
    let conns: Conns = Arc::default();
    let mut watched: HashMap<u64, Watch> = HashMap::new();
    // Each ping answers (server id, address, outcome, when it ended).
    let mut pings: JoinSet<(u64, String, Ping, Instant)> = JoinSet::new();
    let mut tick = tokio::time::interval(timing.ping_interval);
    // After a stall, resume the rhythm instead of firing a burst of ticks.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(done) = pings.join_next(), if !pings.is_empty() => match done {
                Ok((id, addr, outcome, at)) => {
                    let Some(w) = watched.get_mut(&id).filter(|w| w.addr == addr) else {
                        continue;
                    };
                    w.in_flight = false;
                    w.record(&outcome, at);
                    if let Ping::Failed(why) | Ping::Refused(why) = &outcome {
                        debug!(server_id = id, addr, failed = w.failed, "ping failed: {why}");
                    }
                    // Gone for certain: declared now, not at the next tick.
                    if w.refused {
                        let why = w.death_reason(&timing);
                        declare(&coordinator, &mut watched, vec![id], &why).await;
                    }
                }
                Err(e) => error!("a ping task failed: {e}"),
            },
            _ = tick.tick() => {
                let dead = round(&coordinator, &timing, &conns, &mut watched, &mut pings);
                // Declared together where the reason is the same (a refused
                // one here is one whose declaration failed to commit when
                // its refusal came: it keeps its own reason).
                let mut by_reason: BTreeMap<String, Vec<u64>> = BTreeMap::new();
                for id in dead {
                    if let Some(w) = watched.get(&id) {
                        by_reason.entry(w.death_reason(&timing)).or_default().push(id);
                    }
                }
                for (why, ids) in by_reason {
                    declare(&coordinator, &mut watched, ids, &why).await;
                }
            }
        }
    }
}

/// Declare `dead` dead and stop watching them.
async fn declare(
    coordinator: &Coordinator,
    watched: &mut HashMap<u64, Watch>,
    dead: Vec<u64>,
    why: &str,
) {
    match coordinator.declare_dead(&dead, why).await {
        Ok(_) => {
            for id in &dead {
                watched.remove(id);
            }
        }
        // Not committed: still live on record, and still dead by
        // `Watch::is_dead` in `watched`, so tried again next tick.
        Err(e) => warn!(servers = ?dead, "cannot declare servers dead ({why}): {}", e.message),
    }
}

/// One tick: start watching new live servers, forget the others, ping every
/// live server that has no ping in flight. Returns the servers to declare dead.
fn round(
    coordinator: &Coordinator,
    timing: &Timing,
    conns: &Conns,
    watched: &mut HashMap<u64, Watch>,
    pings: &mut JoinSet<(u64, String, Ping, Instant)>,
) -> Vec<u64> {
    let targets: Vec<(u64, String)> = {
        let model = coordinator.model();
        model
            .live_servers()
            .into_iter()
            .filter_map(|id| {
                let addr = match model.backup_addrs.get(&id) {
                    Some(backup) => backup.clone(),
                    None => model.servers.get(&id)?.first()?.clone(),
                };
                Some((id, addr))
            })
            .collect()
    };
    conns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|a, _| targets.iter().any(|(_, t)| t == a));
    let now = Instant::now();
    watched.retain(|id, w| targets.iter().any(|(t, a)| t == id && *a == w.addr));
    let mut dead = Vec::new();
    for (id, addr) in targets {
        let w = watched.entry(id).or_insert_with(|| Watch {
            addr: addr.clone(),
            last_ok: now,
            failed: 0,
            in_flight: false,
            answered: false,
            refused: false,
        });
        if w.is_dead(now, timing.failure_timeout) {
            dead.push(id);
            continue;
        }
        if !w.in_flight {
            w.in_flight = true;
            let (conns, timeout) = (conns.clone(), timing.ping_timeout());
            let member = coordinator.shards.credentials().clone();
            pings.spawn(async move {
                let outcome = ping(conns, member, addr.clone(), timeout).await;
                (id, addr, outcome, Instant::now())
            });
        }
    }
    dead
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_needs_both_the_timeout_and_failed_pings() {
        let start = Instant::now();
        let timeout = Duration::from_millis(500);
        let watch = |failed| Watch {
            addr: "127.0.0.1:1".into(),
            last_ok: start,
            failed,
            in_flight: false,
            answered: true,
            refused: false,
        };
        let later = start + Duration::from_secs(5);
        // A coordinator stalled for 5 s sent no pings: nobody is blamed.
        assert!(!watch(0).is_dead(later, timeout));
        // One slow reply is not a death.
        assert!(!watch(1).is_dead(later, timeout));
        assert!(watch(2).is_dead(later, timeout));
        // Failed pings within the timeout are not yet a death.
        assert!(!watch(5).is_dead(start + Duration::from_millis(499), timeout));
        assert!(watch(5).is_dead(start + timeout, timeout));
        let timing = Timing {
            ping_interval: Duration::from_millis(100),
            failure_timeout: timeout,
        };
        assert_eq!(timing.ping_timeout(), Duration::from_millis(250));
    }

    #[test]
    fn a_refusal_is_a_death_only_after_an_answer() {
        let start = Instant::now();
        let timeout = Duration::from_secs(3600);
        let refused = || Ping::Refused("connection refused".into());
        let mut w = Watch {
            addr: "127.0.0.1:1".into(),
            last_ok: start,
            failed: 0,
            in_flight: false,
            answered: false,
            refused: false,
        };
        // Never answered in this run (a server of a previous run, perhaps
        // being restarted): refusals count as failed pings only.
        w.record(&refused(), start);
        w.record(&refused(), start);
        assert!(!w.is_dead(start, timeout));
        assert_eq!(w.failed, 2);
        // It answers; a timeout or a broken connection is not yet a death...
        w.record(&Ping::Answered, start);
        assert_eq!(w.failed, 0);
        w.record(&Ping::Failed("no reply".into()), start);
        assert!(!w.is_dead(start, timeout));
        // ...but a refused connection after an answer is, long before the timeout.
        w.record(&refused(), start);
        assert!(w.is_dead(start, timeout));
        // And its record says so, also when it is declared at a tick (its
        // first declaration failed to commit), not that it fell silent.
        let timing = Timing {
            ping_interval: Duration::from_millis(100),
            failure_timeout: Duration::from_millis(500),
        };
        assert_eq!(
            w.death_reason(&timing),
            "its address 127.0.0.1:1 refuses connections"
        );
        w.refused = false;
        assert_eq!(w.death_reason(&timing), "no reply to pings for 500ms");
    }
}
