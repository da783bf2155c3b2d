//! Scan plans: the declarative description of a data operation that a client
//! sends to every tablet of a table (never code), and their partial results.
//! Plain data types only: evaluating them (field reads, the predicate
//! interpreter, the kernels, merging partials) is `insitu-compute`'s job.
//!
//! A plan is `source -> optional key range -> optional predicate -> one op`.
//!
//! Values of a raw table are read as fields at byte offsets, little-endian:
//! `i32@N`, `i64@N`, `f64@N`, `u8@N` (a label byte) and an f32 vector of `D`
//! dimensions at an offset. A value too short for a field is an error of the
//! whole request (`Status::BadRequest`, naming the key), never a silent skip.
//! A JSON value is named by a path instead (`$.age`, see `json_path.rs`);
//! an object without a value there is like SQL's NULL, never an error.
//!
//! The predicate is a postfix program (`Vec<PredOp>`) instead of a tree, so
//! decoding hostile input never recurses and evaluation uses a fixed stack.
//!
//! Integer keys (the `hashtable-lookup` source and the benchmarks): the
//! integer `i` is stored under the 8-byte little-endian key `i.to_le_bytes()`
//! (see [`int_key`]).

use serde::{Deserialize, Serialize};

pub use crate::json_path::{JsonLit, JsonPath, JsonStep};
use crate::message::Number;

/// Most operations a predicate program may have.
pub const MAX_PRED_OPS: usize = 256;
/// Largest vector dimension a gradient plan accepts.
pub const MAX_DIMS: u32 = 65_536;
/// Largest key-range bound, in bytes.
pub const MAX_RANGE_KEY_BYTES: usize = 64 * 1024;

/// The key under which the integer `i` is stored: 8 bytes, little-endian.
#[inline]
pub fn int_key(i: u64) -> [u8; 8] {
    i.to_le_bytes()
}

/// A scalar field of a raw value.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    I32(u32),
    I64(u32),
    F64(u32),
    /// One unsigned byte (a label).
    U8(u32),
}

impl Field {
    pub fn offset(self) -> usize {
        match self {
            Field::I32(o) | Field::I64(o) | Field::F64(o) | Field::U8(o) => o as usize,
        }
    }
    pub fn width(self) -> usize {
        match self {
            Field::I32(_) => 4,
            Field::I64(_) | Field::F64(_) => 8,
            Field::U8(_) => 1,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, Field::F64(_))
    }
    /// Bytes a value needs to hold this field.
    pub fn end(self) -> usize {
        self.offset() + self.width()
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::I32(o) => write!(f, "i32@{o}"),
            Field::I64(o) => write!(f, "i64@{o}"),
            Field::F64(o) => write!(f, "f64@{o}"),
            Field::U8(o) => write!(f, "u8@{o}"),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// One step of a postfix predicate program.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum PredOp {
    /// Push `field OP value`.
    Cmp {
        field: Field,
        op: CmpOp,
        value: Number,
    },
    /// Push `lo <= field <= hi`.
    Between {
        field: Field,
        lo: Number,
        hi: Number,
    },
    /// Pop two, push their conjunction.
    And,
    /// Pop two, push their disjunction.
    Or,
    /// Pop one, push its negation.
    Not,
    /// Push `value at path OP value` for a JSON document: unknown (SQL's
    /// NULL) when the object is not JSON or the path holds no value of the
    /// literal's kind; the program then follows Kleene's three-valued logic
    /// and passes only objects for which it is true.
    JsonCmp {
        path: JsonPath,
        op: CmpOp,
        value: JsonLit,
    },
}

/// Where the objects of a tablet come from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Walk the tablet's log segments (the fast default).
    Log,
    /// Iterate the tablet's hash index.
    Index,
    /// Look up the integer keys `from..to` (see [`int_key`]) in the tablet's
    /// index; keys that hash outside the tablet are skipped.
    IntKeys { from: u64, to: u64 },
}

/// Keys `start <= key < end` (bytewise); `end: None` = no upper bound.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub start: Vec<u8>,
    pub end: Option<Vec<u8>>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub enum UpdateAction {
    Add(Number),
    Set(Number),
}

/// The change a typed update makes to one column of every matched row.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum RowAction {
    /// Store this value (converted to the column's type, or refused; NULL
    /// only in a nullable column).
    Set(crate::query::Scalar),
    /// Add this number to a numeric column (days to a date column); a NULL
    /// stays NULL, as in SQL.
    Add(crate::query::Scalar),
}

/// Points of a logistic regression: an f32 vector and a 0/1 label byte.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct PointLayout {
    /// Byte offset of the vector.
    pub offset: u32,
    pub dims: u32,
    /// Byte offset of the label (0 = negative, anything else = positive).
    pub label_offset: u32,
}

impl PointLayout {
    /// Bytes a value needs.
    pub fn end(&self) -> usize {
        (self.offset as usize + self.dims as usize * 4).max(self.label_offset as usize + 1)
    }
}

