//! Multi-key transactions: the rules every participant follows, kept free of
//! I/O so they can be tested against a model. The server wires them to the
//! engine and the network (`server/src/txn.rs`); the client drives a commit
//! (`client/src/txn.rs`). ARCHITECTURE.md, "Transactions", has the flow.

pub mod checker;
pub mod item;
pub mod locks;
pub mod participant;
pub mod record;

pub use locks::Locks;
pub use participant::{
    Anchor, Apply, Item, Limits, Participant, Phase, Prepared, Refusal, TxnId, Write,
};
pub use record::{
    CLASS_ABORTED, CLASS_COMMITTED, CLASS_PREPARED, PreparedRecord, RecordItem, commit_payload,
    decode_commit_payload,
};
