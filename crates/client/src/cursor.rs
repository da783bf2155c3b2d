//! Enumerating a table: a walk over the key-hash space, tablet by tablet.

use bytes::Bytes;
use insitu_protocol::{Request, Response};

use crate::client::{Client, check_ok, decode};
use crate::error::ClientError;

/// One object: key, value, version.
pub type Object = (Bytes, Bytes, u64);

/// Yields every object of a table in batches, in key-hash order.
///
/// The position is a key hash, not a tablet index: each step asks the tablet
/// that currently covers the position (per the cached map, refreshed on
/// `UnknownTablet`), so a tablet moved or split during the walk is followed.
/// Objects written or removed during the walk may or may not be seen.
pub struct TableCursor {
    /// Where requests go (and whose map cache is used).
    client: Client,
    /// The table being walked.
    table: u64,
    /// The next key hash to ask for; `None` once the whole space is done.
    position: Option<u64>,
}

impl TableCursor {
    /// The next non-empty batch, or `None` when the table is exhausted.
    pub async fn next_batch(&mut self) -> Result<Option<Vec<Object>>, ClientError> {
        let max_bytes = self.client.inner.config.enumerate_batch_bytes;
        let table = self.table;
        while let Some(from_hash) = self.position {
            let make = |t: &insitu_protocol::TabletInfo| Request::Enumerate {
                table,
                tablet_start: t.start_hash,
                from_hash,
                max_bytes,
            };
            let (objects, next) = self
                .client
                .routed(table, from_hash, true, make, |reply, tablet, addr| {
                    check_ok(&reply)?;
                    match decode(&reply, addr)? {
                        Response::Enumerate { objects, next_hash } => {
                            let objects: Vec<Object> = objects
                                .into_iter()
                                .map(|o| (reply.body.slice_ref(o.key), reply.body.slice_ref(o.value), o.version))
                                .collect();
                            let next = match next_hash {
                                Some(h) if h > from_hash => Some(h),
                                Some(h) => {
                                    return Err(ClientError::unexpected(addr, format!("enumerate from {from_hash:#x} made no progress (next {h:#x})")));
                                }
                                // This tablet is done: continue after it (the tablet
                                // covers `from_hash`, so this always moves forward).
                                None if tablet.end_hash >= from_hash => tablet.end_hash.checked_add(1),
                                None => {
                                    return Err(ClientError::unexpected(addr, format!("tablet ending at {:#x} asked for hash {from_hash:#x}", tablet.end_hash)));
                                }
                            };
                            Ok((objects, next))
                        }
                        other => Err(ClientError::unexpected(addr, format!("{other:?} to Enumerate"))),
                    }
                })
                .await?;
            self.position = next;
            if !objects.is_empty() {
                return Ok(Some(objects));
            }
        }
        Ok(None)
    }

    /// The table being walked.
    pub fn table(&self) -> u64 {
        self.table
    }

    /// Where the walk goes on (a key hash; every object with a smaller hash
    /// was returned), or None once it is over. `Client::enumerate_at`
    /// resumes from it.
    pub fn position(&self) -> Option<u64> {
        self.position
    }

    /// Whether the walk is over.
    pub fn is_done(&self) -> bool {
        self.position.is_none()
    }
}

impl Client {
    /// A cursor over every object of `table` (nothing is sent until `next_batch`).
    pub fn enumerate(&self, table: u64) -> TableCursor {
        TableCursor {
            client: self.clone(),
            table,
            position: Some(0),
        }
    }

    /// A cursor resuming a walk at key hash `position` (what `position()`
    /// said): objects whose key hash is below it are skipped.
    pub fn enumerate_at(&self, table: u64, position: u64) -> TableCursor {
        TableCursor {
            client: self.clone(),
            table,
            position: Some(position),
        }
    }

    /// Like `enumerate`, but first makes sure the table's map is known (an
    /// unknown table fails here, not at the first batch).
    pub async fn cursor(&self, table: u64) -> Result<TableCursor, ClientError> {
        self.route(
            table,
            std::time::Instant::now() + self.inner.config.op_timeout,
        )
        .await?;
        Ok(self.enumerate(table))
    }

    /// Up to `limit` objects of `table`, in key-hash order.
    pub async fn scan(&self, table: u64, limit: usize) -> Result<Vec<Object>, ClientError> {
        let mut cursor = self.enumerate(table);
        let mut all = Vec::new();
        while all.len() < limit {
            match cursor.next_batch().await? {
                Some(batch) => all.extend(batch.into_iter().take(limit - all.len())),
                None => break,
            }
        }
        Ok(all)
    }
}
