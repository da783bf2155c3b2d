//! Counts checked while decoding, before anything is allocated.
//!
//! postcard encodes a sequence as a varint length then the items; serde's
//! `Vec` would build the whole vector before the server could look at its
//! length, and a tiny encoded item can be much bigger in memory (an empty
//! key is 1 byte on the wire and a 16-byte slice reference in a `Vec`; a
//! predicate `And` is 1 byte and a 40-byte `PredOp`): a 4 MiB frame could
//! expand to over 100 MB. The fields below decode through [`BoundedVec`],
//! which refuses a length above the field's limit before reserving, and
//! never reserves more than the limit.
//!
//! postcard's error type drops custom messages, so the reason is kept in a
//! thread-local and picked up by `decode_request`/`decode_response` (decoding
//! is synchronous: the message is read on the thread that wrote it).

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, Error, SeqAccess, Visitor};

use crate::json_path::{JsonStep, MAX_JSON_PATH_BYTES, MAX_JSON_PATH_STEPS, MAX_JSON_STR_BYTES};
use crate::plan::{MAX_DIMS, MAX_PRED_OPS};
use crate::query::{MAX_AGGS, MAX_GROUPS, MAX_IN_LIST};
use crate::schema::MAX_COLUMNS;

/// Most items one multi-operation request (and one migration batch) may carry.
/// Why 100 000: it keeps a decoded request's vectors under ~4 MB (40 bytes per
/// migrated object) whatever the frame holds; clients split larger batches,
/// and a migration batch of 1 MiB at >= 24 bytes per object stays below it.
pub const MAX_MULTI_ITEMS: usize = 100_000;

/// Most shard addresses one server may enlist (the coordinator's own limit).
pub const MAX_SHARD_ADDRS: usize = 1024;

/// Most operations one `BackupWrite` may carry. Why: an op decodes to ~64
/// bytes; 65 536 of them keep a decoded request under ~4 MB, far more than a
/// master batches (one op per segment touched since its last round).
pub const MAX_BACKUP_OPS: usize = 65_536;

/// Most replicas one `BackupReplicas` answer may list (2 MiB segments: 2 TiB
/// of one master's data on one backup).
pub const MAX_REPLICA_INFOS: usize = 1 << 20;

/// Most segment ids one log digest may list. Why: a tablet's log holds at
/// most 16,384 segments (the index's 14-bit segment slot); four times that
/// leaves room for other segment sizes while a digest stays under 1 MiB.
pub const MAX_DIGEST_SEGMENTS: usize = 1 << 16;

/// Most log digests one `BackupReplicas` answer may carry (one per log of
/// the master the backup holds a digest of).
pub const MAX_LOG_DIGESTS: usize = 1 << 16;

thread_local! {
    /// Why the last decode on this thread was refused by a limit.
    static VIOLATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Take the limit violation recorded by the last failed decode, if any.
pub(crate) fn take_violation() -> Option<String> {
    VIOLATION.with(|v| v.borrow_mut().take())
}

/// Forget a stale violation before a new decode.
pub(crate) fn clear_violation() {
    VIOLATION.with(|v| *v.borrow_mut() = None);
}

fn refuse<E: Error>(what: &'static str, len: usize, max: usize) -> E {
    refuse_with(format!("{what}: {len} items, more than the limit of {max}"))
}

/// Record `msg` as the reason of the failed decode, and fail with it.
fn refuse_with<E: Error>(msg: String) -> E {
    VIOLATION.with(|v| *v.borrow_mut() = Some(msg.clone()));
    E::custom(msg)
}

/// A `Vec<T>` visitor that refuses more than `max` items before allocating.
struct BoundedVec<T> {
    max: usize,
    /// Names the field in the error.
    what: &'static str,
    _items: PhantomData<T>,
}

impl<'de, T: serde::Deserialize<'de>> Visitor<'de> for BoundedVec<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "a sequence of at most {} items ({})",
            self.max, self.what
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let hint = seq.size_hint().unwrap_or(0);
        if hint > self.max {
            return Err(refuse(self.what, hint, self.max));
        }
        let mut out = Vec::with_capacity(hint);
        while let Some(item) = seq.next_element()? {
            if out.len() == self.max {
                return Err(refuse(self.what, self.max + 1, self.max));
            }
            out.push(item);
        }
        Ok(out)
    }
}

