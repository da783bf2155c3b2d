//! The bank workload of `insitu bench txn`: concurrent transfers between
//! accounts and two kinds of concurrent audits: a read-only transaction at
//! a snapshot reading every account (recorded for the history checker), and a
//! sum of every balance computed on the servers at one snapshot
//! (`AtSnapshot::On`).
//!
//! A balance is stored as 16 bytes: the balance (i64, little-endian), then
//! the tag of the attempt that wrote it (0: the initial value). Tags make
//! the history checkable: each read names the transaction whose write it
//! saw (`insitu_txn::checker`).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use insitu_client::txn::is_retryable;
use insitu_client::{AtSnapshot, Client, ClientConfig, Selection};
use insitu_protocol::plan::Field;
use insitu_txn::checker::{Outcome, Recorded, Verdict, check, decode_balance, encode_balance};

/// Every account's balance at the start.
const INITIAL: i64 = 1000;

/// What the bank run found.
pub struct BankOutcome {
    /// Committed audits whose sum was not the initial total, plus one if the
    /// final total differs.
    pub violations: u64,
    pub transfers: u64,
    pub audits: u64,
    /// Sums at a snapshot computed, and those that were not the total (or
    /// did not count every account).
    pub snapshot_audits: u64,
    pub snapshot_violations: u64,
    /// Mean time of one sum at a snapshot, milliseconds.
    pub snapshot_audit_mean_ms: f64,
    /// Attempts recorded (committed or not).
    pub recorded: usize,
    pub verdict: Verdict,
}

/// Run `movers` transferring clients and one auditor for `seconds` over
/// `accounts` accounts of table `t`.
pub async fn run(
    addr: &str,
    t: u64,
    accounts: u64,
    movers: usize,
    seconds: f64,
) -> anyhow::Result<BankOutcome> {
    let config = ClientConfig {
        op_timeout: Duration::from_secs(60),
        ..ClientConfig::default()
    };
    let client = Client::connect_with(addr, config.clone()).await?;
    let keys: Vec<Vec<u8>> = (0..accounts)
        .map(|a| format!("acct{a:06}").into_bytes())
        .collect();
    let items: Vec<(Vec<u8>, [u8; 16])> = keys
        .iter()
        .map(|k| (k.clone(), encode_balance(INITIAL, 0)))
        .collect();
    for r in client.multi_write(t, &items).await? {
        r?;
    }
    let total = INITIAL * accounts as i64;
    let keys = Rc::new(keys);
    let history = Rc::new(RefCell::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for m in 0..movers {
        let client = Client::connect_with(addr, config.clone()).await?;
        let (keys, history) = (keys.clone(), history.clone());
        tasks.push(tokio::task::spawn_local(async move {
            let mut rng = insitu_testkit::rng(1000 + m as u64);
            let mut moved = 0u64;
            while Instant::now() < deadline {
                let (a, b) = (rng.usize(0..keys.len()), rng.usize(0..keys.len()));
                if a == b {
                    continue;
                }
                let amount = rng.i64(1..=50);
                let (ka, kb) = (&keys[a], &keys[b]);
                loop {
                    let tag = rng.u64(1..);
                    let mut tx = client.begin();
                    let v = tx.read_many(t, &[ka, kb]).await?;
                    let ((x, wx), (y, wy)) = (
                        decode_balance(v[0].as_deref()),
                        decode_balance(v[1].as_deref()),
                    );
                    tx.write(t, ka, encode_balance(x - amount, tag));
                    tx.write(t, kb, encode_balance(y + amount, tag));
                    let outcome = tx.commit().await;
                    history.borrow_mut().push(Recorded {
                        id: tag,
                        outcome: if outcome.is_ok() {
                            Outcome::Committed
                        } else {
                            Outcome::Aborted
                        },
                        reads: vec![(ka.clone(), wx), (kb.clone(), wy)],
                        writes: vec![ka.clone(), kb.clone()],
                    });
                    match outcome {
                        Ok(()) => break,
                        Err(e) if is_retryable(&e) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                moved += 1;
            }
            anyhow::Ok(moved)
        }));
    }
    let snapshot_auditor = {
        let client = Client::connect_with(addr, config.clone()).await?;
        tokio::task::spawn_local(async move {
            let sel = Selection {
                at_snapshot: AtSnapshot::On,
                ..Selection::all()
            };
            let (mut audits, mut violations, mut spent) = (0u64, 0u64, Duration::ZERO);
            while Instant::now() < deadline {
                let started = Instant::now();
                let a = client.aggregate(t, Field::I64(0), &sel).await?;
                spent += started.elapsed();
                audits += 1;
                if a.sum_int != total as i128 || a.count != accounts {
                    violations += 1;
                }
            }
            anyhow::Ok((audits, violations, spent))
        })
    };
    let auditor = {
        let client = Client::connect_with(addr, config).await?;
        let (keys, history) = (keys.clone(), history.clone());
        tokio::task::spawn_local(async move {
            let mut rng = insitu_testkit::rng(7);
            let (mut audits, mut violations) = (0u64, 0u64);
            while Instant::now() < deadline {
                // A read-only transaction at a snapshot: nothing to
                // validate, so it never aborts.
                let keys = &keys;
                let seen: Vec<(i64, Option<u64>)> = client
                    .read_only(|snap| async move {
                        let mut seen = Vec::with_capacity(keys.len());
                        for found in snap.multi_read(t, keys).await? {
                            seen.push(decode_balance(found?.as_ref().map(|(v, _)| &v[..])));
                        }
                        Ok(seen)
                    })
                    .await?;
                history.borrow_mut().push(Recorded {
                    id: rng.u64(1..),
                    outcome: Outcome::Committed,
                    reads: keys
                        .iter()
                        .zip(&seen)
                        .map(|(k, (_, w))| (k.clone(), *w))
                        .collect(),
                    writes: Vec::new(),
                });
                audits += 1;
                if seen.iter().map(|(b, _)| b).sum::<i64>() != total {
                    violations += 1;
                }
            }
            anyhow::Ok((audits, violations))
        })
    };
    let mut transfers = 0;
    for task in tasks {
        transfers += task.await??;
    }
    let (audits, mut violations) = auditor.await??;
    let (snapshot_audits, snapshot_violations, spent) = snapshot_auditor.await??;
    let last = client.multi_read(t, &keys).await?;
    let mut sum = 0;
    for r in last {
        sum += decode_balance(r?.as_ref().map(|(v, _)| &v[..])).0;
    }
    if sum != total {
        violations += 1;
    }
    let history = history.take();
    let verdict = check(&history);
    Ok(BankOutcome {
        violations,
        transfers,
        audits,
        snapshot_audits,
        snapshot_violations,
        snapshot_audit_mean_ms: spent.as_secs_f64() * 1e3 / snapshot_audits.max(1) as f64,
        recorded: history.len(),
        verdict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balances_round_trip_with_their_writer() {
        assert_eq!(decode_balance(Some(&encode_balance(-5, 9))), (-5, Some(9)));
        assert_eq!(decode_balance(Some(&encode_balance(1000, 0))), (1000, None));
        assert_eq!(decode_balance(Some(b"short")), (0, None));
        assert_eq!(decode_balance(None), (0, None));
    }
}
