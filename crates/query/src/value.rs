//! Values compared the one way every part of this crate agrees on (the fast
//! filter, the sinks, the merges and the reference evaluator):
//!
//! - integers and decimals compare exactly: both scaled to the larger scale
//!   in i128 (an i64 times 10^18 fits i128 with room to spare);
//! - once a float is involved, both sides are f64 (`exact_to_f64`), NaN is
//!   larger than every number and equal to itself, and -0.0 equals 0.0
//!   (PostgreSQL's order);
//! - dates with dates, booleans with booleans (false < true), text with
//!   text by bytes (UTF-8 byte order is code-point order).

use std::cmp::Ordering;

use insitu_protocol::query::Scalar;
use insitu_protocol::schema::ColumnType;

/// `10^n` as i128 for n <= 38 (the largest power that fits).
pub fn pow10_i128(n: u32) -> i128 {
    assert!(n <= 38, "10^{n} does not fit i128");
    10i128.pow(n)
}

/// `v / 10^scale` as f64: the one conversion of an exact number to float.
pub fn exact_to_f64(v: i128, scale: u32) -> f64 {
    if scale == 0 {
        v as f64
    } else {
        v as f64 / pow10_i128(scale.min(38)) as f64
    }
}

/// Total order on floats: NaN above every number and equal to itself,
/// -0.0 == 0.0.
pub fn float_cmp(a: f64, b: f64) -> Ordering {
    match a.partial_cmp(&b) {
        Some(o) => o,
        None => a.is_nan().cmp(&b.is_nan()),
    }
}

/// Which values can be compared with which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// int32, int64, decimal, float64 (inter-comparable).
    Number,
    Date,
    Text,
    Bool,
}

impl Kind {
    pub fn of_column(ty: ColumnType) -> Kind {
        match ty {
            ColumnType::Int32
            | ColumnType::Int64
            | ColumnType::Float64
            | ColumnType::Decimal { .. } => Kind::Number,
            ColumnType::Date32 => Kind::Date,
            ColumnType::Utf8 => Kind::Text,
            ColumnType::Bool => Kind::Bool,
        }
    }

    /// None for NULL (comparable with anything; the answer is unknown).
    pub fn of_scalar(v: &Scalar) -> Option<Kind> {
        match v {
            Scalar::Null => None,
            Scalar::Int(_) | Scalar::Float(_) | Scalar::Decimal { .. } => Some(Kind::Number),
            Scalar::Date(_) => Some(Kind::Date),
            Scalar::Str(_) => Some(Kind::Text),
            Scalar::Bool(_) => Some(Kind::Bool),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Number => "a number",
            Kind::Date => "a date",
            Kind::Text => "text",
            Kind::Bool => "a boolean",
        }
    }
}

/// An exact number as (unscaled value, scale).
fn exact(v: &Scalar) -> Option<(i128, u32)> {
    match *v {
        Scalar::Int(i) => Some((i128::from(i), 0)),
        Scalar::Decimal { value, scale } => Some((i128::from(value), u32::from(scale))),
        _ => None,
    }
}

/// Compare two exact numbers at the larger of their scales. Scales above 38
/// cannot come from a checked plan; they compare as floats rather than panic.
pub fn exact_cmp(a: i128, sa: u32, b: i128, sb: u32) -> Ordering {
    let s = sa.max(sb);
    if s > 38 {
        return float_cmp(exact_to_f64(a, sa), exact_to_f64(b, sb));
    }
    match (
        a.checked_mul(pow10_i128(s - sa)),
        b.checked_mul(pow10_i128(s - sb)),
    ) {
        (Some(x), Some(y)) => x.cmp(&y),
        _ => float_cmp(exact_to_f64(a, sa), exact_to_f64(b, sb)),
    }
}

/// `a` compared with `b`, or None when either is NULL or they are of kinds
/// that do not compare.
pub fn cmp_scalars(a: &Scalar, b: &Scalar) -> Option<Ordering> {
    match (a, b) {
        (Scalar::Null, _) | (_, Scalar::Null) => None,
        (Scalar::Float(x), Scalar::Float(y)) => Some(float_cmp(*x, *y)),
        (Scalar::Float(x), o) => exact(o).map(|(v, s)| float_cmp(*x, exact_to_f64(v, s))),
        (o, Scalar::Float(y)) => exact(o).map(|(v, s)| float_cmp(exact_to_f64(v, s), *y)),
        (Scalar::Date(x), Scalar::Date(y)) => Some(x.cmp(y)),
        (Scalar::Bool(x), Scalar::Bool(y)) => Some(x.cmp(y)),
        (Scalar::Str(x), Scalar::Str(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        _ => {
            let (x, sx) = exact(a)?;
            let (y, sy) = exact(b)?;
            Some(exact_cmp(x, sx, y, sy))
        }
    }
}

/// Whether two values fall in the same group: both NULL, or equal.
pub fn group_eq(a: &Scalar, b: &Scalar) -> bool {
    match (a, b) {
        (Scalar::Null, Scalar::Null) => true,
        _ => cmp_scalars(a, b) == Some(Ordering::Equal),
    }
}

/// The order of one sort key: NULLs first or last whatever the direction,
/// values by `cmp_scalars` (reversed when descending).
pub fn sort_cmp(a: &Scalar, b: &Scalar, descending: bool, nulls_first: bool) -> Ordering {
    match (a, b) {
        (Scalar::Null, Scalar::Null) => Ordering::Equal,
        (Scalar::Null, _) => {
            if nulls_first {
                Ordering::Less
            } else {
                Ordering::Greater
            }
        }
        (_, Scalar::Null) => {
            if nulls_first {
                Ordering::Greater
            } else {
                Ordering::Less
            }
        }
        _ => {
            let o = cmp_scalars(a, b).unwrap_or(Ordering::Equal);
            if descending { o.reverse() } else { o }
        }
    }
}

/// A value as text for messages: the row format's text, but a date as the
/// literal a query would spell it.
pub fn describe(v: &Scalar) -> String {
    match v {
        Scalar::Date(d) => format!("DATE '{}'", insitu_rows::date::format_date(*d)),
        _ => insitu_rows::encode::describe(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_exactly_across_scales_and_kinds() {
        let d = |value, scale| Scalar::Decimal { value, scale };
        assert_eq!(cmp_scalars(&d(150, 2), &d(15, 1)), Some(Ordering::Equal));
        assert_eq!(
            cmp_scalars(&Scalar::Int(2), &d(199, 2)),
            Some(Ordering::Greater)
        );
        // 2^53 + 1 vs 2^53: floats would call them equal.
        assert_eq!(
            cmp_scalars(&Scalar::Int((1 << 53) + 1), &Scalar::Int(1 << 53)),
            Some(Ordering::Greater)
        );
        assert_eq!(
            cmp_scalars(&Scalar::Float(f64::NAN), &Scalar::Int(5)),
            Some(Ordering::Greater)
        );
        assert_eq!(
            cmp_scalars(&Scalar::Float(-0.0), &Scalar::Float(0.0)),
            Some(Ordering::Equal)
        );
        assert_eq!(cmp_scalars(&Scalar::Null, &Scalar::Int(1)), None);
        assert_eq!(cmp_scalars(&Scalar::Date(1), &Scalar::Int(1)), None);
        assert_eq!(exact_cmp(i128::from(i64::MAX), 0, 1, 18), Ordering::Greater);
    }
}
