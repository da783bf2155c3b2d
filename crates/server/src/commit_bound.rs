//! Per table, a bound on the timestamps of the transaction commits applied
//! to its objects: what a moving tablet carries, so that the shard it
//! arrives on can read snapshots taken before the move (`Versions::arrive`).
//!
//! Why. An arriving tablet brings its objects as they are; the values its
//! earlier commits replaced were kept (if at all) on the shard it left. A
//! snapshot at `S` read on the new shard sees the objects as they arrived
//! plus the commits applied here since (kept from the arrival on, as the
//! shard keeps versions while snapshots are read). That is the tablet as of
//! `S` exactly when no commit applied to it before the move is later than
//! `S`, that is when `S` is at or above the bound carried. Before, the new
//! shard learned a floor from the oracle after the arrival: every snapshot
//! taken before the move was refused, and under back-to-back moves a count
//! at a snapshot could be refused on every one of its retries.
//!
//! What the bound covers:
//! - per table, not per tablet: splits and merges need no care, and a bound
//!   too high only refuses more snapshots, never reads a wrong value;
//! - raised by every commit applied here, and by the bound every arriving
//!   tablet carries, so it covers the tablets' earlier stays elsewhere;
//! - *unknown* once a commit applied here had no timestamp (none was taken
//!   because no participant kept versions: its place among snapshots was
//!   never fixed), or a tablet arrived without a bound (recovered from
//!   backups: the dead server's commits are not known here). A tablet that
//!   moves out of an unknown table carries a timestamp fetched from the
//!   oracle after its last commit here was applied instead (that commit's
//!   timestamp, if it had one, was handed out before), and the fetch makes
//!   the table's bound known again if nothing made it unknown meanwhile
//!   (`marks`: a commit without a timestamp may be applied to another of
//!   its tablets while the fetch is out).
//!
//! Plain writes: while versions are kept they take a timestamp and raise
//! the bound like a commit (`stamped.rs`); otherwise they take none and
//! make it unknown, as a commit without a timestamp does, and so do
//! pushdown updates applied with no timestamp (`stamped::bulk_timestamp`)
//! and the Redis port's local writes.
//!
//! Why versions kept here in an earlier stay of a tablet stay harmless: such
//! a version's commit was applied here, so its timestamp is at or below this
//! shard's bound, which the tablet carried away (or a fetched timestamp,
//! which is higher) and which every later stay only raised. A snapshot the
//! tablet admits on its return is at or above it and never reads the version.

/// Tables with any commit applied here, or a tablet arrived: at most the
/// number of tables the cluster allows, 24 bytes each.
type FastMap<K, V> = hashbrown::HashMap<K, V>;

/// A table's bound, as known on this shard.
#[derive(Clone, Copy, Debug, Default)]
struct Bound {
    /// The highest commit timestamp applied or carried in.
    high: u64,
    /// A commit without a timestamp, or a tablet without a bound, came
    /// since the bound was last learned: `high` bounds nothing.
    unknown: bool,
    /// How many times it became unknown: a fetch begun before the latest
    /// does not make it known (`learned`).
    marks: u64,
}

/// The bound of every table a shard holds (missing: no commit was ever
/// applied to it here and no tablet of it arrived, so 0).
#[derive(Default)]
pub struct CommitBounds {
    tables: FastMap<u64, Bound>,
}

impl CommitBounds {
    /// The bound a tablet of `table` carries when it moves out now; None:
    /// unknown, and `Err(marks)` is what to give `learned` with the
    /// timestamp fetched instead.
    pub fn carried(&self, table: u64) -> Result<u64, u64> {
        match self.tables.get(&table) {
            None => Ok(0),
            Some(b) if b.unknown => Err(b.marks),
            Some(b) => Ok(b.high),
        }
    }

    /// A commit at `commit_ts` (0: none was taken) was applied to `table`.
    pub fn applied(&mut self, table: u64, commit_ts: u64) {
        self.raise(table, (commit_ts != 0).then_some(commit_ts));
    }

    /// A tablet of `table` arrived carrying `bound` (None: none known).
    pub fn arrived(&mut self, table: u64, bound: Option<u64>) {
        self.raise(table, bound);
    }

    /// `ts` was fetched from the oracle after every commit applied here
    /// until `carried` answered `Err(marks)`: the bound is known again,
    /// unless it became unknown once more meanwhile.
    pub fn learned(&mut self, table: u64, marks: u64, ts: u64) {
        let b = self.tables.entry(table).or_default();
        if b.marks == marks {
            b.unknown = false;
            b.high = b.high.max(ts);
        }
    }

    fn raise(&mut self, table: u64, ts: Option<u64>) {
        let b = self.tables.entry(table).or_default();
        match ts {
            Some(ts) => b.high = b.high.max(ts),
            None => {
                b.unknown = true;
                b.marks += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_only_rises_and_unknown_stays_until_learned() {
        let mut b = CommitBounds::default();
        assert_eq!(b.carried(1), Ok(0), "no commit: nothing to be above");
        b.applied(1, 40);
        b.applied(1, 30);
        assert_eq!(b.carried(1), Ok(40), "the highest commit");
        b.arrived(1, Some(35));
        assert_eq!(b.carried(1), Ok(40));
        b.arrived(1, Some(50));
        assert_eq!(b.carried(1), Ok(50), "a tablet's earlier stays count");
        assert_eq!(b.carried(2), Ok(0), "per table");

        b.applied(1, 0);
        let Err(marks) = b.carried(1) else {
            panic!("a commit without a timestamp")
        };
        b.applied(1, 90);
        b.arrived(1, Some(70));
        assert!(b.carried(1).is_err(), "unknown until learned");
        b.learned(1, marks, 80);
        assert_eq!(b.carried(1), Ok(90), "a commit during the fetch counts");

        b.arrived(2, None);
        let Err(first) = b.carried(2) else {
            panic!("a recovered tablet")
        };
        b.applied(2, 0);
        b.learned(2, first, 10);
        assert!(
            b.carried(2).is_err(),
            "unknown again while the fetch was out"
        );
        let Err(second) = b.carried(2) else {
            unreachable!()
        };
        b.learned(2, second, 20);
        b.learned(2, second, 5);
        assert_eq!(b.carried(2), Ok(20), "learning never lowers it");
    }
}
