//! Which segments a recovery reads, from whom, and whether the log's
//! digest says any is missing (split from `recover.rs`).

use std::collections::BTreeMap;

use insitu_protocol::{LogDigest, ReplicaInfo, Status};

use super::{RecoverTablet, Refusal};

/// One backup's copy of one segment.
#[derive(Clone, Copy, Debug)]
pub(super) struct Holder {
    /// Index into the request's `backups` (and the connections).
    pub(super) backup: usize,
    /// Bytes it holds (listed, verified by the backup).
    pub(super) bytes: u64,
    /// The master closed the segment: `bytes` is its whole length.
    pub(super) closed: bool,
}

/// One segment of the chosen log and who holds it, best holder first.
pub(super) struct SegmentPlan {
    pub(super) segment: u64,
    pub(super) holders: Vec<Holder>,
    /// Index in `holders` of the copy in use (or to try next).
    pub(super) next: usize,
}

/// The newest log of the tablet and, per segment (by id), its holders.
pub(super) struct Plan {
    /// The chosen log id (0 when no replica of the tablet exists).
    pub(super) log: u64,
    pub(super) segments: Vec<SegmentPlan>,
}

/// Keep the replicas of (table, start_hash), take the highest log id, and
/// order each segment's holders: most bytes first, closed before open, and
/// among equally good holders a turn by segment id, so the reads of a
/// tablet are spread over its backups instead of all going to the first.
pub(super) fn plan_segments(listed: &[Vec<ReplicaInfo>], table: u64, start_hash: u64) -> Plan {
    let ours = || {
        listed.iter().enumerate().flat_map(move |(b, rs)| {
            rs.iter()
                .filter(move |r| r.table == table && r.start_hash == start_hash)
                .map(move |r| (b, r))
        })
    };
    let Some(log) = ours().map(|(_, r)| r.log).max() else {
        return Plan {
            log: 0,
            segments: Vec::new(),
        };
    };
    let mut by_segment: BTreeMap<u64, Vec<Holder>> = BTreeMap::new();
    for (backup, r) in ours().filter(|(_, r)| r.log == log) {
        let holders = by_segment.entry(r.segment).or_default();
        // A backup lists a replica once; a duplicate is ignored.
        if holders.iter().all(|h| h.backup != backup) {
            holders.push(Holder {
                backup,
                bytes: r.bytes,
                closed: r.closed,
            });
        }
    }
    let segments = by_segment
        .into_iter()
        .map(|(segment, mut holders)| {
            holders.sort_by(|a, b| {
                b.bytes
                    .cmp(&a.bytes)
                    .then(b.closed.cmp(&a.closed))
                    .then(a.backup.cmp(&b.backup))
            });
            let best = |h: &Holder| (h.bytes, h.closed) == (holders[0].bytes, holders[0].closed);
            let ties = holders.iter().take_while(|h| best(h)).count();
            holders[..ties].rotate_left((segment % ties as u64) as usize);
            SegmentPlan {
                segment,
                holders,
                next: 0,
            }
        })
        .collect();
    Plan { log, segments }
}

/// The newest digest of `log` any backup listed (the highest `seq`).
pub(super) fn newest_digest(digests: &[Vec<LogDigest>], log: u64) -> Option<&LogDigest> {
    digests
        .iter()
        .flatten()
        .filter(|d| d.log == log)
        .max_by_key(|d| d.seq)
}

/// The segments `digest` lists that no backup holds a replica of.
pub(super) fn missing_segments(plan: &Plan, digest: &LogDigest) -> Vec<u64> {
    digest
        .segments
        .iter()
        .copied()
        .filter(|s| {
            plan.segments
                .binary_search_by_key(s, |p| p.segment)
                .is_err()
        })
        .collect()
}

