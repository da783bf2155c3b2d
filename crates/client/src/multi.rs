//! Multi-operations: group keys by shard, split into frame-sized requests,
//! send them all in parallel, fill results by position, re-route or re-ask
//! the keys that need it.
//!
//! # Split rule
//! A shard's keys (in caller order) are cut into consecutive requests of at
//! most `MAX_ITEMS_PER_REQUEST` items whose encoded body is at most
//! `MAX_BODY_BYTES`. The body size is computed exactly from postcard's
//! encoding (`REQUEST_OVERHEAD` for the variant tag, table id and item count,
//! plus per key `varint(len) + len`, per value the same), so it never
//! under-estimates. A single item too large for any frame goes alone and
//! fails with `ClientError::RequestTooLarge`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::future::join_all;
use insitu_keyhash::key_hash;
use insitu_protocol::{MAX_BODY_BYTES, Request, Response, Status, blob};

use crate::client::{Client, Found, PerItem, decode, gave_up, since};
use crate::error::ClientError;
use crate::routing::{Backoff, Endpoint};
use crate::rpc::Reply;

/// Most items one multi-request carries.
pub const MAX_ITEMS_PER_REQUEST: usize = 10_000;

/// Upper bound of the encoded bytes of a multi-request besides its items:
/// variant tag (1) + table id varint (<= 10) + item count varint (<= 5).
pub(crate) const REQUEST_OVERHEAD: usize = 16;

/// Bytes postcard uses for the varint length prefix of `n`.
fn varint_len(n: usize) -> usize {
    let bits = usize::BITS - (n | 1).leading_zeros();
    (bits as usize).div_ceil(7)
}

/// Encoded bytes of one byte string (length prefix + bytes).
pub(crate) fn blob_bytes(b: &[u8]) -> usize {
    varint_len(b.len()) + b.len()
}

/// Cut `positions` into consecutive chunks that each hold at most
/// `max_items` items and whose `REQUEST_OVERHEAD + sum(size_of(item))` is at
/// most `max_body` (an item larger than that on its own gets a chunk alone).
pub(crate) fn split_batch(
    positions: Vec<usize>,
    max_items: usize,
    max_body: usize,
    size_of: impl Fn(usize) -> usize,
) -> Vec<Vec<usize>> {
    let mut chunks = Vec::new();
    let mut current = Vec::new();
    let mut bytes = REQUEST_OVERHEAD;
    for p in positions {
        let size = size_of(p);
        if !current.is_empty() && (current.len() >= max_items || bytes + size > max_body) {
            chunks.push(std::mem::take(&mut current));
            bytes = REQUEST_OVERHEAD;
        }
        current.push(p);
        bytes += size;
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Remove,
    /// A read at this snapshot timestamp (`Request::SnapshotRead`).
    SnapshotRead(u64),
}

/// Encoded bytes a `SnapshotRead` carries beyond `REQUEST_OVERHEAD`: its
/// timestamp's varint.
const SNAPSHOT_TS_BYTES: usize = 10;

/// The caller's items, borrowed, and what to do with them.
struct Batch<'a> {
    /// Table the keys belong to.
    table: u64,
    /// Which multi-request to build.
    kind: Kind,
    /// Keys in caller order.
    keys: Vec<&'a [u8]>,
    /// Values in caller order (writes only, else empty).
    values: Vec<&'a [u8]>,
}

impl<'a> Batch<'a> {
    fn item_size(&self, i: usize) -> usize {
        blob_bytes(self.keys[i]) + self.values.get(i).map_or(0, |v| blob_bytes(v))
    }

    fn request(&self, positions: &[usize]) -> Request<'a> {
        let table = self.table;
        match self.kind {
            Kind::Read => Request::MultiRead {
                table,
                keys: positions.iter().map(|&i| blob(self.keys[i])).collect(),
            },
            Kind::SnapshotRead(snapshot_ts) => Request::SnapshotRead {
                table,
                snapshot_ts,
                keys: positions.iter().map(|&i| blob(self.keys[i])).collect(),
            },
            Kind::Remove => Request::MultiRemove {
                table,
                keys: positions.iter().map(|&i| blob(self.keys[i])).collect(),
            },
            Kind::Write => Request::MultiWrite {
                table,
                items: positions
                    .iter()
                    .map(|&i| (blob(self.keys[i]), blob(self.values[i])))
                    .collect(),
            },
        }
    }
}

/// One object's outcome as the shard reported it.
#[derive(Clone, Debug)]
struct Item {
    /// Per-object status.
    status: Status,
    /// Version read, written or removed.
    version: u64,
    /// Value read (shares the reply buffer); empty for writes and removes.
    value: Bytes,
}

