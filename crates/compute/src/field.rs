//! Reading numeric fields out of raw values, and comparing numbers.
//!
//! Values are read as fields at byte offsets, little-endian: `i32@N`,
//! `i64@N`, `f64@N`, `u8@N`. Integers of every width are widened to i64.

use insitu_protocol::Number;
use insitu_protocol::plan::{CmpOp, Field};

/// Read `field` from `value`; `None` if the value is too short.
#[inline(always)]
pub fn read_field(field: Field, value: &[u8]) -> Option<Number> {
    let o = field.offset();
    Some(match field {
        Field::I32(_) => {
            Number::I64(i32::from_le_bytes(value.get(o..o + 4)?.try_into().ok()?) as i64)
        }
        Field::I64(_) => Number::I64(i64::from_le_bytes(value.get(o..o + 8)?.try_into().ok()?)),
        Field::F64(_) => Number::F64(f64::from_le_bytes(value.get(o..o + 8)?.try_into().ok()?)),
        Field::U8(_) => Number::I64(*value.get(o)? as i64),
    })
}

#[inline(always)]
pub fn as_f64(n: Number) -> f64 {
    match n {
        Number::I64(v) => v as f64,
        Number::F64(v) => v,
    }
}

/// `a < b`, exact between two integers, as f64 otherwise.
#[inline(always)]
pub fn num_lt(a: Number, b: Number) -> bool {
    match (a, b) {
        (Number::I64(x), Number::I64(y)) => x < y,
        (x, y) => as_f64(x) < as_f64(y),
    }
}

/// `a OP b`, exact between two integers, as f64 otherwise; with a NaN only
/// "not equal" holds.
#[inline(always)]
pub fn compare(a: Number, op: CmpOp, b: Number) -> bool {
    let ord = match (a, b) {
        (Number::I64(x), Number::I64(y)) => x.partial_cmp(&y),
        (x, y) => as_f64(x).partial_cmp(&as_f64(y)),
    };
    let Some(ord) = ord else {
        return op == CmpOp::Ne; // NaN: only "not equal" holds
    };
    holds(ord, op)
}

/// Whether `a OP b` holds when `a` compares to `b` as `ord`.
#[inline(always)]
pub(crate) fn holds(ord: std::cmp::Ordering, op: CmpOp) -> bool {
    use std::cmp::Ordering::*;
    match op {
        CmpOp::Eq => ord == Equal,
        CmpOp::Ne => ord != Equal,
        CmpOp::Lt => ord == Less,
        CmpOp::Le => ord != Greater,
        CmpOp::Gt => ord == Greater,
        CmpOp::Ge => ord != Less,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A value of an i64 at 0, an f64 at 8 and an i32 at 16: the layout the
    /// predicate and update tests of this crate read and write too.
    pub(crate) fn value(a: i64, b: f64, c: i32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&a.to_le_bytes());
        v.extend_from_slice(&b.to_le_bytes());
        v.extend_from_slice(&c.to_le_bytes());
        v
    }

    #[test]
    fn fields_read_little_endian_and_report_short_values() {
        let v = value(-5, 2.5, 7);
        assert_eq!(read_field(Field::I64(0), &v), Some(Number::I64(-5)));
        assert_eq!(read_field(Field::F64(8), &v), Some(Number::F64(2.5)));
        assert_eq!(read_field(Field::I32(16), &v), Some(Number::I64(7)));
        assert_eq!(read_field(Field::U8(16), &v), Some(Number::I64(7)));
        assert_eq!(read_field(Field::I32(17), &v), None);
        assert_eq!(read_field(Field::I64(u32::MAX), &v), None);
    }

    #[test]
    fn comparisons_mix_ints_and_floats_and_nan() {
        assert!(compare(
            Number::I64(i64::MAX),
            CmpOp::Gt,
            Number::I64(i64::MAX - 1)
        ));
        assert!(compare(Number::I64(2), CmpOp::Lt, Number::F64(2.5)));
        assert!(!compare(
            Number::F64(f64::NAN),
            CmpOp::Eq,
            Number::F64(f64::NAN)
        ));
        assert!(compare(Number::F64(f64::NAN), CmpOp::Ne, Number::I64(1)));
    }
}
