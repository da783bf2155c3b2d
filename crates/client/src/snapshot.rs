//! Read-only transactions at a snapshot: reads of any keys of any tables as
//! of one timestamp from the oracle. Every transaction committed at or
//! before it is seen whole, none after (ARCHITECTURE.md, "Snapshot reads").
//! Unlike a `Transaction`, nothing is validated or locked, so a read-only
//! transaction never aborts however many writes go on.
//!
//! A shard may refuse a snapshot it no longer (or does not yet) keep the
//! versions for (`Status::SnapshotTooOld`): the first snapshot read after a
//! quiet time always is, and so are snapshots older than a tablet's arrival
//! on a shard. `Client::read_only` then runs the body again at a fresh
//! timestamp; a `Snapshot` used directly reports the error.

use std::future::Future;

use bytes::Bytes;

use crate::client::{Client, Found};
use crate::error::ClientError;
use crate::ops::{AtSnapshot, MAX_SNAPSHOT_RETRIES, Selection};
use insitu_protocol::Status;
use insitu_protocol::plan::{AggPartial, Field};

/// A view of the store at one snapshot timestamp (cheap to clone).
#[derive(Clone)]
pub struct Snapshot {
    client: Client,
    /// The timestamp read at (from the oracle).
    ts: u64,
}

impl Client {
    /// A snapshot at a fresh timestamp: later reads through it see every
    /// transaction committed before this call, and none committed after.
    pub async fn snapshot(&self) -> Result<Snapshot, ClientError> {
        let ts = self.timestamp().await?;
        Ok(Snapshot {
            client: self.clone(),
            ts,
        })
    }

    /// A snapshot at `ts`, a timestamp from the oracle (`Client::timestamp`,
    /// or another operation's `snapshot_ts`): to read keys as of the instant
    /// a `count` or `agg` saw, say. Refused (`BadRequest`) for 0 and for a
    /// timestamp above every one the oracle has handed out (a future
    /// snapshot would change as transactions commit below it); checking
    /// costs a timestamp request only when this client has not yet seen
    /// one as high.
    pub async fn snapshot_at(&self, ts: u64) -> Result<Snapshot, ClientError> {
        self.check_snapshot_ts(ts).await?;
        Ok(Snapshot {
            client: self.clone(),
            ts,
        })
    }

    /// Refuse (`BadRequest`) a snapshot timestamp of 0 or one the oracle has
    /// not handed out yet (see `snapshot_at`).
    pub(crate) async fn check_snapshot_ts(&self, ts: u64) -> Result<(), ClientError> {
        if ts == 0 {
            return Err(ClientError::Status(
                Status::BadRequest,
                "a snapshot timestamp must be one from the cluster's oracle (> 0)".into(),
            ));
        }
        if !self.handed_out(ts).await? {
            return Err(ClientError::Status(
                Status::BadRequest,
                format!(
                    "snapshot timestamp {ts} is in the future: the oracle has not handed it out \
                     yet, and a snapshot there would change as transactions commit below it \
                     (take timestamps from the oracle or from an operation's snapshot_ts)"
                ),
            ));
        }
        Ok(())
    }

    /// Run `body` on a snapshot at a fresh timestamp: a read-only
    /// transaction. Refused with `SnapshotTooOld` (see the module), it runs
    /// again at a new one, up to 10 times; other errors end it. `body` must
    /// have no effects outside it that cannot be repeated.
    pub async fn read_only<T, F, Fut>(&self, mut body: F) -> Result<T, ClientError>
    where
        F: FnMut(Snapshot) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            match body(self.snapshot().await?).await {
                Err(e)
                    if e.status() == Some(Status::SnapshotTooOld)
                        && tries <= MAX_SNAPSHOT_RETRIES => {}
                outcome => return outcome,
            }
        }
    }
}

impl Snapshot {
    /// The timestamp this snapshot reads at.
    pub fn ts(&self) -> u64 {
        self.ts
    }

    /// `key` of `table` as of the snapshot: its value (None: absent then).
    pub async fn read(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<Bytes>, ClientError> {
        Ok(self
            .read_versioned(table, key)
            .await?
            .map(|(value, _)| value))
    }

    /// `read`, with the version the value had.
    pub async fn read_versioned(
        &self,
        table: u64,
        key: impl AsRef<[u8]>,
    ) -> Result<Found, ClientError> {
        let mut found = self.multi_read(table, &[key]).await?;
        found
            .pop()
            .unwrap_or_else(|| Err(ClientError::Status(Status::Internal, "no result".into())))
    }

    /// Many keys of `table` as of the snapshot, one entry per key in order
    /// (like `Client::multi_read`): keys on many shards are read in
    /// parallel, all at this one timestamp.
    pub async fn multi_read<K: AsRef<[u8]>>(
        &self,
        table: u64,
        keys: &[K],
    ) -> Result<crate::PerItem<Found>, ClientError> {
        self.client.snapshot_multi_read(table, keys, self.ts).await
    }

    /// How many objects of `table` match `sel` as of the snapshot (its
    /// `at_snapshot` is replaced by this snapshot's timestamp): with the
    /// reads above, one view of the table at one instant.
    pub async fn count(&self, table: u64, sel: &Selection) -> Result<u64, ClientError> {
        self.client.count(table, &self.pin(sel)).await
    }

    /// `Client::aggregate` of `field` over `sel` as of the snapshot.
    pub async fn aggregate(
        &self,
        table: u64,
        field: Field,
        sel: &Selection,
    ) -> Result<AggPartial, ClientError> {
        self.client.aggregate(table, field, &self.pin(sel)).await
    }

    /// `Client::aggregate_json` at this snapshot.
    pub async fn aggregate_json(
        &self,
        table: u64,
        path: insitu_protocol::plan::JsonPath,
        sel: &Selection,
    ) -> Result<AggPartial, ClientError> {
        self.client
            .aggregate_json(table, path, &self.pin(sel))
            .await
    }

    /// `sel`, read at this snapshot.
    fn pin(&self, sel: &Selection) -> Selection {
        Selection {
            at_snapshot: AtSnapshot::At(self.ts),
            ..sel.clone()
        }
    }
}
