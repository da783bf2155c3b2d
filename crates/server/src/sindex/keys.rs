//! Index keys: a column's values as an index orders them, a probe's
//! literals converted exactly to them, and a probe's key ranges.

use std::ops::Bound;

use insitu_protocol::query::{IndexProbe, Scalar};
use insitu_protocol::schema::ColumnType;
use insitu_rows::RowRef;

/// A column value as the index orders it. Integers, decimals (unscaled,
/// the column's scale), dates and bools are `Int`; text is `Str`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum IKey {
    Int(i64),
    Str(Box<str>),
}

impl IKey {
    /// Heap bytes the key takes in an index (kept twice: the set and the
    /// per-hash list).
    pub(super) fn bytes(&self) -> usize {
        match self {
            IKey::Int(_) => 0,
            IKey::Str(s) => 2 * s.len(),
        }
    }
}

/// Whether a column's values can be indexed.
pub fn indexable(ty: ColumnType) -> bool {
    ty != ColumnType::Float64
}

/// The index key of a row's value (None: NULL, not indexed).
pub(super) fn key_of_row(row: &RowRef<'_>, col: usize) -> Option<IKey> {
    if row.is_null(col) {
        return None;
    }
    Some(match row.layout().types[col] {
        ColumnType::Int32 | ColumnType::Date32 => IKey::Int(i64::from(row.i32(col))),
        ColumnType::Int64 | ColumnType::Decimal { .. } => IKey::Int(row.i64(col)),
        ColumnType::Bool => IKey::Int(i64::from(row.bool(col))),
        ColumnType::Utf8 => IKey::Str(row.str(col).ok()?.into()),
        ColumnType::Float64 => return None,
    })
}

/// The index key equal to the literal `v` in a column of type `ty`, or None
/// when no value of the column equals it exactly (then the probe is not
/// used: the query scans, and the filter decides).
pub(super) fn key_of_literal(ty: ColumnType, v: &Scalar) -> Option<IKey> {
    let pow10 = |n: u8| 10i64.checked_pow(u32::from(n));
    match (ty, v) {
        (ColumnType::Int32 | ColumnType::Int64, Scalar::Int(i)) => Some(IKey::Int(*i)),
        (ColumnType::Int32 | ColumnType::Int64, Scalar::Decimal { value, scale }) => {
            let p = pow10(*scale)?;
            (value % p == 0).then(|| IKey::Int(value / p))
        }
        (ColumnType::Decimal { scale, .. }, Scalar::Int(i)) => {
            Some(IKey::Int(i.checked_mul(pow10(scale)?)?))
        }
        (ColumnType::Decimal { scale: s, .. }, Scalar::Decimal { value, scale: p }) => {
            if *p <= s {
                Some(IKey::Int(value.checked_mul(pow10(s - p)?)?))
            } else {
                let d = pow10(p - s)?;
                (value % d == 0).then(|| IKey::Int(value / d))
            }
        }
        (ColumnType::Date32, Scalar::Date(d)) => Some(IKey::Int(i64::from(*d))),
        (ColumnType::Bool, Scalar::Bool(b)) => Some(IKey::Int(i64::from(*b))),
        (ColumnType::Utf8, Scalar::Str(s)) => Some(IKey::Str(s.as_str().into())),
        _ => None,
    }
}

