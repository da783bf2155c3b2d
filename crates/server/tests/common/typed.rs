//! Typed-query pieces the tests share.

use insitu_protocol::plan::CmpOp;
use insitu_protocol::query::{IndexProbe, Pred, Scalar};

/// `column = v` as a filter, and as the probe of an index on that column.
pub fn int_eq(col: u16, v: i64) -> (Vec<Pred>, IndexProbe) {
    let filter = vec![Pred::Cmp {
        col,
        op: CmpOp::Eq,
        value: Scalar::Int(v),
    }];
    let probe = IndexProbe::Eq {
        col,
        values: vec![Scalar::Int(v)],
    };
    (filter, probe)
}
