//! The types of multi-key transactions as they travel (see `Request::TxnPrepare`
//! and ARCHITECTURE.md, "Transactions"). Data only: the rules live in the
//! `txn` crate.

use serde::{Deserialize, Serialize};

use crate::message::Blob;

/// A transaction's id, chosen at random by the client. Why 64 random bits:
/// two transactions live at once collide with probability ~n²/2⁶⁵ (a
/// million at once: ~3·10⁻⁸), and a collision only makes one of them fail
/// to prepare (the participant sees a different item set under a known id).
pub type TxnId = u64;

/// Most items (keys read or written) one transaction may prepare on one
/// participant. Why: a prepare holds its keys and values until decided;
/// 10 000 keeps a decoded request's vectors under ~1 MB and a transaction
/// an OLTP-sized thing (bulk loads have `MultiWrite`).
pub const MAX_TXN_ITEMS: usize = 10_000;

/// Most participants (shards) one transaction may span.
pub const MAX_TXN_PARTICIPANTS: usize = 1024;

/// What a transaction does to one key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum TxnWrite<'a> {
    /// Read only: validated at prepare, not locked.
    None,
    /// Write this value at commit.
    Put(#[serde(borrow)] Blob<'a>),
    /// Remove the key at commit.
    Remove,
    /// Write this value at commit, with a deadline (Unix ms, >= 1): from
    /// then on the object is absent, as after `Request::Write` with one.
    PutExpiring {
        #[serde(borrow)]
        value: Blob<'a>,
        expires_at_ms: u64,
    },
}

/// One key of a transaction on one participant.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TxnItem<'a> {
    pub table: u64,
    #[serde(borrow)]
    pub key: Blob<'a>,
    /// The version the transaction read: the prepare fails unless the key
    /// still has it (0: read as absent). None: not read (a blind write,
    /// which only needs the lock).
    pub read_version: Option<u64>,
    #[serde(borrow)]
    pub write: TxnWrite<'a>,
}

/// Where a transaction stands on one participant (`TxnInquire`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnPhase {
    /// Validated and locked, waiting for the decision.
    Prepared,
    /// Committed here, at this timestamp (0: none): a primary deciding the
    /// orphan commits at the same one.
    Committed { commit_ts: u64 },
    /// Aborted, or never seen (the participant then records it aborted, so
    /// that a prepare arriving late is refused).
    Aborted,
}

/// A key naming a participant: whichever shard owns the key's tablet now
/// (a tablet moves or is recovered elsewhere with its transaction records;
/// a request routed by key finds them).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TxnAnchor<'a> {
    pub table: u64,
    #[serde(borrow)]
    pub key: Blob<'a>,
}