/// The key ranges a probe covers, or None if it cannot use the index.
pub(super) fn probe_ranges(
    ty: ColumnType,
    probe: &IndexProbe,
) -> Option<Vec<(Bound<IKey>, Bound<IKey>)>> {
    match probe {
        IndexProbe::Eq { values, .. } => values
            .iter()
            .map(|v| {
                let k = key_of_literal(ty, v)?;
                Some((Bound::Included(k.clone()), Bound::Included(k)))
            })
            .collect(),
        IndexProbe::Range { lo, hi, .. } => {
            let bound = |b: &Option<(Scalar, bool)>| -> Option<Bound<IKey>> {
                Some(match b {
                    None => Bound::Unbounded,
                    Some((v, true)) => Bound::Included(key_of_literal(ty, v)?),
                    Some((v, false)) => Bound::Excluded(key_of_literal(ty, v)?),
                })
            };
            let (lo, hi) = (bound(lo)?, bound(hi)?);
            // BTreeSet::range panics on an empty or inverted range.
            let empty = match (&lo, &hi) {
                (Bound::Included(a), Bound::Included(b)) => a > b,
                (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
                | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
                _ => false,
            };
            Some(if empty { Vec::new() } else { vec![(lo, hi)] })
        }
    }
}

/// A range of (value, hash) pairs, as its two bounds.
pub(super) type PairRange = (Bound<(IKey, u64)>, Bound<(IKey, u64)>);

/// Range bounds on values as bounds on (value, hash) pairs.
pub(super) trait MapBoth {
    fn map_both(self) -> PairRange;
}

impl MapBoth for (Bound<IKey>, Bound<IKey>) {
    fn map_both(self) -> PairRange {
        let lo = match self.0 {
            Bound::Included(k) => Bound::Included((k, 0)),
            Bound::Excluded(k) => Bound::Excluded((k, u64::MAX)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let hi = match self.1 {
            Bound::Included(k) => Bound::Included((k, u64::MAX)),
            Bound::Excluded(k) => Bound::Excluded((k, 0)),
            Bound::Unbounded => Bound::Unbounded,
        };
        (lo, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_convert_exactly_or_not_at_all() {
        let dec = ColumnType::Decimal {
            precision: 15,
            scale: 2,
        };
        assert_eq!(key_of_literal(dec, &Scalar::Int(3)), Some(IKey::Int(300)));
        let d = |value, scale| Scalar::Decimal { value, scale };
        assert_eq!(key_of_literal(dec, &d(305, 2)), Some(IKey::Int(305)));
        assert_eq!(key_of_literal(dec, &d(31, 1)), Some(IKey::Int(310)));
        assert_eq!(key_of_literal(dec, &d(3050, 3)), Some(IKey::Int(305)));
        assert_eq!(
            key_of_literal(dec, &d(3051, 3)),
            None,
            "no 2-digit value equals it"
        );
        assert_eq!(
            key_of_literal(dec, &Scalar::Int(i64::MAX)),
            None,
            "overflow"
        );
        assert_eq!(
            key_of_literal(ColumnType::Int64, &d(500, 2)),
            Some(IKey::Int(5))
        );
        assert_eq!(key_of_literal(ColumnType::Int64, &d(501, 2)), None);
        assert_eq!(
            key_of_literal(ColumnType::Int64, &Scalar::Str("5".into())),
            None
        );
        assert_eq!(
            key_of_literal(ColumnType::Utf8, &Scalar::Str("x".into())),
            Some(IKey::Str("x".into()))
        );
        assert_eq!(
            key_of_literal(ColumnType::Date32, &Scalar::Date(-3)),
            Some(IKey::Int(-3))
        );
    }

    #[test]
    fn empty_and_inverted_ranges_cover_nothing() {
        let r = |lo: Option<(Scalar, bool)>, hi: Option<(Scalar, bool)>| {
            probe_ranges(ColumnType::Int64, &IndexProbe::Range { col: 0, lo, hi }).unwrap()
        };
        assert!(r(Some((Scalar::Int(5), true)), Some((Scalar::Int(4), true))).is_empty());
        assert!(r(Some((Scalar::Int(5), false)), Some((Scalar::Int(5), true))).is_empty());
        assert!(r(Some((Scalar::Int(5), true)), Some((Scalar::Int(5), false))).is_empty());
        assert_eq!(
            r(Some((Scalar::Int(5), true)), Some((Scalar::Int(5), true))).len(),
            1
        );
        assert_eq!(r(None, None).len(), 1);
    }
}
