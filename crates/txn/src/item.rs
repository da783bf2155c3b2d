//! What a prepare carries and how it can be refused: a transaction's id,
//! its items (one key each: the version read, the write), and the
//! refusals a participant answers (`participant.rs` decides them).

/// A transaction's id (the protocol's `TxnId`).
pub type TxnId = u64;

/// What a transaction does to one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Read only: validated, not locked.
    None,
    Put(Vec<u8>),
    Remove,
    /// A put of an object with a deadline (Unix ms, >= 1).
    PutExpiring(Vec<u8>, u64),
}

impl Write {
    /// The value a put writes (None for a remove or a read).
    pub fn value(&self) -> Option<&[u8]> {
        match self {
            Write::Put(v) | Write::PutExpiring(v, _) => Some(v),
            Write::None | Write::Remove => None,
        }
    }
}

/// One key of a prepared transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub table: u64,
    pub key: Vec<u8>,
    /// The key's hash: which tablet it is in (moves wait for a tablet's locks).
    pub hash: u64,
    /// The version the transaction read (0: absent); None for a blind write.
    pub read_version: Option<u64>,
    pub write: Write,
}

impl Item {
    /// Bytes this item holds while prepared (key, value, bookkeeping).
    pub(crate) fn held_bytes(&self) -> usize {
        let value = self.write.value().map_or(0, <[u8]>::len);
        self.key.len() + value + ITEM_OVERHEAD_BYTES
    }
}

/// Bookkeeping bytes charged per prepared item (the item, its lock entry and
/// their share of two hash tables), on top of its key and value.
const ITEM_OVERHEAD_BYTES: usize = 128;

/// Why a prepare is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Another transaction holds the lock of a key.
    Locked { table: u64, key: Vec<u8>, by: TxnId },
    /// A key read no longer has the version the transaction read.
    Changed {
        table: u64,
        key: Vec<u8>,
        read: u64,
        now: u64,
    },
    /// The transaction is already decided here (aborted by a resolution
    /// before this prepare arrived, or a resend after the decision).
    Decided { committed: bool },
    /// Prepared transactions already hold `held_bytes` here; this one's
    /// `bytes` would pass the limit.
    Full { held_bytes: usize, bytes: usize },
    /// The request itself is wrong (a key twice, an id in use for other keys).
    Bad(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Locked { table, key, by } => write!(
                f,
                "key {} of table {table} is locked by transaction {by:#x}",
                show_key(key)
            ),
            Refusal::Changed {
                table,
                key,
                read,
                now,
            } => write!(
                f,
                "key {} of table {table} changed after it was read (read version {read}, now {now})",
                show_key(key)
            ),
            Refusal::Decided { committed: true } => f.write_str("transaction already committed"),
            Refusal::Decided { committed: false } => f.write_str("transaction was aborted"),
            Refusal::Full { held_bytes, bytes } => write!(
                f,
                "prepared transactions hold {held_bytes} bytes here; {bytes} more would pass the limit"
            ),
            Refusal::Bad(why) => f.write_str(why),
        }
    }
}

/// A key as an error message shows it: text if printable, else hex (cut).
pub(crate) fn show_key(key: &[u8]) -> String {
    const SHOWN_BYTES: usize = 64;
    let cut = &key[..key.len().min(SHOWN_BYTES)];
    let more = if key.len() > SHOWN_BYTES { "..." } else { "" };
    match std::str::from_utf8(cut) {
        Ok(s) if s.chars().all(|c| !c.is_control()) => format!("{s:?}{more}"),
        _ => {
            let hex: String = cut.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}{more}")
        }
    }
}