/// What to compute over the matched objects.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Op {
    Count,
    /// count, sum, min and max of a numeric field (avg = sum / count, client-side).
    Aggregate {
        field: Field,
    },
    /// Change a numeric field of every matched object; each change is a new
    /// version written through the log.
    Update {
        field: Field,
        action: UpdateAction,
    },
    /// Change columns of every row of a typed table that `filter` passes
    /// (the plan's own `filter` must be empty: it reads raw bytes). Same
    /// guarantees as `Update`: all of a tablet's rows or none.
    UpdateRows {
        /// The table's schema, as the client read it (schemas never change):
        /// the shard compiles the filter and reads rows with it.
        schema: crate::schema::Schema,
        /// Postfix typed filter, SQL's three-valued logic: only rows for
        /// which it is true change. Empty = every row.
        #[serde(deserialize_with = "crate::limits::pred_ops")]
        filter: Vec<crate::query::Pred>,
        /// (column, change): each column (an index into `schema.columns`)
        /// at most once, never a key column (that would move the row to
        /// another key); at least one.
        #[serde(deserialize_with = "crate::limits::columns")]
        set: Vec<(u16, RowAction)>,
    },
    /// Remove every object the plan selects (key range and raw filter);
    /// answered as `Partial::Update { updated }`, the objects removed. Same
    /// guarantees as `Update`: all of a tablet's objects or none.
    Remove,
    /// Remove every row of a typed table that `filter` passes (the plan's
    /// own `filter` must be empty); answered like `Remove`.
    RemoveRows {
        /// The table's schema, as the client read it.
        schema: crate::schema::Schema,
        /// Postfix typed filter (SQL's three-valued logic); empty = every row.
        #[serde(deserialize_with = "crate::limits::pred_ops")]
        filter: Vec<crate::query::Pred>,
    },
    /// Logistic-regression gradient and log-loss sums at `weights`, `bias`.
    Gradient {
        layout: PointLayout,
        #[serde(deserialize_with = "crate::limits::weights")]
        weights: Vec<f32>,
        bias: f32,
    },
    /// count, sum, min and max of the JSON numbers at `path` (objects that
    /// are not JSON or hold no number there are skipped), answered as
    /// `Partial::Aggregate`: integers that fit i64 in `sum_int`, other
    /// numbers in `sum_float`.
    JsonAggregate {
        path: JsonPath,
    },
}

impl Op {
    /// Whether the operation writes (an update or a removal, of raw objects
    /// or typed rows): it holds its tablet, carries an operation id, never
    /// runs at a snapshot.
    pub fn is_update(&self) -> bool {
        matches!(
            self,
            Op::Update { .. } | Op::UpdateRows { .. } | Op::Remove | Op::RemoveRows { .. }
        )
    }
}

/// A declarative plan for one tablet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ScanPlan {
    pub source: Source,
    pub key_range: Option<KeyRange>,
    /// Postfix predicate; empty = every object.
    #[serde(deserialize_with = "crate::limits::pred_ops")]
    pub filter: Vec<PredOp>,
    pub op: Op,
}

impl ScanPlan {
    pub fn new(op: Op) -> ScanPlan {
        ScanPlan {
            source: Source::Log,
            key_range: None,
            filter: Vec::new(),
            op,
        }
    }
}

/// count/sum/min/max of one field over one tablet. Integer fields sum in
/// `sum_int` (exact), float fields in `sum_float`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct AggPartial {
    pub count: u64,
    pub sum_int: i128,
    pub sum_float: f64,
    pub min: Option<Number>,
    pub max: Option<Number>,
}

/// Gradient sums over one tablet's points: `grad[j] = sum (p - y) x_j`,
/// `bias = sum (p - y)`, `loss = sum -[y ln p + (1-y) ln(1-p)]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct GradPartial {
    pub count: u64,
    pub grad: Vec<f64>,
    pub bias: f64,
    pub loss: f64,
}

impl GradPartial {
    pub fn zero(dims: usize) -> GradPartial {
        GradPartial {
            count: 0,
            grad: vec![0.0; dims],
            bias: 0.0,
            loss: 0.0,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Partial {
    Count(u64),
    Aggregate(AggPartial),
    Update { updated: u64 },
    Gradient(GradPartial),
}

/// One tablet's answer to a scan plan.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ScanResult {
    /// Objects visited (matched or not).
    pub visited: u64,
    /// Objects that passed the key range and the predicate.
    pub matched: u64,
    /// Server time spent on the scan itself, in nanoseconds.
    pub server_nanos: u64,
    /// Times the scan restarted because the tablet changed between chunks.
    pub restarts: u32,
    pub partial: Partial,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_round_trip_through_postcard() {
        let plan = ScanPlan {
            source: Source::IntKeys { from: 3, to: 99 },
            key_range: Some(KeyRange {
                start: b"a".to_vec(),
                end: None,
            }),
            filter: vec![
                PredOp::Cmp {
                    field: Field::U8(4),
                    op: CmpOp::Ne,
                    value: Number::I64(0),
                },
                PredOp::Not,
            ],
            op: Op::Gradient {
                layout: PointLayout {
                    offset: 0,
                    dims: 2,
                    label_offset: 8,
                },
                weights: vec![0.5, -1.0],
                bias: 0.25,
            },
        };
        let bytes = postcard::to_stdvec(&plan).unwrap();
        let back: ScanPlan = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, plan);
        let r = ScanResult {
            visited: 5,
            matched: 2,
            server_nanos: 7,
            restarts: 0,
            partial: Partial::Aggregate(AggPartial {
                count: 2,
                sum_int: -3,
                sum_float: 0.0,
                min: Some(Number::I64(-4)),
                max: Some(Number::I64(1)),
            }),
        };
        let bytes = postcard::to_stdvec(&r).unwrap();
        assert_eq!(postcard::from_bytes::<ScanResult>(&bytes).unwrap(), r);
    }
}