fn parse_items(
    kind: Kind,
    reply: &Reply,
    expected: usize,
    addr: &str,
) -> Result<Vec<Item>, ClientError> {
    let items: Vec<Item> = match (kind, decode(reply, addr)?) {
        (Kind::Read | Kind::SnapshotRead(_), Response::MultiRead { results }) => results
            .into_iter()
            .map(|r| Item {
                status: r.status,
                version: r.version,
                value: reply.body.slice_ref(r.value),
            })
            .collect(),
        (Kind::Write, Response::MultiWrite { results })
        | (Kind::Remove, Response::MultiRemove { results }) => results
            .into_iter()
            .map(|r| Item {
                status: r.status,
                version: r.version,
                value: Bytes::new(),
            })
            .collect(),
        (kind, other) => {
            return Err(ClientError::unexpected(
                addr,
                format!("{other:?} to a multi {kind:?}"),
            ));
        }
    };
    if items.len() != expected {
        return Err(ClientError::unexpected(
            addr,
            format!("{} results for {expected} keys", items.len()),
        ));
    }
    Ok(items)
}

/// Settle every item at `positions` with `e`: when a whole request, a map
/// refresh or the time budget fails, each item it covered shares that error.
fn fail_all(out: &mut [Option<Result<Item, ClientError>>], positions: &[usize], e: &ClientError) {
    for &i in positions {
        out[i] = Some(Err(e.clone()));
    }
}

impl Client {
    /// Read many keys of `table` at once: one entry per key, in order. A
    /// missing key is `Ok(None)` and never fails the batch; other per-key
    /// failures are that entry's error. The outer error is for failures of
    /// the whole call (the table is unknown, the coordinator unreachable).
    pub async fn multi_read<K: AsRef<[u8]>>(
        &self,
        table: u64,
        keys: &[K],
    ) -> Result<PerItem<Found>, ClientError> {
        self.read_batch(table, keys, Kind::Read).await
    }

    /// `multi_read` as of the snapshot timestamp `ts` (`Snapshot`, in
    /// `snapshot.rs`, says how to get one and what a refusal means).
    pub(crate) async fn snapshot_multi_read<K: AsRef<[u8]>>(
        &self,
        table: u64,
        keys: &[K],
        ts: u64,
    ) -> Result<PerItem<Found>, ClientError> {
        self.read_batch(table, keys, Kind::SnapshotRead(ts)).await
    }

    async fn read_batch<K: AsRef<[u8]>>(
        &self,
        table: u64,
        keys: &[K],
        kind: Kind,
    ) -> Result<PerItem<Found>, ClientError> {
        let batch = Batch {
            table,
            kind,
            keys: keys.iter().map(|k| k.as_ref()).collect(),
            values: Vec::new(),
        };
        self.run_multi_each(&batch, |item| match item.status {
            Status::Ok => Ok(Some((item.value, item.version))),
            Status::ObjectDoesntExist => Ok(None),
            s => Err(ClientError::Status(s, String::new())),
        })
        .await
    }

