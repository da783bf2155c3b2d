//! The read-modify-write of one numeric field (pushdown update).

use insitu_protocol::Number;
use insitu_protocol::plan::{Field, UpdateAction};

use crate::field::{as_f64, read_field};

/// Apply an update to the field's bytes in `value` (already checked long enough).
pub fn apply_update(field: Field, action: UpdateAction, value: &mut [u8]) {
    let o = field.offset();
    let current = read_field(field, value).expect("value checked long enough");
    let new = match action {
        UpdateAction::Set(n) => n,
        UpdateAction::Add(d) => match (current, d) {
            (Number::I64(a), Number::I64(b)) => Number::I64(a.wrapping_add(b)),
            (a, b) => Number::F64(as_f64(a) + as_f64(b)),
        },
    };
    match field {
        Field::I32(_) => {
            let v = match new {
                Number::I64(v) => v as i32,
                Number::F64(v) => v as i32,
            };
            value[o..o + 4].copy_from_slice(&v.to_le_bytes());
        }
        Field::I64(_) => {
            let v = match new {
                Number::I64(v) => v,
                Number::F64(v) => v as i64,
            };
            value[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        Field::F64(_) => value[o..o + 8].copy_from_slice(&as_f64(new).to_le_bytes()),
        Field::U8(_) => {
            value[o] = match new {
                Number::I64(v) => v as u8,
                Number::F64(v) => v as u8,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(a: i64, b: f64, c: i32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&a.to_le_bytes());
        v.extend_from_slice(&b.to_le_bytes());
        v.extend_from_slice(&c.to_le_bytes());
        v
    }

    #[test]
    fn updates_write_the_field() {
        let mut v = value(1, 2.0, 3);
        apply_update(Field::I64(0), UpdateAction::Add(Number::I64(5)), &mut v);
        apply_update(Field::F64(8), UpdateAction::Add(Number::F64(0.5)), &mut v);
        apply_update(Field::I32(16), UpdateAction::Set(Number::I64(-9)), &mut v);
        assert_eq!(v, value(6, 2.5, -9));
    }
}
