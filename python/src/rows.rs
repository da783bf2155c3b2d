//! A typed table's row from Python (`Transaction.insert`): a dict of column
//! name -> value, turned into one value per column in schema order.
//!
//! Each Python value becomes the `Scalar` that `Table.insert_arrow` makes of
//! it (pyarrow infers int64, double, string, bool, decimal128, date32 or
//! null from a Python list of it; `insitu_rows::arrow::batch_row` reads
//! that as `Int`, `Float`, `Str`, `Bool`, `Decimal`, `Date` or `Null`), and
//! the names are matched by the same `insitu_rows::ColumnMap`: a column the
//! table lacks is refused, a missing one is NULL, refused if NOT NULL. The
//! values are then checked against their columns when the Rust client
//! encodes the row (`Transaction::write_row`, through `coerce`). So a row is
//! accepted or refused as by `insert_arrow`, without needing pyarrow.

use insitu_client::{ClientError, Status};
use insitu_protocol::query::Scalar;
use insitu_protocol::schema::Schema;
use insitu_rows::ColumnMap;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyDate, PyDateAccess, PyDateTime, PyDict, PyFloat, PyInt, PyString, PyTuple,
};

use crate::errors::to_py;

/// `BadRequest` (status set), as the server's own refusals are raised.
pub fn bad_request(py: Python<'_>, msg: String) -> PyErr {
    to_py(py, ClientError::Status(Status::BadRequest, msg))
}

/// The row `row` (a dict of column name -> value) describes, in `schema`'s
/// column order. Refused: not a dict, a name that is not a str, a column
/// the table lacks, a NOT NULL column missing, a value of a kind no column
/// holds; each naming the column.
pub fn row_values(
    py: Python<'_>,
    schema: &Schema,
    row: &Bound<'_, PyAny>,
) -> PyResult<Vec<Scalar>> {
    let dict = row.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "row must be a dict of column name -> value, not {}",
            row.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    let mut names = Vec::with_capacity(dict.len());
    let mut values = Vec::with_capacity(dict.len());
    for (name, value) in dict.iter() {
        let name: String = name.extract().map_err(|_| {
            PyTypeError::new_err(format!("row: column names must be str, not {name:?}"))
        })?;
        values.push(scalar(py, &name, &value)?);
        names.push(name);
    }
    let map = ColumnMap::new(schema, &names).map_err(|e| bad_request(py, format!("row: {e}")))?;
    Ok(map.row(&values))
}

/// The `Scalar` of `value`, for column `column` (named in errors).
fn scalar(py: Python<'_>, column: &str, value: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    if value.is_none() {
        return Ok(Scalar::Null);
    }
    // Before int: a bool is an int in Python.
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(Scalar::Bool(b.is_true()));
    }
    if value.is_instance_of::<PyInt>() {
        return value.extract::<i64>().map(Scalar::Int).map_err(|_| {
            bad_request(
                py,
                format!("column {column:?}: {value} is out of int64's range"),
            )
        });
    }
    if value.is_instance_of::<PyFloat>() {
        return Ok(Scalar::Float(value.extract()?));
    }
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(Scalar::Str(s.to_str()?.to_string()));
    }
    // Before date: a datetime is a date in Python, and dropping its time
    // silently would change the value.
    if value.is_instance_of::<PyDateTime>() {
        return Err(PyTypeError::new_err(format!(
            "column {column:?}: a datetime.datetime; date32 columns take a datetime.date"
        )));
    }
    if let Ok(d) = value.cast::<PyDate>() {
        let days = insitu_rows::date::days_from_civil(
            i64::from(d.get_year()),
            u32::from(d.get_month()),
            u32::from(d.get_day()),
        )
        .ok_or_else(|| bad_request(py, format!("column {column:?}: {value} is out of range")))?;
        return Ok(Scalar::Date(days));
    }
    if is_decimal(py, value)? {
        return decimal(py, column, value);
    }
    Err(PyTypeError::new_err(format!(
        "column {column:?}: a value of type {} fits no column type (int, float, \
         decimal.Decimal, str, bool, datetime.date or None)",
        value.get_type().name()?
    )))
}

fn is_decimal(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    let class = py.import("decimal")?.getattr("Decimal")?;
    value.is_instance(&class)
}

/// A `decimal.Decimal` exactly, from its digits and exponent (`as_tuple`):
/// `value / 10^scale`, as pyarrow's decimal128 holds it.
fn decimal(py: Python<'_>, column: &str, value: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    let bad = |why: &str| bad_request(py, format!("column {column:?}: {value} {why}"));
    let parts = value.call_method0("as_tuple")?;
    let parts = parts.cast::<PyTuple>()?;
    let sign: i64 = parts.get_item(0)?.extract()?;
    let digits: Vec<u8> = parts.get_item(1)?.extract()?;
    // 'n', 'N' or 'F' for NaN and infinities.
    let exponent: i64 = parts
        .get_item(2)?
        .extract()
        .map_err(|_| bad("is not a finite number"))?;
    let too_many = || bad("has more than 18 digits");
    let mut v: i64 = 0;
    for d in digits {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(d)))
            .ok_or_else(too_many)?;
    }
    let scale = if exponent >= 0 {
        let factor = u32::try_from(exponent)
            .ok()
            .and_then(|e| 10i64.checked_pow(e))
            .ok_or_else(too_many)?;
        v = v.checked_mul(factor).ok_or_else(too_many)?;
        0
    } else {
        u8::try_from(-exponent).map_err(|_| too_many())?
    };
    Ok(Scalar::Decimal {
        value: if sign == 1 { -v } else { v },
        scale,
    })
}
