//! Typed rows of insitu's typed tables: the row format (`layout.rs`: the
//! byte layout; `read.rs`: checked reads; `encode.rs`: values checked against
//! their columns, rows and primary keys encoded), input columns matched by name (`input.rs`), text forms (`text.rs`:
//! values, types and `--schema` text; `date.rs`: calendar dates), and Arrow
//! (`arrow.rs`: schemas, batches from rows, IPC bytes, rows from batches).
//!
//! Clients encode rows; servers read them (predicates, projections,
//! aggregates in `insitu-query`). The engine still sees opaque values.

pub mod arrow;
pub mod date;
pub mod encode;
pub mod guard;
pub mod input;
pub mod layout;
pub mod read;
pub mod text;

pub use encode::{coerce, encode_key, encode_row};
pub use input::ColumnMap;
pub use layout::{ROW_TAG, RowLayout, Slot};
pub use read::RowRef;

/// Why a value, row or batch was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RowError {
    #[error("column {column:?}: {message}")]
    Type { column: String, message: String },
    #[error("a row of this table has {expected} columns, got {got}")]
    Arity { expected: usize, got: usize },
    #[error("row does not fit the schema: {0}")]
    Malformed(String),
    #[error("encoded row or key of {0} bytes is too large")]
    TooLarge(usize),
    #[error("arrow: {0}")]
    Arrow(String),
    /// Input columns that do not match the table's (by name).
    #[error("{0}")]
    Input(String),
}

#[cfg(test)]
mod tests;
