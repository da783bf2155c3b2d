//! Arrow arrays from `Scalar`s (top-k rows, group keys, min/max), checked:
//! a value that does not fit the column's type is an error (partials come
//! from servers and are not trusted by the client).

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder,
};
use arrow_schema::DataType;
use insitu_protocol::query::Scalar;

use crate::QueryError;
use crate::value::describe;

fn mismatch(v: &Scalar, dt: &DataType, name: &str) -> QueryError {
    QueryError::Arrow(format!(
        "column {name:?}: the value {} does not fit {dt}",
        describe(v)
    ))
}

/// An array of type `dt` holding `values` (NULL for `Scalar::Null`).
pub fn array_of<'a>(
    dt: &DataType,
    name: &str,
    values: impl ExactSizeIterator<Item = &'a Scalar>,
) -> Result<ArrayRef, QueryError> {
    let n = values.len();
    macro_rules! fill {
        ($b:expr, $pat:pat => $e:expr) => {{
            let mut b = $b;
            for v in values {
                match v {
                    Scalar::Null => b.append_null(),
                    $pat => b.append_value($e),
                    other => return Err(mismatch(other, dt, name)),
                }
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    Ok(match dt {
        DataType::Int32 => {
            let mut b = Int32Builder::with_capacity(n);
            for v in values {
                match v {
                    Scalar::Null => b.append_null(),
                    Scalar::Int(i) => {
                        b.append_value(i32::try_from(*i).map_err(|_| mismatch(v, dt, name))?)
                    }
                    other => return Err(mismatch(other, dt, name)),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Int64 => fill!(Int64Builder::with_capacity(n), Scalar::Int(i) => *i),
        DataType::Float64 => fill!(Float64Builder::with_capacity(n), Scalar::Float(f) => *f),
        DataType::Date32 => fill!(Date32Builder::with_capacity(n), Scalar::Date(d) => *d),
        DataType::Boolean => fill!(BooleanBuilder::with_capacity(n), Scalar::Bool(b) => *b),
        DataType::Utf8 => {
            let mut b = StringBuilder::with_capacity(n, 0);
            for v in values {
                match v {
                    Scalar::Null => b.append_null(),
                    Scalar::Str(s) => b.append_value(s),
                    other => return Err(mismatch(other, dt, name)),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Decimal128(p, s) => {
            let mut b = Decimal128Builder::with_capacity(n)
                .with_precision_and_scale(*p, *s)
                .map_err(|e| QueryError::Arrow(e.to_string()))?;
            for v in values {
                match v {
                    Scalar::Null => b.append_null(),
                    Scalar::Decimal { value, scale } if i16::from(*scale) == i16::from(*s) => {
                        b.append_value(i128::from(*value))
                    }
                    other => return Err(mismatch(other, dt, name)),
                }
            }
            Arc::new(b.finish())
        }
        other => {
            return Err(QueryError::Arrow(format!(
                "column {name:?}: type {other} is not produced by queries"
            )));
        }
    })
}
