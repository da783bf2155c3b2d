//! Writing rows: values checked and converted to their column's type
//! (`coerce`), a row encoded in the layout of `layout.rs` (`encode_row`), and
//! the primary key's bytes (`encode_key`).

use insitu_protocol::query::Scalar;
use insitu_protocol::schema::{Column, ColumnType, Schema};

use crate::RowError;
use crate::layout::{ROW_TAG, RowLayout, Slot};

/// Largest encoded row; the engine's default value limit is 1 MiB.
pub const MAX_ROW_BYTES: usize = 1024 * 1024;
/// Largest encoded primary key (the engine's key limit is 64 KiB).
pub const MAX_KEY_BYTES: usize = 64 * 1024;

/// `10^n` for n <= 18.
pub fn pow10(n: u8) -> i64 {
    10i64.pow(u32::from(n))
}

/// A value as text for messages (a date bare, as a column holds it): also
/// the query crate's, which only frames dates as SQL literals.
pub fn describe(v: &Scalar) -> String {
    match v {
        Scalar::Null => "NULL".into(),
        Scalar::Bool(b) => b.to_string(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Float(f) => f.to_string(),
        // decimal_text handles the scales a column may have (<= 18); a
        // hostile literal's larger scale is shown without it panicking.
        Scalar::Decimal { value, scale } if *scale <= 18 => {
            crate::text::decimal_text(*value, *scale)
        }
        Scalar::Decimal { value, scale } => format!("{value}e-{scale}"),
        Scalar::Date(d) => crate::date::format_date(*d),
        Scalar::Str(s) => format!("{s:?}"),
    }
}

/// `v` as a value of `column`'s type, or why it does not fit: out of range,
/// would lose digits, wrong kind, NULL in a NOT NULL column.
pub fn coerce(v: &Scalar, column: &Column) -> Result<Scalar, RowError> {
    let bad = |why: &str| RowError::Type {
        column: column.name.clone(),
        message: format!("{} does not fit {}: {why}", describe(v), column.ty),
    };
    if matches!(v, Scalar::Null) {
        return if column.nullable {
            Ok(Scalar::Null)
        } else {
            Err(RowError::Type {
                column: column.name.clone(),
                message: "NULL in a NOT NULL column".into(),
            })
        };
    }
    Ok(match (column.ty, v) {
        (ColumnType::Int32, Scalar::Int(i)) => {
            i32::try_from(*i).map_err(|_| bad("out of int32's range"))?;
            Scalar::Int(*i)
        }
        (ColumnType::Int64, Scalar::Int(i)) => Scalar::Int(*i),
        (ColumnType::Float64, Scalar::Float(f)) => Scalar::Float(*f),
        (ColumnType::Float64, Scalar::Int(i)) => Scalar::Float(*i as f64),
        (ColumnType::Float64, Scalar::Decimal { value, scale }) => {
            Scalar::Float(*value as f64 / 10f64.powi(i32::from(*scale)))
        }
        (ColumnType::Decimal { precision, scale }, _) => {
            if let Scalar::Decimal { scale: s, .. } = v
                && *s > insitu_protocol::schema::MAX_DECIMAL_PRECISION
            {
                return Err(bad("a decimal scale above 18"));
            }
            let value = match v {
                Scalar::Int(i) => i
                    .checked_mul(pow10(scale))
                    .ok_or_else(|| bad("too many digits"))?,
                Scalar::Decimal { value, scale: s } if *s <= scale => value
                    .checked_mul(pow10(scale - s))
                    .ok_or_else(|| bad("too many digits"))?,
                Scalar::Decimal { value, scale: s } => {
                    let div = pow10(s - scale);
                    if value % div != 0 {
                        return Err(bad(&format!("more than {scale} digits after the point")));
                    }
                    value / div
                }
                Scalar::Float(f) => {
                    let scaled = (f * pow10(scale) as f64).round();
                    if !scaled.is_finite() || scaled.abs() >= 9.0e18 {
                        return Err(bad("too many digits"));
                    }
                    scaled as i64
                }
                _ => return Err(bad("not a number")),
            };
            if value.unsigned_abs() >= pow10(precision) as u64 {
                return Err(bad(&format!("more than {precision} digits")));
            }
            Scalar::Decimal { value, scale }
        }
        (ColumnType::Date32, Scalar::Date(d)) => Scalar::Date(*d),
        (ColumnType::Date32, Scalar::Str(s)) => Scalar::Date(
            crate::date::parse_date(s).ok_or_else(|| bad("not a date (expected YYYY-MM-DD)"))?,
        ),
        (ColumnType::Utf8, Scalar::Str(s)) => Scalar::Str(s.clone()),
        (ColumnType::Bool, Scalar::Bool(b)) => Scalar::Bool(*b),
        _ => return Err(bad("wrong kind of value")),
    })
}

/// Encode one row of `schema` from one value per column (coerced first).
pub fn encode_row(
    schema: &Schema,
    layout: &RowLayout,
    values: &[Scalar],
) -> Result<Vec<u8>, RowError> {
    if values.len() != schema.columns.len() {
        return Err(RowError::Arity {
            expected: schema.columns.len(),
            got: values.len(),
        });
    }
    let mut row = vec![0u8; layout.var_start()];
    row[0] = ROW_TAG;
    let mut var = Vec::new();
    for (c, (column, value)) in schema.columns.iter().zip(values).enumerate() {
        let value = coerce(value, column)?;
        match layout.slots[c] {
            Slot::Fixed { offset, width } => {
                let bytes: [u8; 8] = match value {
                    Scalar::Null => {
                        row[1 + c / 8] |= 1 << (c % 8);
                        [0; 8]
                    }
                    Scalar::Int(i) if width == 4 => pad4((i as i32).to_le_bytes()),
                    Scalar::Int(i) => i.to_le_bytes(),
                    Scalar::Float(f) => f.to_le_bytes(),
                    Scalar::Decimal { value, .. } => value.to_le_bytes(),
                    Scalar::Date(d) => pad4(d.to_le_bytes()),
                    Scalar::Bool(b) => [u8::from(b), 0, 0, 0, 0, 0, 0, 0],
                    Scalar::Str(_) => unreachable!("coerce gives text only to text columns"),
                };
                row[offset..offset + width].copy_from_slice(&bytes[..width]);
            }
            Slot::Var { index } => {
                match value {
                    Scalar::Null => row[1 + c / 8] |= 1 << (c % 8),
                    Scalar::Str(s) => var.extend_from_slice(s.as_bytes()),
                    _ => unreachable!("coerce gives text columns text"),
                }
                let end = u32::try_from(var.len()).map_err(|_| RowError::TooLarge(var.len()))?;
                let at = layout.fixed_end + 4 * index;
                row[at..at + 4].copy_from_slice(&end.to_le_bytes());
            }
        }
    }
    row.extend_from_slice(&var);
    if row.len() > MAX_ROW_BYTES {
        return Err(RowError::TooLarge(row.len()));
    }
    Ok(row)
}

fn pad4(b: [u8; 4]) -> [u8; 8] {
    [b[0], b[1], b[2], b[3], 0, 0, 0, 0]
}

/// The object key of a row: its key columns (coerced), each encoded so the
/// bytes compare like the values: integers and dates big-endian with the
/// sign bit flipped, decimals likewise (unscaled), text with 0x00 escaped as
/// 0x00 0xFF and ended by 0x00 0x01, bools as one byte. Floats cannot be key
/// columns' only ordering concern here: they encode as their IEEE bits
/// transformed to sort (sign flip / invert).
pub fn encode_key(schema: &Schema, values: &[Scalar]) -> Result<Vec<u8>, RowError> {
    if values.len() != schema.columns.len() {
        return Err(RowError::Arity {
            expected: schema.columns.len(),
            got: values.len(),
        });
    }
    let mut key = Vec::with_capacity(8 * schema.key.len());
    for &k in &schema.key {
        let column = &schema.columns[k as usize];
        match coerce(&values[k as usize], column)? {
            Scalar::Int(i) if column.ty == ColumnType::Int32 => {
                key.extend_from_slice(&((i as i32 as u32) ^ 0x8000_0000).to_be_bytes())
            }
            Scalar::Int(i) | Scalar::Decimal { value: i, .. } => {
                key.extend_from_slice(&((i as u64) ^ (1 << 63)).to_be_bytes())
            }
            Scalar::Date(d) => key.extend_from_slice(&((d as u32) ^ 0x8000_0000).to_be_bytes()),
            Scalar::Float(f) => {
                let bits = f.to_bits();
                let sortable = if bits >> 63 == 1 {
                    !bits
                } else {
                    bits | (1 << 63)
                };
                key.extend_from_slice(&sortable.to_be_bytes())
            }
            Scalar::Bool(b) => key.push(u8::from(b)),
            Scalar::Str(s) => {
                for &b in s.as_bytes() {
                    key.push(b);
                    if b == 0 {
                        key.push(0xFF);
                    }
                }
                key.extend_from_slice(&[0, 1]);
            }
            Scalar::Null => unreachable!("key columns are NOT NULL (Schema::check)"),
        }
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(RowError::TooLarge(key.len()));
    }
    Ok(key)
}
