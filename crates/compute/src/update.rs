//! The read-modify-write of one numeric field (pushdown update).
//!
//! Never a wrapped, truncated or non-finite value: [`check_action`] refuses
//! (when the plan is validated, on the client and again on the server) a
//! `set` value the field cannot hold and a non-finite number; [`new_value`]
//! refuses an `add` whose result overflows the field of one object, so the
//! caller can refuse the whole update before writing anything.

use insitu_protocol::Number;
use insitu_protocol::plan::{Field, UpdateAction};

use crate::field::{as_f64, read_field};

/// The integer range a field holds; `None` for a float field.
fn int_range(field: Field) -> Option<(i128, i128)> {
    match field {
        Field::U8(_) => Some((0, u8::MAX as i128)),
        Field::I32(_) => Some((i32::MIN as i128, i32::MAX as i128)),
        Field::I64(_) => Some((i64::MIN as i128, i64::MAX as i128)),
        Field::F64(_) => None,
    }
}

fn type_name(field: Field) -> &'static str {
    match field {
        Field::U8(_) => "u8",
        Field::I32(_) => "i32",
        Field::I64(_) => "i64",
        Field::F64(_) => "f64",
    }
}

/// The number `n` as the field stores it, or why it cannot hold it exactly.
fn representable(field: Field, n: Number) -> Result<Number, String> {
    match (int_range(field), n) {
        (_, Number::F64(x)) if !x.is_finite() => Err(format!(
            "{x} is not a finite number; {field} cannot hold it"
        )),
        (Some((lo, hi)), Number::I64(v)) => {
            if (lo..=hi).contains(&(v as i128)) {
                Ok(n)
            } else {
                Err(format!(
                    "{v} is out of range for {field} ({} holds {lo}..={hi})",
                    type_name(field)
                ))
            }
        }
        (Some((lo, hi)), Number::F64(x)) => {
            // Exactly an integer in range: 2^63 as f64 is already out of i64.
            if x.fract() == 0.0 && x >= lo as f64 && x < hi as f64 + 1.0 {
                Ok(Number::I64(x as i64))
            } else {
                Err(format!(
                    "{x} is not an integer in range for {field} ({} holds {lo}..={hi})",
                    type_name(field)
                ))
            }
        }
        (None, Number::I64(v)) => {
            let x = v as f64;
            if x as i128 == v as i128 {
                Ok(Number::F64(x))
            } else {
                Err(format!("{v} has no exact f64 value for {field}"))
            }
        }
        (None, Number::F64(_)) => Ok(n),
    }
}

/// Check an update action against its field, before any object is visited.
pub fn check_action(field: Field, action: UpdateAction) -> Result<(), String> {
    match action {
        UpdateAction::Set(n) => representable(field, n).map(|_| ()),
        UpdateAction::Add(Number::F64(d)) if int_range(field).is_some() => Err(format!(
            "cannot add the fractional number {d} to the integer field {field}"
        )),
        UpdateAction::Add(Number::F64(d)) if !d.is_finite() => {
            Err(format!("cannot add {d} to {field}: not a finite number"))
        }
        UpdateAction::Add(_) => Ok(()),
    }
}

/// The field's new value in `value` (long enough, action checked), or why
/// this object cannot take it (the sum overflows the field).
pub fn new_value(field: Field, action: UpdateAction, value: &[u8]) -> Result<Number, String> {
    let Some(current) = read_field(field, value) else {
        return Err(format!(
            "value of {} bytes is too short for {field}",
            value.len()
        ));
    };
    match action {
        UpdateAction::Set(n) => representable(field, n),
        UpdateAction::Add(d) => match (int_range(field), current, d) {
            (Some((lo, hi)), Number::I64(a), Number::I64(b)) => {
                let sum = a as i128 + b as i128;
                if (lo..=hi).contains(&sum) {
                    Ok(Number::I64(sum as i64))
                } else {
                    Err(format!(
                        "{field} = {a} plus {b} is {sum}, out of range for {} ({lo}..={hi})",
                        type_name(field)
                    ))
                }
            }
            (Some(_), ..) => Err(format!("cannot add {d:?} to the integer field {field}")),
            (None, a, b) => {
                let (a, b) = (as_f64(a), as_f64(b));
                let sum = a + b;
                if a.is_finite() && !sum.is_finite() {
                    Err(format!("{field} = {a} plus {b} overflows f64"))
                } else {
                    Ok(Number::F64(sum))
                }
            }
        },
    }
}

