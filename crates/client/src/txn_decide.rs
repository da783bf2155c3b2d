//! A transaction's decision on its way to the participants: the client's
//! own commit told to all of them at once after every yes vote
//! (`direct_commit`), and one decision to one participant (`decide`).
//! ARCHITECTURE.md, "Transactions".

use std::collections::BTreeMap;
use std::time::Instant;

use insitu_protocol::txn::TxnId;
use insitu_protocol::{Request, Response, Status};

use crate::client::decode;
use crate::error::ClientError;
use crate::routing::{Endpoint, call_endpoint};
use crate::txn::{Share, Vote, aborted};

/// Tell every participant of a transaction whose every vote was yes that it
/// commits, all at once (`direct`), and wait until each has applied it.
///
/// Why this is safe without the primary deciding first: each participant
/// that applies a commit keeps it durably beside its vote record before
/// its other parts change (`txn::settle_and_apply`), and a primary deciding
/// the orphan asks every participant first and adopts a commit one kept,
/// at its timestamp. A participant the primary has already asked refuses a
/// direct commit (the primary may commit at a timestamp of its own): it is
/// told the primary's answer instead, as is one whose direct call failed.
/// It saves the commit a round trip and a replication wait: the decision
/// reaches every participant in one (ARCHITECTURE.md, "Transactions").
pub(crate) async fn direct_commit(
    shares: &BTreeMap<String, Share>,
    votes: &[(String, Vote)],
    primary: &str,
    txn: TxnId,
    commit_ts: u64,
    deadline: Instant,
) -> Result<(), ClientError> {
    let tell = votes.iter().map(|(addr, _)| async move {
        // The primary's call is retried like any decision; another's is not
        // (a refusal sends it the primary's answer instead).
        let retry = addr == primary;
        let answer = decide(
            &shares[addr].ep,
            txn,
            (true, commit_ts),
            (true, retry),
            deadline,
        )
        .await;
        (addr.as_str(), answer)
    });
    let answers = futures::future::join_all(tell).await;
    let (mut standing, mut applied_somewhere) = (None, false);
    for (addr, answer) in &answers {
        match answer {
            Ok(decided) if *addr == primary => standing = Some(*decided),
            Ok((true, _)) => applied_somewhere = true,
            _ => {}
        }
    }
    let Some((committed, commit_ts)) = standing else {
        // A participant applied it: a commit is taken only after every yes
        // vote, and the primary adopts one a participant kept.
        if applied_somewhere {
            return Ok(());
        }
        let why = answers
            .iter()
            .find(|(addr, _)| *addr == primary)
            .and_then(|(_, a)| a.as_ref().err())
            .map_or_else(|| "no answer".to_string(), ToString::to_string);
        return Err(ClientError::TxnOutcomeUnknown {
            txn,
            why: format!("the deciding shard {primary} did not answer: {why}"),
        });
    };
    let mut relay = Vec::new();
    for (addr, answer) in &answers {
        match answer {
            _ if *addr == primary => {}
            Ok(decided) if *decided == (committed, commit_ts) => {}
            Ok((c, ts)) => {
                return Err(ClientError::Status(
                    Status::Internal,
                    format!(
                        "transaction {txn:#x}: {addr} answered committed={c} at {ts} where the primary {primary} answered committed={committed} at {commit_ts}"
                    ),
                ));
            }
            // Refused (the primary asked it first) or not reached: it takes
            // the primary's answer. One that does not hear it asks the
            // primary after its timeout, so a failed call loses nothing.
            Err(_) => relay.push(decide(
                &shares[*addr].ep,
                txn,
                (committed, commit_ts),
                (false, true),
                deadline,
            )),
        }
    }
    let _ = futures::future::join_all(relay).await;
    match committed {
        true => Ok(()),
        false => Err(aborted(txn, "the deciding shard aborted it")),
    }
}

/// Send the decision to one participant; its answer is the outcome there.
/// Answers the decision that stands there and its commit timestamp.
/// `direct`: the client's own commit after every yes vote, sent to all at
/// once. `retry`: whether a lost connection or a `Retry` answer is tried
/// again (not for a direct commit to a participant other than the primary,
/// which refuses it when it must take the primary's answer instead).
pub(crate) async fn decide(
    ep: &Endpoint,
    txn: TxnId,
    (commit, commit_ts): (bool, u64),
    (direct, retry): (bool, bool),
    deadline: Instant,
) -> Result<(bool, u64), ClientError> {
    let request = Request::TxnDecide {
        txn,
        commit,
        commit_ts,
        direct,
    };
    let reply = call_endpoint(ep, &request, retry, deadline).await?;
    crate::client::check_ok(&reply)?;
    match decode(&reply, &ep.addr)? {
        Response::TxnDecided {
            committed,
            commit_ts,
        } => Ok((committed, commit_ts)),
        other => Err(ClientError::unexpected(
            &ep.addr,
            format!("{other:?} to TxnDecide"),
        )),
    }
}