/// Refuse (`DataLost`) if the newest digest of the chosen log lists a
/// segment no backup holds: replaying without it would silently lose every
/// object only it held (its every replica sat on backups that are gone, say
/// servers an operator removed). The coordinator retries, so the recovery
/// goes on once a disk holding it is back. A log with replicas but no digest
/// (none of it was held by R backups yet, or its carrier's copies are all
/// gone) cannot be checked: logged.
pub(super) fn check_digest(
    plan: &Plan,
    digests: &[Vec<LogDigest>],
    req: &RecoverTablet,
) -> Result<(), Refusal> {
    if plan.segments.is_empty() {
        return Ok(());
    }
    let Some(digest) = newest_digest(digests, plan.log) else {
        tracing::warn!(
            table = req.table,
            start_hash = req.start_hash,
            master = req.master,
            log = plan.log,
            "no backup holds a digest of this log: recovering what the backups hold without checking that no segment is missing"
        );
        return Ok(());
    };
    let missing = missing_segments(plan, digest);
    if missing.is_empty() {
        return Ok(());
    }
    Err((
        Status::DataLost,
        format!(
            "tablet {}/{:#x} of dead server {}: segment(s) {missing:?} of log {} are listed in the \
             log's digest {} but no backup holds them; not recovering the tablet without them \
             (the recovery is retried: bring back a server whose disk held them)",
            req.table, req.start_hash, req.master, plan.log, digest.seq
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(log: u64, segment: u64, bytes: u64, closed: bool) -> ReplicaInfo {
        ReplicaInfo {
            log,
            table: 1,
            start_hash: 0,
            segment,
            bytes,
            closed,
        }
    }

    #[test]
    fn plan_takes_the_newest_log_and_orders_holders() {
        let other_tablet = ReplicaInfo {
            start_hash: 5,
            log: 99,
            ..info(0, 1, 10, true)
        };
        let listed = vec![
            vec![info(3, 1, 100, false), info(2, 7, 50, true), other_tablet],
            vec![info(3, 1, 100, true), info(3, 2, 40, false)],
            vec![info(3, 1, 120, false)],
        ];
        let plan = plan_segments(&listed, 1, 0);
        assert_eq!(
            plan.log, 3,
            "the highest log of the tablet, not of another tablet"
        );
        let order: Vec<(u64, Vec<usize>)> = plan
            .segments
            .iter()
            .map(|p| (p.segment, p.holders.iter().map(|h| h.backup).collect()))
            .collect();
        // Most bytes first, then closed before open.
        assert_eq!(order, vec![(1, vec![2, 1, 0]), (2, vec![1])]);
        assert_eq!(plan_segments(&listed, 2, 0).segments.len(), 0);
    }

    #[test]
    fn the_newest_digest_names_the_segments_no_backup_holds() {
        let digest = |log: u64, seq: u64, segments: &[u64]| LogDigest {
            log,
            seq,
            segments: segments.to_vec(),
        };
        let listed = vec![
            vec![info(3, 1, 100, true), info(3, 4, 10, false)],
            vec![info(3, 1, 100, true)],
        ];
        let digests = vec![
            vec![digest(3, 5, &[1, 2, 4]), digest(2, 9, &[1])],
            vec![digest(3, 4, &[1, 2, 3, 4])],
        ];
        let plan = plan_segments(&listed, 1, 0);
        let newest = newest_digest(&digests, plan.log).expect("log 3 has digests");
        assert_eq!(
            newest.seq, 5,
            "the highest seq of the log, not of another log"
        );
        assert_eq!(missing_segments(&plan, newest), vec![2]);
        assert_eq!(newest_digest(&digests, 7), None);
        let whole = digest(3, 6, &[1, 4]);
        assert!(missing_segments(&plan, &whole).is_empty());
    }

    #[test]
    fn equally_good_holders_take_turns_by_segment() {
        // Three backups hold every closed segment whole; a fourth holds a
        // shorter open copy of each, which always comes last.
        let listed: Vec<Vec<ReplicaInfo>> = (0..4)
            .map(|b| {
                (0..6)
                    .map(|s| match b {
                        3 => info(1, s, 50, false),
                        _ => info(1, s, 100, true),
                    })
                    .collect()
            })
            .collect();
        let plan = plan_segments(&listed, 1, 0);
        let firsts: Vec<usize> = plan.segments.iter().map(|p| p.holders[0].backup).collect();
        assert_eq!(firsts, vec![0, 1, 2, 0, 1, 2], "each backup serves a share");
        for p in &plan.segments {
            assert_eq!(p.holders.len(), 4);
            assert_eq!(
                p.holders[3].backup, 3,
                "the shorter copy stays the last resort"
            );
        }
    }
}
