//! The limits a commit checks before sending anything (`within_limits`):
//! the per-shard key limit is also driven end to end by the Redis port's
//! big-MSET test; the shard limit only here, as it would take a cluster of
//! over 1,024 shards.

use std::collections::BTreeMap;

use insitu_protocol::Status;
use insitu_protocol::txn::{MAX_TXN_ITEMS, MAX_TXN_PARTICIPANTS};

use super::within_limits;
use crate::ClientError;

/// `shards` shares of `keys` keys each, by made-up address.
fn shares(shards: usize, keys: usize) -> BTreeMap<String, usize> {
    (0..shards)
        .map(|i| (format!("10.0.{}.{}:7000", i / 256, i % 256), keys))
        .collect()
}

/// The reason of a refusal, which must be a `BadRequest`.
fn refusal(r: Result<(), ClientError>) -> String {
    match r {
        Err(ClientError::Status(Status::BadRequest, why)) => why,
        other => panic!("expected a BadRequest refusal, got {other:?}"),
    }
}

#[test]
fn a_transaction_at_the_limits_passes() {
    assert!(within_limits(&shares(MAX_TXN_PARTICIPANTS, MAX_TXN_ITEMS), |n| *n).is_ok());
    assert!(within_limits(&shares(1, 1), |n| *n).is_ok());
}

#[test]
fn one_shard_over_the_key_limit_is_refused_by_name() {
    let mut s = shares(3, 10);
    s.insert("10.9.9.9:7000".into(), MAX_TXN_ITEMS + 1);
    let why = refusal(within_limits(&s, |n| *n));
    assert!(why.contains("10.9.9.9:7000"), "{why}");
    assert!(
        why.contains(&format!("touches {} keys", MAX_TXN_ITEMS + 1)),
        "{why}"
    );
    assert!(why.contains("nothing was written"), "{why}");
}

#[test]
fn a_transaction_over_the_shard_limit_is_refused() {
    let why = refusal(within_limits(&shares(MAX_TXN_PARTICIPANTS + 1, 1), |n| *n));
    assert!(
        why.contains(&format!("spans {} shards", MAX_TXN_PARTICIPANTS + 1)),
        "{why}"
    );
    assert!(why.contains("nothing was written"), "{why}");
}