/// Store `n` (as returned by [`new_value`]) into the field's bytes.
pub fn store(field: Field, n: Number, value: &mut [u8]) {
    let o = field.offset();
    match (field, n) {
        (Field::U8(_), Number::I64(v)) => {
            debug_assert!(u8::try_from(v).is_ok(), "checked by new_value");
            value[o] = v as u8;
        }
        (Field::I32(_), Number::I64(v)) => {
            debug_assert!(i32::try_from(v).is_ok(), "checked by new_value");
            value[o..o + 4].copy_from_slice(&(v as i32).to_le_bytes());
        }
        (Field::I64(_), Number::I64(v)) => value[o..o + 8].copy_from_slice(&v.to_le_bytes()),
        (Field::F64(_), n) => value[o..o + 8].copy_from_slice(&as_f64(n).to_le_bytes()),
        (_, Number::F64(x)) => unreachable!("new_value gives integer fields integers, not {x}"),
    }
}

/// Apply an update to the field's bytes in `value`; on error `value` is unchanged.
pub fn apply_update(field: Field, action: UpdateAction, value: &mut [u8]) -> Result<(), String> {
    let n = new_value(field, action, value)?;
    store(field, n, value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::tests::value;

    #[test]
    fn updates_write_the_field() {
        let mut v = value(1, 2.0, 3);
        let add = |n| UpdateAction::Add(Number::I64(n));
        apply_update(Field::I64(0), add(5), &mut v).unwrap();
        apply_update(Field::F64(8), UpdateAction::Add(Number::F64(0.5)), &mut v).unwrap();
        apply_update(Field::I32(16), UpdateAction::Set(Number::I64(-9)), &mut v).unwrap();
        assert_eq!(v, value(6, 2.5, -9));
        apply_update(Field::U8(16), UpdateAction::Set(Number::F64(200.0)), &mut v).unwrap();
        assert_eq!(v[16], 200);
    }

    #[test]
    fn set_values_the_field_cannot_hold_are_refused() {
        let set = |n| UpdateAction::Set(n);
        for (field, n, want) in [
            (Field::U8(0), Number::I64(300), "out of range"),
            (Field::U8(0), Number::I64(-1), "out of range"),
            (Field::I32(0), Number::I64(5_000_000_000), "out of range"),
            (
                Field::I64(0),
                Number::F64(9.3e18),
                "not an integer in range",
            ),
            (Field::I64(0), Number::F64(1.5), "not an integer"),
            (Field::F64(0), Number::F64(f64::INFINITY), "not a finite"),
            (Field::F64(0), Number::F64(f64::NAN), "not a finite"),
            (Field::F64(0), Number::I64(i64::MAX), "no exact f64"),
        ] {
            let e = check_action(field, set(n)).unwrap_err();
            assert!(e.contains(want), "{field} {n:?}: {e}");
        }
        assert!(check_action(Field::U8(0), set(Number::I64(255))).is_ok());
        assert!(check_action(Field::I32(0), set(Number::I64(i32::MIN as i64))).is_ok());
        assert!(check_action(Field::I64(0), set(Number::F64(i64::MIN as f64))).is_ok());
        assert!(check_action(Field::I64(0), UpdateAction::Add(Number::F64(1.0))).is_err());
        assert!(check_action(Field::F64(0), UpdateAction::Add(Number::F64(f64::NAN))).is_err());
    }

    #[test]
    fn adds_that_overflow_are_refused_and_write_nothing() {
        let mut v = value(i64::MAX, f64::MAX, i32::MIN);
        let before = v.clone();
        let e = apply_update(Field::I64(0), UpdateAction::Add(Number::I64(1)), &mut v).unwrap_err();
        assert!(e.contains("out of range for i64"), "{e}");
        let e =
            apply_update(Field::I32(16), UpdateAction::Add(Number::I64(-1)), &mut v).unwrap_err();
        assert!(e.contains("out of range for i32"), "{e}");
        let e = apply_update(
            Field::F64(8),
            UpdateAction::Add(Number::F64(f64::MAX)),
            &mut v,
        )
        .unwrap_err();
        assert!(e.contains("overflows f64"), "{e}");
        let e = apply_update(Field::U8(0), UpdateAction::Add(Number::I64(1)), &mut v).unwrap_err();
        assert!(e.contains("out of range for u8"), "{e}");
        assert_eq!(v, before);
        // In range: exact.
        apply_update(Field::I64(0), UpdateAction::Add(Number::I64(-1)), &mut v).unwrap();
        assert_eq!(
            read_field(Field::I64(0), &v),
            Some(Number::I64(i64::MAX - 1))
        );
    }
}
