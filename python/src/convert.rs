//! Python arguments to client types: keys and values (`bytes`, or `str`
//! encoded as UTF-8), numbers, field specs, `where` expressions, selections.

use insitu_client::{ClientError, Selection};
use insitu_compute::AggExt;
use insitu_compute::expr::{parse_field, parse_where};
use insitu_protocol::Number;
use insitu_protocol::plan::{AggPartial, Field, KeyRange};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFloat, PyInt, PyString};

/// The bytes of a key or value, borrowed from the Python object (no copy):
/// `bytes` as is, `str` as UTF-8. `what` names the argument in errors.
pub fn as_bytes<'a>(obj: &'a Bound<'_, PyAny>, what: &str) -> PyResult<&'a [u8]> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.to_str()?.as_bytes());
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be bytes or str, not {}",
        obj.get_type().name()?
    )))
}

/// Every item of the iterable `keys`, kept alive for `as_bytes`.
pub fn collect<'py>(keys: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    keys.try_iter()?.collect()
}

/// The bytes of every key in `objs` (from `collect`).
pub fn key_slices<'a>(objs: &'a [Bound<'_, PyAny>]) -> PyResult<Vec<&'a [u8]>> {
    objs.iter().map(|k| as_bytes(k, "key")).collect()
}

/// The (key, value) pairs of a mapping (its `items()`) or of an iterable of
/// 2-item sequences, kept alive for `as_bytes`.
pub fn collect_pairs<'py>(
    items: &Bound<'py, PyAny>,
) -> PyResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    let iter = if let Ok(d) = items.cast::<PyDict>() {
        d.items().into_any().try_iter()?
    } else if items.hasattr("items")? && !items.is_instance_of::<PyString>() {
        items.call_method0("items")?.try_iter()?
    } else {
        items.try_iter()?
    };
    let mut out = Vec::new();
    for (i, pair) in iter.enumerate() {
        let pair = pair?;
        let (k, v): (Bound<'py, PyAny>, Bound<'py, PyAny>) = pair.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "item {i} of put_many must be a (key, value) pair or the argument a mapping"
            ))
        })?;
        out.push((k, v));
    }
    Ok(out)
}

/// A Python int (within i64) or finite float as a plan number.
pub fn number(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Number> {
    if obj.is_instance_of::<PyInt>() {
        return obj.extract::<i64>().map(Number::I64).map_err(|_| {
            PyValueError::new_err(format!(
                "{what} {obj} is out of range: integers must be in {}..={}",
                i64::MIN,
                i64::MAX
            ))
        });
    }
    if obj.is_instance_of::<PyFloat>() {
        let f: f64 = obj.extract()?;
        if !f.is_finite() {
            return Err(PyValueError::new_err(format!(
                "{what} {f} is not a finite number"
            )));
        }
        return Ok(Number::F64(f));
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be an int or a float, not {}",
        obj.get_type().name()?
    )))
}

/// A field spec like `"i64@0"`.
pub fn field(spec: &str) -> PyResult<Field> {
    parse_field(spec).map_err(PyValueError::new_err)
}

/// The objects an operation covers: a `where` expression and a key range.
pub fn selection(
    filter: Option<&str>,
    from_key: Option<&Bound<'_, PyAny>>,
    to_key: Option<&Bound<'_, PyAny>>,
) -> PyResult<Selection> {
    let mut sel = match filter {
        None => Selection::all(),
        Some(f) => Selection::filter(
            parse_where(f)
                .map_err(|e| PyValueError::new_err(format!("bad where expression {f:?}: {e}")))?,
        ),
    };
    if from_key.is_some() || to_key.is_some() {
        sel.key_range = Some(KeyRange {
            start: match from_key {
                Some(k) => as_bytes(k, "from_key")?.to_vec(),
                None => Vec::new(),
            },
            end: match to_key {
                Some(k) => Some(as_bytes(k, "to_key")?.to_vec()),
                None => None,
            },
        });
    }
    Ok(sel)
}

/// The aggregate functions `Table.aggregate` accepts.
pub const AGG_OPS: [&str; 5] = ["sum", "min", "max", "avg", "count"];

/// Check an aggregate function name (before any network call).
pub fn agg_op(op: &str) -> PyResult<String> {
    let op = op.to_ascii_lowercase();
    if AGG_OPS.contains(&op.as_str()) {
        Ok(op)
    } else {
        Err(PyValueError::new_err(format!(
            "unknown aggregate {op:?}: use sum, min, max, avg or count"
        )))
    }
}

fn number_py<'py>(py: Python<'py>, n: Number) -> PyResult<Bound<'py, PyAny>> {
    Ok(match n {
        Number::I64(v) => v.into_pyobject(py)?.into_any(),
        Number::F64(v) => v.into_pyobject(py)?.into_any(),
    })
}

/// What an aggregate reads: a number at a byte offset, or a JSON path.
pub enum AggField {
    Raw(Field),
    Json(insitu_protocol::plan::JsonPath),
}

/// The value of aggregate `op` (checked by `agg_op`) from the merged partial:
/// `sum` exact (an int for integer fields, and for a JSON path while every
/// number summed is an integer), `avg`/`min`/`max` None over no objects.
pub fn agg_result<'py>(
    py: Python<'py>,
    op: &str,
    field: &AggField,
    r: &AggPartial,
) -> PyResult<Bound<'py, PyAny>> {
    let (sum, avg) = match field {
        AggField::Raw(f) => (r.sum(f.is_float()), r.avg(f.is_float())),
        AggField::Json(_) => (r.mixed_sum(), r.mixed_avg()),
    };
    Ok(match op {
        "sum" => match sum {
            insitu_compute::Sum::Int(v) => v.into_pyobject(py)?.into_any(),
            insitu_compute::Sum::Float(v) => v.into_pyobject(py)?.into_any(),
        },
        "count" => r.count.into_pyobject(py)?.into_any(),
        "avg" => avg.into_pyobject(py)?.into_any(),
        "min" => match r.min {
            Some(n) => number_py(py, n)?,
            None => py.None().into_bound(py),
        },
        _ => match r.max {
            Some(n) => number_py(py, n)?,
            None => py.None().into_bound(py),
        },
    })
}

/// An aggregate's Python arguments: the function (checked by `agg_op`), the
/// field (`i64@0`) or JSON path (`$.age`) and the selection, each refused
/// before any network call.
pub struct AggregateArgs {
    pub op: String,
    pub field: AggField,
    pub sel: Selection,
}

impl AggregateArgs {
    pub fn parse(
        op: &str,
        field_spec: &str,
        filter: Option<&str>,
        from_key: Option<&Bound<'_, PyAny>>,
        to_key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<AggregateArgs> {
        let field = if field_spec.trim_start().starts_with('$') {
            AggField::Json(
                insitu_compute::parse_path(field_spec.trim())
                    .map_err(|e| PyValueError::new_err(format!("bad JSON path: {e}")))?,
            )
        } else {
            AggField::Raw(field(field_spec)?)
        };
        Ok(AggregateArgs {
            op: agg_op(op)?,
            field,
            sel: selection(filter, from_key, to_key)?,
        })
    }

    /// Run it with `run` (the GIL released) and convert the merged result.
    pub fn run<'py>(
        &self,
        py: Python<'py>,
        run: impl FnOnce(&AggField, &Selection) -> Result<AggPartial, ClientError> + Send,
    ) -> PyResult<Bound<'py, PyAny>> {
        let r = py
            .detach(|| run(&self.field, &self.sel))
            .map_err(|e| crate::errors::to_py(py, e))?;
        agg_result(py, &self.op, &self.field, &r)
    }
}
