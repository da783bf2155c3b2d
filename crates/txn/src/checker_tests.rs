use super::*;

fn t(id: u64, reads: &[(&str, Writer)], writes: &[&str]) -> Recorded {
    Recorded {
        id,
        outcome: Outcome::Committed,
        reads: reads
            .iter()
            .map(|(k, w)| (k.as_bytes().to_vec(), *w))
            .collect(),
        writes: writes.iter().map(|k| k.as_bytes().to_vec()).collect(),
    }
}

#[test]
fn a_serial_history_has_no_anomaly() {
    let h = [
        t(1, &[("x", None), ("y", None)], &["x", "y"]),
        t(2, &[("x", Some(1)), ("y", Some(1))], &["x"]),
        t(3, &[("x", Some(2)), ("y", Some(1))], &[]),
    ];
    assert_eq!(check(&h), Verdict::default());
}

#[test]
fn a_lost_update_is_found() {
    let h = [t(1, &[("x", None)], &["x"]), t(2, &[("x", None)], &["x"])];
    let v = check(&h);
    assert_eq!(v.lost_updates, vec![(None, 1, 2)]);
    assert!(v.si_anomalies() >= 1);
}

#[test]
fn write_skew_is_g2_which_snapshot_isolation_allows() {
    let h = [
        t(1, &[("x", None), ("y", None)], &["x"]),
        t(2, &[("x", None), ("y", None)], &["y"]),
    ];
    let v = check(&h);
    assert_eq!(v.g2, vec![vec![1, 2]]);
    assert_eq!(v.si_anomalies(), 0);
    assert_eq!(v.serializability_anomalies(), 1);
}

#[test]
fn read_skew_is_g_single() {
    // T1 moves x to y; T2 saw x before and y after it.
    let h = [
        t(1, &[("x", None), ("y", None)], &["x", "y"]),
        t(2, &[("x", None), ("y", Some(1))], &[]),
    ];
    let v = check(&h);
    assert_eq!(v.g_single, vec![vec![1, 2]]);
    assert_eq!(v.si_anomalies(), 1);
}

#[test]
fn reading_an_aborted_write_is_g1a() {
    let mut aborted = t(1, &[("x", None)], &["x"]);
    aborted.outcome = Outcome::Aborted;
    let h = [aborted, t(2, &[("x", Some(1))], &[])];
    assert_eq!(check(&h).g1a, vec![(2, 1)]);
}

#[test]
fn circular_information_flow_is_g1c_and_dirty_writes_g0() {
    let g1c = [
        t(1, &[("x", None), ("y", Some(2))], &["x"]),
        t(2, &[("y", None), ("x", Some(1))], &["y"]),
    ];
    let v = check(&g1c);
    assert_eq!(v.g1c, vec![vec![1, 2]]);
    assert!(v.g0.is_empty());
    let g0 = [
        t(1, &[("x", None), ("y", Some(2))], &["x", "y"]),
        t(2, &[("y", None), ("x", Some(1))], &["x", "y"]),
    ];
    let v = check(&g0);
    assert_eq!(v.g0, vec![vec![1, 2]]);
}

#[test]
fn long_chains_do_not_overflow_the_stack() {
    // 100k read-modify-writes of one key, serial: no anomaly, no recursion.
    let mut h = vec![t(1, &[("x", None)], &["x"])];
    for i in 2..=100_000u64 {
        h.push(t(i, &[("x", Some(i - 1))], &["x"]));
    }
    assert_eq!(check(&h), Verdict::default());
}

fn with(outcome: Outcome, r: Recorded) -> Recorded {
    Recorded { outcome, ..r }
}

#[test]
fn an_unknown_outcome_counts_as_committed_once_its_write_is_read() {
    // 1's outcome is unknown; 2 read its write, so it committed: no G1a,
    // and 3, which overwrote the same value as 1, lost 1's update.
    let h = [
        with(Outcome::Unknown, t(1, &[("x", None)], &["x"])),
        t(2, &[("x", Some(1))], &[]),
        t(3, &[("x", None)], &["x"]),
    ];
    let v = check(&h);
    assert!(v.g1a.is_empty(), "{v:?}");
    assert_eq!(v.lost_updates, vec![(None, 1, 3)]);
}

#[test]
fn an_unknown_outcome_never_read_is_left_out() {
    // 1 may have committed or not; nothing saw it, so its read of x (the
    // value 2 also overwrote) is no lost update.
    let h = [
        with(Outcome::Unknown, t(1, &[("x", None)], &["x"])),
        t(2, &[("x", None)], &["x"]),
        t(3, &[("x", Some(2))], &[]),
    ];
    assert_eq!(check(&h), Verdict::default());
}

#[test]
fn unknown_outcomes_are_counted_through_a_chain_of_reads() {
    // 3 (committed) read 2's write, 2 (unknown) read 1's (unknown): both
    // committed, so 4's overwrite of the initial y, which 1 also
    // overwrote, is a lost update; and 5, aborted, read by nobody, is out.
    let h = [
        with(
            Outcome::Unknown,
            t(1, &[("x", None), ("y", None)], &["x", "y"]),
        ),
        with(Outcome::Unknown, t(2, &[("x", Some(1))], &["z"])),
        t(3, &[("z", Some(2))], &[]),
        t(4, &[("y", None)], &["y"]),
        with(Outcome::Aborted, t(5, &[("x", Some(1))], &["x"])),
    ];
    let v = check(&h);
    assert!(v.g1a.is_empty(), "{v:?}");
    assert_eq!(v.lost_updates, vec![(None, 1, 4)]);
}