    /// Write many objects of `table` at once; one new version (or error) per
    /// item, in order. Like `write`, a request whose connection dropped is
    /// sent again (last writer wins).
    pub async fn multi_write<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        table: u64,
        items: &[(K, V)],
    ) -> Result<PerItem<u64>, ClientError> {
        let batch = Batch {
            table,
            kind: Kind::Write,
            keys: items.iter().map(|(k, _)| k.as_ref()).collect(),
            values: items.iter().map(|(_, v)| v.as_ref()).collect(),
        };
        self.run_multi_each(&batch, |item| match item.status {
            Status::Ok => Ok(item.version),
            s => Err(ClientError::Status(s, String::new())),
        })
        .await
    }

    /// Remove many keys of `table` at once: per key the removed version, or
    /// `None` if it did not exist.
    pub async fn multi_remove<K: AsRef<[u8]>>(
        &self,
        table: u64,
        keys: &[K],
    ) -> Result<PerItem<Option<u64>>, ClientError> {
        let batch = Batch {
            table,
            kind: Kind::Remove,
            keys: keys.iter().map(|k| k.as_ref()).collect(),
            values: Vec::new(),
        };
        self.run_multi_each(&batch, |item| match item.status {
            Status::Ok => Ok((item.version != 0).then_some(item.version)),
            Status::ObjectDoesntExist => Ok(None),
            s => Err(ClientError::Status(s, String::new())),
        })
        .await
    }

    /// The engine of the multi-operations: rounds of (group by shard, split,
    /// send everything in parallel, sort outcomes) until every position has
    /// a final outcome or the time budget is spent.
    /// Run `batch` and turn each item's reply into `T` with `convert`: the
    /// multi-operations differ only in what an item's status and version mean.
    async fn run_multi_each<T>(
        &self,
        batch: &Batch<'_>,
        convert: impl Fn(Item) -> Result<T, ClientError>,
    ) -> Result<PerItem<T>, ClientError> {
        let items = self.run_multi(batch).await?;
        Ok(items.into_iter().map(|r| r.and_then(&convert)).collect())
    }

    async fn run_multi(
        &self,
        batch: &Batch<'_>,
    ) -> Result<Vec<Result<Item, ClientError>>, ClientError> {
        let n = batch.keys.len();
        let mut out: Vec<Option<Result<Item, ClientError>>> = vec![None; n];
        if n == 0 {
            return Ok(Vec::new());
        }
        let table = batch.table;
        let start = Instant::now();
        let deadline = start + self.inner.config.op_timeout;
        let hashes: Vec<u64> = batch.keys.iter().map(|k| key_hash(table, k)).collect();
        let max_body = match batch.kind {
            Kind::SnapshotRead(_) => MAX_BODY_BYTES - SNAPSHOT_TS_BYTES,
            _ => MAX_BODY_BYTES,
        };
        let mut route = self.route(table, deadline).await?;
        let mut pending: Vec<usize> = (0..n).collect();
        let mut backoff = Backoff::new();
        let mut refreshed = false;
        let mut rounds = 0u32;
        let mut last_err: Option<ClientError> = None;

        while !pending.is_empty() {
            rounds += 1;
            // Group by destination, keeping caller order within a group.
            let mut group_of: HashMap<usize, usize> = HashMap::new(); // endpoint address -> group
            let mut groups: Vec<(Arc<Endpoint>, Vec<usize>)> = Vec::new();
            let mut next: Vec<usize> = Vec::new();
            let mut need_refresh = false;
            let mut need_backoff = false;
            for &i in &pending {
                match route.locate(hashes[i]) {
                    Some(t) => {
                        let ep = route.endpoint(t);
                        let g = *group_of.entry(Arc::as_ptr(ep) as usize).or_insert_with(|| {
                            groups.push((ep.clone(), Vec::new()));
                            groups.len() - 1
                        });
                        groups[g].1.push(i);
                    }
                    None => {
                        next.push(i);
                        need_refresh = true;
                        last_err = Some(ClientError::NoTablet {
                            table,
                            hash: hashes[i],
                        });
                    }
                }
            }
            let chunks: Vec<(Arc<Endpoint>, Vec<usize>)> = groups
                .into_iter()
                .flat_map(|(ep, positions)| {
                    split_batch(positions, MAX_ITEMS_PER_REQUEST, max_body, |i| {
                        batch.item_size(i)
                    })
                    .into_iter()
                    .map(move |c| (ep.clone(), c))
                })
                .collect();
            let requests: Vec<Request<'_>> = chunks
                .iter()
                .map(|(_, positions)| batch.request(positions))
                .collect();
            let replies = join_all(chunks.iter().zip(&requests).map(
                |((ep, _), request)| async move {
                    // A snapshot read may wait for transactions: not on the
                    // connection their decisions come by (`conn_for`).
                    let conn = ep.conn_for(request, deadline).await?;
                    let reply = conn
                        .call_timeout(request, deadline.saturating_duration_since(Instant::now()))
                        .await;
                    reply.map_err(|e| since(start, ClientError::from_rpc(&ep.addr, e)))
                },
            ))
            .await;
            drop(requests);

            for ((ep, positions), reply) in chunks.into_iter().zip(replies) {
                let reply = match reply {
                    Ok(r) => r,
                    Err(e) if e.is_connection() => {
                        ep.drop_if_closed();
                        next.extend_from_slice(&positions);
                        need_refresh = true;
                        need_backoff = true;
                        last_err = Some(e);
                        continue;
                    }
                    Err(e) => {
                        fail_all(&mut out, &positions, &e);
                        continue;
                    }
                };
                match reply.status {
                    Status::Ok => {}
                    Status::UnknownTablet | Status::StaleMap | Status::Retry => {
                        next.extend_from_slice(&positions);
                        need_refresh = true;
                        need_backoff |= reply.status == Status::Retry;
                        last_err = Some(ClientError::Status(reply.status, reply.error_message()));
                        continue;
                    }
                    status => {
                        if status == Status::UnknownTable {
                            self.inner.routes.evict_id(table);
                        }
                        let e = ClientError::Status(status, reply.error_message());
                        fail_all(&mut out, &positions, &e);
                        continue;
                    }
                }
                let items = match parse_items(batch.kind, &reply, positions.len(), &ep.addr) {
                    Ok(items) => items,
                    Err(e) => {
                        fail_all(&mut out, &positions, &e);
                        continue;
                    }
                };
                let mut progress = false;
                for (&i, item) in positions.iter().zip(items) {
                    match item.status {
                        Status::UnknownTablet | Status::StaleMap => {
                            next.push(i);
                            need_refresh = true;
                            last_err = Some(ClientError::Status(item.status, String::new()));
                        }
                        Status::Retry => {
                            next.push(i);
                            need_refresh = true;
                            need_backoff = true;
                            last_err = Some(ClientError::Status(item.status, String::new()));
                        }
                        // The reply was full: ask again for just these keys.
                        Status::Truncated => next.push(i),
                        _ => {
                            progress = true;
                            out[i] = Some(Ok(item));
                        }
                    }
                }
                if !progress {
                    // Not even one object fit or was served: do not spin.
                    need_backoff = true;
                    last_err.get_or_insert(ClientError::Status(Status::Truncated, String::new()));
                }
            }

            pending = next;
            if pending.is_empty() {
                break;
            }
            let expired = || Instant::now() >= deadline;
            // A second refresh in a row means the coordinator has not caught
            // up yet: give it time instead of hammering it.
            if !expired() && (need_backoff || (need_refresh && refreshed)) {
                backoff.wait(deadline).await;
            }
            if !expired() && need_refresh {
                refreshed = true;
                match self.refresh(table, route.map_version(), deadline).await {
                    Ok(r) => route = r,
                    Err(e) if Self::refresh_error_is_transient(&e) => last_err = Some(e),
                    Err(e) => {
                        fail_all(&mut out, &pending, &e);
                        break;
                    }
                }
            }
            if expired() {
                let last = last_err
                    .take()
                    .unwrap_or(ClientError::Status(Status::Truncated, String::new()));
                let e = gave_up(start, rounds, last);
                fail_all(&mut out, &pending, &e);
                break;
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every position has an outcome"))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_protocol::encoded_len;

    #[test]
    fn varint_lengths() {
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(127), 1);
        assert_eq!(varint_len(128), 2);
        assert_eq!(varint_len(16_383), 2);
        assert_eq!(varint_len(16_384), 3);
        assert_eq!(varint_len(u32::MAX as usize), 5);
    }

    fn batch<'a>(keys: &'a [Vec<u8>], values: &'a [Vec<u8>], kind: Kind) -> Batch<'a> {
        Batch {
            table: u64::MAX,
            kind,
            keys: keys.iter().map(|k| k.as_slice()).collect(),
            values: values.iter().map(|v| v.as_slice()).collect(),
        }
    }

    #[test]
    fn size_estimate_matches_postcard() {
        let keys: Vec<Vec<u8>> = (0..300).map(|i| vec![b'k'; i * 7 % 200 + 1]).collect();
        let values: Vec<Vec<u8>> = (0..300).map(|i| vec![b'v'; i * 131 % 20_000]).collect();
        for kind in [Kind::Read, Kind::Write, Kind::Remove] {
            let b = batch(&keys, if kind == Kind::Write { &values } else { &[] }, kind);
            let positions: Vec<usize> = (0..300).collect();
            let estimate =
                REQUEST_OVERHEAD + positions.iter().map(|&i| b.item_size(i)).sum::<usize>();
            let exact = encoded_len(&b.request(&positions));
            assert!(
                exact <= estimate,
                "{kind:?}: exact {exact} > estimate {estimate}"
            );
            assert!(
                estimate - exact <= REQUEST_OVERHEAD,
                "{kind:?}: estimate {estimate} far above {exact}"
            );
        }
    }

    #[test]
    fn split_respects_bytes_and_items() {
        // 9 items of 1 MiB: at most 3 fit in a 4 MiB body.
        let keys: Vec<Vec<u8>> = (0..9u8).map(|i| vec![i; 8]).collect();
        let values: Vec<Vec<u8>> = (0..9).map(|_| vec![0u8; 1 << 20]).collect();
        let b = batch(&keys, &values, Kind::Write);
        let chunks = split_batch(
            (0..9).collect(),
            MAX_ITEMS_PER_REQUEST,
            MAX_BODY_BYTES,
            |i| b.item_size(i),
        );
        assert_eq!(chunks.len(), 3, "{chunks:?}");
        assert_eq!(
            chunks.concat(),
            (0..9).collect::<Vec<_>>(),
            "order kept, nothing lost"
        );
        for c in &chunks {
            assert!(encoded_len(&b.request(c)) <= MAX_BODY_BYTES);
        }

        let chunks = split_batch(
            (0..25_001).collect(),
            MAX_ITEMS_PER_REQUEST,
            MAX_BODY_BYTES,
            |_| 3,
        );
        assert_eq!(
            chunks.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![10_000, 10_000, 5_001]
        );

        // An oversized item goes alone; its neighbours are not dragged along.
        let chunks = split_batch(vec![0, 1, 2], 10, 100, |i| if i == 1 { 500 } else { 10 });
        assert_eq!(chunks, vec![vec![0], vec![1], vec![2]]);
        assert!(split_batch(Vec::new(), 10, 100, |_| 1).is_empty());
    }
}
