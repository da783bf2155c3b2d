//! Queries on typed tables: the plan a client sends to every tablet of a
//! typed table (filter, projection, top-k, grouped aggregates) and the
//! partial results. Plain data: `insitu-query` evaluates and merges them.
//!
//! Columns are named by their index in the table's `Schema`. Programs are
//! postfix (`Vec<..>`) instead of trees, so decoding hostile input never
//! recurses and evaluation uses a bounded stack.
//!
//! The filter follows SQL's three-valued logic: a comparison with a NULL is
//! unknown, `NOT unknown` is unknown, and only rows whose filter is *true*
//! pass. That is what lets a SQL engine hand a WHERE clause to the servers
//! and trust their answer exactly.

use serde::{Deserialize, Serialize};

use crate::plan::CmpOp;

/// Most items of an `IN` list.
pub const MAX_IN_LIST: usize = 4096;
/// Longest LIKE or regex pattern, in bytes.
pub const MAX_PATTERN_BYTES: usize = 4096;
/// Most groups one tablet's partial aggregate may hold; a query with more
/// groups is refused and aggregates in the client instead.
pub const MAX_GROUPS: usize = 100_000;
/// Most aggregates and most steps of one aggregate's argument.
pub const MAX_AGGS: usize = 64;
/// Most rows a top-k (`ORDER BY .. LIMIT k`) may ask each tablet for.
pub const MAX_TOP_K: u64 = 100_000;

/// A literal value.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Scalar {
    Null,
    Bool(bool),
    /// Any integer (int32 and int64 columns).
    Int(i64),
    Float(f64),
    /// `value / 10^scale`.
    Decimal {
        value: i64,
        scale: u8,
    },
    /// Days since 1970-01-01.
    Date(i32),
    Str(String),
}

/// One step of a postfix filter program; every step pushes a truth value
/// (true, false or unknown).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Pred {
    /// `column OP value`.
    Cmp { col: u16, op: CmpOp, value: Scalar },
    /// `left OP right`, two columns of comparable types.
    CmpCols { left: u16, op: CmpOp, right: u16 },
    /// `lo <= column <= hi`.
    Between { col: u16, lo: Scalar, hi: Scalar },
    /// `column IN (values)`.
    In {
        col: u16,
        #[serde(deserialize_with = "crate::limits::in_list")]
        values: Vec<Scalar>,
    },
    /// `column IS NULL` (never unknown).
    IsNull { col: u16 },
    /// SQL `LIKE` (`%` any run, `_` one character, `\` escapes) on a text
    /// column; `ILIKE` when `case_insensitive`.
    Like {
        col: u16,
        pattern: String,
        case_insensitive: bool,
    },
    /// A regular expression (the `regex` crate's syntax: linear time) found
    /// anywhere in a text column.
    Regex {
        col: u16,
        pattern: String,
        case_insensitive: bool,
    },
    /// Pop two, push their conjunction (Kleene logic).
    And,
    /// Pop two, push their disjunction (Kleene logic).
    Or,
    /// Pop one, push its negation (unknown stays unknown).
    Not,
}

/// One step of a postfix arithmetic program (an aggregate's argument).
/// Integers and decimals compute exactly (i128, the scale tracked per
/// step); any float operand makes the result float.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum ValueOp {
    Col(u16),
    Lit(Scalar),
    Add,
    Sub,
    Mul,
    Neg,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggFunc {
    /// `count(*)`: rows (the argument is empty).
    CountStar,
    /// Rows whose argument is not NULL.
    Count,
    Sum,
    Min,
    Max,
    /// `sum / count`, computed when partials are merged.
    Avg,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AggSpec {
    pub func: AggFunc,
    #[serde(deserialize_with = "crate::limits::aggs")]
    pub arg: Vec<ValueOp>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SortKey {
    pub col: u16,
    pub descending: bool,
    /// Where NULLs go (SQL's `NULLS FIRST` / `NULLS LAST`).
    pub nulls_first: bool,
}

/// What a query returns.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum QueryOutput {
    /// Rows of `columns` (in that order). With `order_by`, only each tablet's
    /// first `limit` rows in that order (top-k; the client merges); without,
    /// at most `limit` rows of each tablet in no order.
    Rows {
        #[serde(deserialize_with = "crate::limits::columns")]
        columns: Vec<u16>,
        #[serde(deserialize_with = "crate::limits::columns")]
        order_by: Vec<SortKey>,
        limit: Option<u64>,
    },
    /// One row per group of `group_by` values, holding each aggregate's
    /// partial state (merged by the client).
    Aggregate {
        #[serde(deserialize_with = "crate::limits::columns")]
        group_by: Vec<u16>,
        #[serde(deserialize_with = "crate::limits::aggs")]
        aggs: Vec<AggSpec>,
    },
}

/// A query for one tablet of a typed table.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct QueryPlan {
    /// Postfix filter; empty = every row.
    #[serde(deserialize_with = "crate::limits::pred_ops")]
    pub filter: Vec<Pred>,
    pub output: QueryOutput,
}

