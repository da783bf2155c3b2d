//! Tablets whose objects were lost: a server that held them in memory only
//! (R = 0, or a retired server of an earlier run) died, and the tablet was
//! re-created empty elsewhere.
//!
//! Nothing is silent about it:
//! - the tablet is recorded in `data_lost` (redb) in the transaction that
//!   orphans it (`Model::lose_tablets_ops`) or re-homes it (`rehome`), and
//!   the map shows it (`TabletInfo::lost_from`), so `count` and `agg` warn;
//! - before the re-created tablet serves, its shard gets `MarkLost`: a read
//!   of a key it does not hold answers `Status::DataLost` ("it may have
//!   existed") instead of "no such object";
//! - the same request raises the tablet's version counter to a *floor*
//!   above every version the lost copy can have handed out, so a key
//!   rewritten after the loss never gets a version it had before (a client
//!   holding an old version can never make a conditional write succeed
//!   against a different object);
//! - an operator acknowledges with `insitu table ack-loss NAME` (`AckLoss`):
//!   the shards clear the mark, then the rows go.
//!
//! # Why the floor is above every lost version
//! Nothing durable says how far the dead copy's counter had gone (R = 0
//! keeps no log), so the floor is taken from the wall clock:
//! `max(now_us * 2^11, previous floor + 2^40)`, recorded in redb (counter
//! `lost_version_floor`) before any shard receives it. A tablet's counter
//! moves only by one per write, by a move or recovery (which carries
//! another copy's counter, no higher than the copy's own), or by a floor.
//! One shard writes at most ~10^7 objects per second, far below the 2,048
//! versions per microsecond the clock term allows, so a counter that never
//! got a floor stays below `now_us * 2^11` for ever, and one that got floor
//! F stays below the next floor unless it handed out more than 2^40
//! (~10^12) versions since *and* the clock ran backwards for that long.
//! Floors are capped at `MAX_FLOOR`, which leaves every counter 2^62
//! versions of room (the clock term reaches the cap in the year ~2180).

use insitu_protocol::{Request, Response, Status};
use tracing::{info, warn};

use crate::model::{LOST_VERSION_FLOOR, Model, Op};
use crate::service::{Coordinator, Reject, Reply};
use crate::shards::{CONTROL_TIMEOUT, CallError};

/// Versions per microsecond of wall clock the floor allows for, as a shift.
const CLOCK_SHIFT: u32 = 11;
/// Each floor is at least this far above the previous one.
const FLOOR_STEP: u64 = 1 << 40;
/// The highest floor: 2^62 versions below the engine's last one.
pub(crate) const MAX_FLOOR: u64 = u64::MAX - 1 - (1 << 62);

// Every floor leaves a counter 2^62 versions of room.
const _: () = assert!(u64::MAX - 1 - MAX_FLOOR >= 1 << 62);

/// The next version floor after `previous`, at `now_us` (microseconds since
/// the epoch); see the module docs for why it is above every lost version.
pub(crate) fn next_floor(previous: u64, now_us: u64) -> u64 {
    now_us
        .saturating_mul(1 << CLOCK_SHIFT)
        .max(previous.saturating_add(FLOOR_STEP))
        .min(MAX_FLOOR)
}

/// `MarkLost` for tablet `start_hash` of `table` on `addr`.
pub(crate) fn mark_request(
    table: u64,
    start_hash: u64,
    lost_from: u64,
    version_floor: u64,
) -> Request<'static> {
    Request::MarkLost {
        table,
        start_hash,
        lost_from,
        version_floor,
    }
}

impl Coordinator {
    /// A new version floor and the op that records it (commit it before, or
    /// with, anything that hands the floor to a shard).
    pub(crate) fn take_floor(&self) -> (u64, Op) {
        let previous = self.model().lost_version_floor;
        let floor = next_floor(previous, crate::oracle::now_micros());
        (floor, Op::Counter(LOST_VERSION_FLOOR, floor))
    }

    /// Mark tablet `start_hash` of `table` on shard `addr` as lost with
    /// server `master`, with a fresh version floor recorded first. Called
    /// before the tablet is activated there.
    pub(crate) async fn mark_lost_on(
        &self,
        addr: &str,
        table: u64,
        start_hash: u64,
        master: u64,
    ) -> Result<(), CallError> {
        let floor = {
            let guard = self.meta_lock.lock().await;
            let (floor, op) = self.take_floor();
            self.commit(&guard, vec![op]).await.map_err(|e| {
                CallError::Transport(format!("recording a version floor: {}", e.message))
            })?;
            floor
        };
        let request = mark_request(table, start_hash, master, floor);
        self.call_with_retries(addr, &request, CONTROL_TIMEOUT)
            .await
    }

