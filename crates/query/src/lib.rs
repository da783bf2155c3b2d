//! Evaluation of typed query plans (`insitu_protocol::query`) over rows of
//! the row format (`insitu-rows`): used by storage servers per tablet and by
//! clients to merge tablets' answers.
//!
//! - `compile.rs`: a plan checked against the schema (every refusal of a
//!   hostile plan) and compiled; `filter.rs`: the compiled filter and its
//!   Kleene evaluation over raw row bytes; `like.rs`: LIKE as regex, regex
//!   limits; `arith.rs`: aggregate arguments (exact i128 arithmetic);
//!   `exact.rs`: all-exact arguments on plain integers, i64 first;
//! - `sink.rs`: rows, top-k; `agg.rs`: grouped aggregates per tablet;
//!   `agg_fast.rs`: count/sum/avg of exact arguments without tagged values;
//! - `merge.rs`: the client's merge of groups and top-k, and the final
//!   aggregate batch; `build.rs`: Arrow arrays from scalars;
//! - `parse.rs`: the CLI's `--where` text; `reference.rs`: an obviously
//!   correct evaluator over rows of `Scalar`s, for tests;
//! - `value.rs`: the one comparison of values every part uses;
//! - `update.rs`: a typed update (one column of matching rows), checked and
//!   applied row by row.

mod agg;
mod agg_fast;
mod arith;
mod build;
mod compile;
mod exact;
mod exact_batch;
mod filter;
pub mod like;
mod merge;
mod parse;
pub mod reference;
mod sink;
mod update;
pub mod value;

pub use compile::{Compiled, answer_columns, compile};
pub use merge::{agg_name, finalize_groups, merge_groups, merge_top_k};
pub use parse::parse_where;
pub use sink::{MAX_TOP_K_BYTES, Sink};
pub use update::{RowUpdate, compile_filter};

use insitu_rows::RowError;

/// Why a plan was refused or its evaluation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueryError {
    /// The plan does not fit the table (the message names the column and
    /// the step).
    #[error("query refused: {0}")]
    Plan(String),
    /// Evaluation failed: overflow, too many groups, too large a top-k.
    #[error("{0}")]
    Eval(String),
    /// `--where` text that does not parse.
    #[error("--where: {0}")]
    Parse(String),
    /// A row that does not fit the schema.
    #[error(transparent)]
    Row(#[from] RowError),
    /// Arrow data that does not fit the plan (from a server) or could not
    /// be encoded.
    #[error("arrow: {0}")]
    Arrow(String),
}

#[cfg(test)]
mod tests;
