//! Evaluation of scan plans: everything a storage server (or a client, or an
//! in-memory reference) computes from the plan types that `insitu-protocol`
//! carries on the wire.
//!
//! - [`expr`]: parsing field specs (`i64@0`) and `--where` expressions;
//! - [`field`]: reading a numeric field out of a raw value, comparisons;
//! - [`json`]: JSON paths as text (`$.address.city`), comparisons of what
//!   they find; [`json_doc`]: reading a plan's paths out of a document;
//! - [`predicate`]: checking and interpreting a postfix predicate program;
//! - [`validate`]: the whole-plan check both ends run (bounds, types);
//! - [`kernel`]: the per-object work of each operation, monomorphised;
//! - [`aggregate`]: count/sum/min/max partials and their merge;
//! - [`update`]: the read-modify-write of one field;
//! - [`gradient`]: the logistic-regression kernel (AVX2+FMA where available);
//! - [`reference`]: a whole plan over objects in memory (fuzzing, references).
//!
//! `insitu-protocol` stays the bytes on the wire only; this crate never
//! encodes or decodes anything.

pub mod aggregate;
pub mod expr;
pub mod field;
pub mod gradient;
pub mod json;
pub mod json_doc;
#[cfg(test)]
mod json_props;
pub mod kernel;
pub mod predicate;
pub mod reference;
pub mod update;
pub mod validate;

pub use aggregate::{AggExt, Merge, Sum, merge_partial};
pub use field::{as_f64, read_field};
pub use gradient::{FLUSH_POINTS, GradAcc, gradient_flat};
pub use json::parse_path;
pub use predicate::{MAX_PRED_DEPTH, eval, eval_with, key_in_range, validate_predicate};
pub use update::{apply_update, check_action, new_value};
pub use validate::validate_plan;