    /// `AckLoss`: clear the mark of every lost tablet of table `name` on its
    /// owner, then delete the rows. Refused with `Retry` while one of them
    /// has no live owner (being recovered again: that recovery marks it
    /// anew) or an owner does not confirm; idempotent.
    pub(crate) async fn ack_loss(&self, name: String) -> Reply {
        // Recoveries and moves hold it: none changes an owner meanwhile.
        let _moves = self.move_lock.lock().await;
        let (id, marked) = {
            let model = self.model();
            let Some(&id) = model.by_name.get(&name) else {
                return Err(Reject::new(
                    Status::UnknownTable,
                    format!("no table named {name:?}"),
                ));
            };
            let table = model.tables.get(&id);
            let mut marked = Vec::new();
            for (&(_, index), &master) in model.data_lost.range((id, 0)..=(id, u32::MAX)) {
                let Some(t) = table.and_then(|t| t.tablets.get(index as usize)) else {
                    continue;
                };
                let addr = model.shard_addr(t.server_id, t.shard).map(str::to_string);
                let Some(addr) = addr.filter(|_| !t.is_orphaned()) else {
                    return Err(Reject::new(
                        Status::Retry,
                        format!(
                            "tablet {index} of table {name:?} has no live server yet (it is being recovered); acknowledge the loss once it serves"
                        ),
                    ));
                };
                marked.push((index, t.start_hash, master, addr));
            }
            (id, marked)
        };
        for (index, start_hash, _, addr) in &marked {
            let request = mark_request(id, *start_hash, 0, 0);
            if let Err(e) = self
                .call_with_retries(addr, &request, CONTROL_TIMEOUT)
                .await
            {
                return Err(Reject::new(
                    Status::Retry,
                    format!(
                        "tablet {index} of table {name:?} on {addr} did not confirm the acknowledgement ({e}); nothing was acknowledged, try again"
                    ),
                ));
            }
        }
        if marked.is_empty() {
            return Ok(Response::LossAcknowledged { tablets: 0 });
        }
        let guard = self.meta_lock.lock().await;
        let ops = marked
            .iter()
            .map(|(index, ..)| Op::DeleteDataLost {
                table: id,
                index: *index,
            })
            .collect();
        self.commit(&guard, ops).await?;
        let masters: Vec<u64> = marked.iter().map(|m| m.2).collect();
        info!(table = %name, tablets = marked.len(), lost_with = ?masters,
            "an operator acknowledged the loss of a table's objects");
        Ok(Response::LossAcknowledged {
            tablets: u32::try_from(marked.len()).unwrap_or(u32::MAX),
        })
    }
}

impl Coordinator {
    /// `AcceptLoss`: an operator gives up what no backup holds of table
    /// `name`'s tablets waiting for recovery (their disks are gone for
    /// good, so the log's digest keeps refusing). Each is recorded in
    /// `data_lost` with the master it is lost from: its next recovery is
    /// sent `accept_missing` (what the backups hold is replayed) and, like
    /// a tablet of an R = 0 server, it is marked lost with a version floor
    /// before it serves, until `AckLoss`. Idempotent; answers how many
    /// tablets were given up now.
    pub(crate) async fn accept_loss(&self, name: String) -> Reply {
        // Recoveries hold it: none is in flight with the flag read before
        // the rows, so none activates a tablet this marks lost needlessly.
        let _moves = self.move_lock.lock().await;
        let guard = self.meta_lock.lock().await;
        let ops: Vec<Op> = {
            let model = self.model();
            let Some(&id) = model.by_name.get(&name) else {
                return Err(Reject::new(
                    Status::UnknownTable,
                    format!("no table named {name:?}"),
                ));
            };
            model
                .lost_from
                .range((id, 0)..=(id, u32::MAX))
                .filter(|(key, _)| !model.data_lost.contains_key(key))
                // A row naming a live server: recovered, held by its owner's
                // replicas, awaiting writes (`recovery/finish.rs`).
                .filter(|(_, master)| !model.is_live(**master))
                .map(|(&(table, index), &master)| Op::PutDataLost {
                    table,
                    index,
                    master,
                })
                .collect()
        };
        let tablets = ops.len();
        if tablets > 0 {
            self.commit(&guard, ops).await?;
            warn!(table = %name, tablets,
                "an operator gave up what no backup holds of a table's tablets waiting for recovery; they are recovered from what is held and marked lost");
            // The driver may be sleeping out a back-off of up to seconds
            // after the refusals this answers: start the recovery now.
            self.recovery_wake.notify_one();
        }
        Ok(Response::LossAcknowledged {
            tablets: u32::try_from(tablets).unwrap_or(u32::MAX),
        })
    }
}

/// Refuse a move of a tablet marked lost (a move carries neither the mark
/// nor the floor): tablet `index` of table `id` named `name`.
pub(crate) fn refuse_lost_move(
    model: &Model,
    id: u64,
    index: u32,
    name: &str,
) -> Result<(), Reject> {
    if let Some(master) = model.data_lost.get(&(id, index)) {
        warn!(table = %name, index, "refused to move a tablet whose objects were lost");
        return Err(Reject::new(
            Status::BadRequest,
            format!(
                "tablet {index} of table {name:?} lost its objects with server {master}; acknowledge that with `insitu table ack-loss {name}` before moving it"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_follows_the_clock_and_always_rises() {
        let now = 1_800_000_000_000_000; // 2027, in microseconds
        let first = next_floor(0, now);
        assert_eq!(first, now << CLOCK_SHIFT);
        // The clock stood still or went back: still higher, by the step.
        assert_eq!(next_floor(first, now), first + FLOOR_STEP);
        assert_eq!(next_floor(first, now / 2), first + FLOOR_STEP);
        // The clock moved on by more than the step's worth.
        assert_eq!(
            next_floor(first, now + (1 << 30)),
            (now + (1 << 30)) << CLOCK_SHIFT
        );
        // Far future or a wild clock: capped, leaving 2^62 versions of room.
        assert_eq!(next_floor(0, u64::MAX), MAX_FLOOR);
        assert_eq!(next_floor(MAX_FLOOR, 0), MAX_FLOOR);
        // Today's floor is far above anything a tablet counts to by writes
        // alone (10^7 per second for 100 years is ~3 * 10^16).
        assert!(first > 10_000_000 * 3_600 * 24 * 365 * 100);
    }
}