fn bounded<'de, D, T>(d: D, max: usize, what: &'static str) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    d.deserialize_seq(BoundedVec {
        max,
        what,
        _items: PhantomData,
    })
}

/// Keys or items of a multi-operation, objects of a migration batch.
pub(crate) fn multi_items<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_MULTI_ITEMS, "multi-operation items")
}

/// Operations of a predicate program.
pub(crate) fn pred_ops<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_PRED_OPS, "predicate operations")
}

/// Weights of a gradient plan (one per dimension).
pub(crate) fn weights<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_DIMS as usize, "gradient weights")
}

/// Shard addresses of an enlisting server.
pub(crate) fn shard_addrs<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_SHARD_ADDRS, "shard addresses")
}

/// Operations of a replication request.
pub(crate) fn backup_ops<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_BACKUP_OPS, "backup operations")
}

/// Replicas listed by a backup.
pub(crate) fn replica_infos<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_REPLICA_INFOS, "replicas")
}

/// Segment ids of one log digest.
pub(crate) fn digest_segments<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_DIGEST_SEGMENTS, "digest segments")
}

/// Log digests listed by a backup.
pub(crate) fn log_digests<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_LOG_DIGESTS, "log digests")
}

/// Columns of a schema, a key, a projection, a sort or a group.
pub(crate) fn columns<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_COLUMNS, "columns")
}

/// Values of an `IN` list.
pub(crate) fn in_list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_IN_LIST, "IN list values")
}

/// Aggregates of a query, steps of an aggregate's argument.
pub(crate) fn aggs<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_AGGS, "aggregates")
}

/// Groups of a partial aggregate.
pub(crate) fn groups<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, MAX_GROUPS, "groups")
}

/// Items of one participant's share of a transaction.
pub(crate) fn txn_items<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(d, crate::txn::MAX_TXN_ITEMS, "transaction items")
}

/// Participants of a transaction.
pub(crate) fn txn_participants<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    bounded(
        d,
        crate::txn::MAX_TXN_PARTICIPANTS,
        "transaction participants",
    )
}

/// A string of at most `max` bytes, refused by its length before it is
/// copied (postcard hands the visitor the bytes borrowed from the frame).
struct BoundedString {
    max: usize,
    /// Names the field in the error.
    what: &'static str,
}

impl Visitor<'_> for BoundedString {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a string of at most {} bytes ({})", self.max, self.what)
    }

    fn visit_str<E: Error>(self, s: &str) -> Result<String, E> {
        if s.len() > self.max {
            return Err(refuse_with(format!(
                "{}: {} bytes, more than the limit of {}",
                self.what,
                s.len(),
                self.max
            )));
        }
        Ok(s.to_owned())
    }
}

/// A key of a JSON path.
pub(crate) fn json_key<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    d.deserialize_str(BoundedString {
        max: MAX_JSON_PATH_BYTES,
        what: "JSON path key",
    })
}

/// A string a JSON comparison carries.
pub(crate) fn json_str<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    d.deserialize_str(BoundedString {
        max: MAX_JSON_STR_BYTES,
        what: "JSON string literal",
    })
}

/// The steps of a JSON path: at most `MAX_JSON_PATH_STEPS`, their keys at
/// most `MAX_JSON_PATH_BYTES` together (each key is bounded as it decodes,
/// so at most steps x bytes are allocated before the total is checked).
pub(crate) fn json_steps<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<JsonStep>, D::Error> {
    let steps: Vec<JsonStep> = bounded(d, MAX_JSON_PATH_STEPS, "JSON path steps")?;
    let bytes: usize = steps
        .iter()
        .map(|s| match s {
            JsonStep::Key(k) => k.len(),
            JsonStep::Index(_) => 0,
        })
        .sum();
    if bytes > MAX_JSON_PATH_BYTES {
        return Err(refuse_with(format!(
            "JSON path keys: {bytes} bytes together, more than the limit of {MAX_JSON_PATH_BYTES}"
        )));
    }
    Ok(steps)
}