/// One aggregate's partial state over some rows.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AggState {
    /// Rows counted (`count(*)`) or rows with a non-NULL argument.
    pub count: u64,
    /// Exact sum of integer/decimal arguments (at the argument's scale).
    pub sum_int: i128,
    /// Sum of float arguments.
    pub sum_float: f64,
    pub min: Scalar,
    pub max: Scalar,
}

impl AggState {
    /// The state over no rows: what every partial starts from, and what a
    /// table with no rows answers for a whole-table aggregate.
    pub fn empty() -> AggState {
        AggState {
            count: 0,
            sum_int: 0,
            sum_float: 0.0,
            min: Scalar::Null,
            max: Scalar::Null,
        }
    }
}

/// One group's partial aggregates.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GroupPartial {
    #[serde(deserialize_with = "crate::limits::columns")]
    pub key: Vec<Scalar>,
    #[serde(deserialize_with = "crate::limits::aggs")]
    pub states: Vec<AggState>,
}

/// What one `Query` request returns from one tablet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum QueryData {
    /// An Arrow IPC stream (schema message + record batches) of the rows.
    Rows(#[serde(with = "serde_bytes")] Vec<u8>),
    #[serde(deserialize_with = "crate::limits::groups")]
    Groups(Vec<GroupPartial>),
}

/// One tablet's answer to a `Query` (one page of it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct QueryResult {
    pub data: QueryData,
    /// Rows visited and rows that passed the filter, in this page.
    pub visited: u64,
    pub matched: u64,
    /// Server time on this page, in nanoseconds.
    pub server_nanos: u64,
    /// Where to continue (ask again with this `resume`), or None when the
    /// tablet is done.
    pub resume: Option<QueryResume>,
}

/// Which rows of a secondary index a query wants: a superset of the rows
/// its filter passes (the server applies the filter to each).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum IndexProbe {
    /// `column = v` for any `v` of `values` (one value, or an IN list).
    Eq {
        col: u16,
        #[serde(deserialize_with = "crate::limits::in_list")]
        values: Vec<Scalar>,
    },
    /// `lo <= column <= hi` (each bound inclusive or not, or absent).
    Range {
        col: u16,
        lo: Option<(Scalar, bool)>,
        hi: Option<(Scalar, bool)>,
    },
}

impl IndexProbe {
    pub fn col(&self) -> u16 {
        match self {
            IndexProbe::Eq { col, .. } | IndexProbe::Range { col, .. } => *col,
        }
    }
}

/// How a paged answer continues.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryResume {
    /// The shard walked the whole tablet in one go (one instant of the
    /// tablet) and holds the remaining pages: ask for page `page` (1, 2, ..)
    /// of `cursor`. Asking again for the same page is allowed (a resent
    /// request); asking for page `p` frees the pages before it. Held pages
    /// expire (`Status::CursorExpired`: run the tablet's query again).
    Held { cursor: u64, page: u32 },
    /// The answer was too large to hold: the tablet is paged in key-hash
    /// order from this hash, with the guarantee of `Enumerate`: a row present
    /// and unchanged during the whole query is returned exactly once.
    Hash(u64),
}
