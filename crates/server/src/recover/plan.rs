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

/// Whether the master closed every replica of `digest`'s carrier that the
/// backups holding `digest` list: it closes a carrier only after a newer
/// digest on another carrier was held by all of that one's backups, so
/// this digest is not the newest.
pub(super) fn carrier_closed(plan: &Plan, digests: &[Vec<LogDigest>], digest: &LogDigest) -> bool {
    let keepers: Vec<usize> = digests
        .iter()
        .enumerate()
        .filter(|(_, ds)| ds.iter().any(|d| d == digest))
        .map(|(b, _)| b)
        .collect();
    let holders = plan
        .segments
        .binary_search_by_key(&digest.segment, |p| p.segment)
        .map(|i| &plan.segments[i].holders[..])
        .unwrap_or_default();
    !holders
        .iter()
        .any(|h| keepers.contains(&h.backup) && !h.closed)
}

/// Refuse (`DataLost`) when the backups cannot show that no segment of the
/// chosen log is missing; replaying without one would silently lose every
/// object only it held (its every replica sat on backups that are gone,
/// say servers an operator removed, or the dead master's own). Refused:
/// - the newest digest found lists a segment no backup holds;
/// - its carrier's replicas are all closed: a newer digest was made, and
///   the backups that kept it are gone;
/// - no digest at all, but a closed replica: the master closes replicas
///   only once a digest was held, so the backups that kept it are gone.
///
/// The coordinator retries, so the recovery goes on once a disk holding
/// them is back. A log with replicas, none closed, and no digest (its first
/// round did not finish) is recovered unchecked, with a warning.
pub(super) fn check_digest(
    plan: &Plan,
    digests: &[Vec<LogDigest>],
    req: &RecoverTablet,
) -> Result<(), Refusal> {
    if plan.segments.is_empty() {
        return Ok(());
    }
    let tablet = format!(
        "tablet {}/{:#x} of dead server {}",
        req.table, req.start_hash, req.master
    );
    let retried = "not recovering the tablet without them (the recovery is retried: bring back \
                   a server whose disk held them, or give them up with `insitu table \
                   accept-loss` on the table)";
    let Some(digest) = newest_digest(digests, plan.log) else {
        let any_closed = plan
            .segments
            .iter()
            .any(|s| s.holders.iter().any(|h| h.closed));
        if any_closed {
            return Err((
                Status::DataLost,
                format!(
                    "{tablet}: no backup holds a digest of log {}, yet some of its segments \
                     are closed, so digests were made and the backups that kept them are gone: \
                     segments may be missing; {retried}",
                    plan.log
                ),
            ));
        }
        tracing::warn!(
            table = req.table,
            start_hash = req.start_hash,
            master = req.master,
            log = plan.log,
            "no backup holds a digest of this log and none of its replicas is closed: recovering what the backups hold without checking that no segment is missing"
        );
        return Ok(());
    };
    let missing = missing_segments(plan, digest);
    if !missing.is_empty() {
        return Err((
            Status::DataLost,
            format!(
                "{tablet}: segment(s) {missing:?} of log {} are listed in the log's digest {} \
                 but no backup holds them; {retried}",
                plan.log, digest.seq
            ),
        ));
    }
    if carrier_closed(plan, digests, digest) {
        return Err((
            Status::DataLost,
            format!(
                "{tablet}: the newest digest of log {} found (digest {}) was superseded (its \
                 carrier, segment {}, is closed) and no backup holds a newer one: segments \
                 may be missing; {retried}",
                plan.log, digest.seq, digest.segment
            ),
        ));
    }
    Ok(())
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

    /// A digest carried by its highest listed segment.
    fn digest(log: u64, seq: u64, segments: &[u64]) -> LogDigest {
        LogDigest {
            log,
            segment: segments.last().copied().unwrap_or(0),
            seq,
            segments: segments.to_vec(),
        }
    }

    fn req() -> RecoverTablet {
        RecoverTablet {
            table: 1,
            start_hash: 0,
            end_hash: u64::MAX,
            map_version: 1,
            master: 9,
            backups: Vec::new(),
            accept_missing: false,
        }
    }

    #[test]
    fn a_digest_on_a_closed_carrier_or_none_beside_closed_replicas_is_refused() {
        let listed = vec![
            vec![info(3, 1, 100, true), info(3, 4, 10, false)],
            vec![info(3, 1, 100, true), info(3, 4, 10, true)],
        ];
        let plan = plan_segments(&listed, 1, 0);
        // Kept with an open replica of its carrier (backup 0): the newest.
        let open = vec![vec![digest(3, 5, &[1, 4])], Vec::new()];
        assert!(!carrier_closed(&plan, &open, &open[0][0]));
        assert!(check_digest(&plan, &open, &req()).is_ok());
        // Only backup 1 keeps it, and its replica of the carrier is closed:
        // a newer digest exists somewhere.
        let closed = vec![Vec::new(), vec![digest(3, 5, &[1, 4])]];
        assert!(carrier_closed(&plan, &closed, &closed[1][0]));
        let (status, why) = check_digest(&plan, &closed, &req()).expect_err("superseded");
        assert_eq!(status, Status::DataLost);
        assert!(
            why.contains("superseded") && why.contains("segment 4"),
            "{why}"
        );
        // A carrier no keeper lists counts as closed.
        let elsewhere = vec![vec![digest(3, 6, &[1, 7])], Vec::new()];
        assert!(carrier_closed(&plan, &elsewhere, &elsewhere[0][0]));
        // No digest: refused beside a closed replica, unchecked without one.
        let (_, why) = check_digest(&plan, &[Vec::new(), Vec::new()], &req()).expect_err("closed");
        assert!(why.contains("no backup holds a digest"), "{why}");
        let first_round = plan_segments(&[vec![info(3, 1, 100, false)]], 1, 0);
        assert!(check_digest(&first_round, &[Vec::new()], &req()).is_ok());
    }

    #[test]
    fn the_newest_digest_names_the_segments_no_backup_holds() {
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
