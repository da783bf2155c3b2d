//! The client's side: tablets' partial groups merged, the final aggregate
//! batch, and tablets' top-k answers merged. Everything from servers is
//! checked against the plan (an answer that does not fit is an error, not a
//! panic).

use std::cmp::Ordering;
use std::sync::Arc;

use arrow_array::{ArrayRef, Decimal128Array, Float64Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field};
use hashbrown::HashMap;
use insitu_protocol::query::{
    AggFunc, AggSpec, AggState, GroupPartial, QueryOutput, QueryPlan, Scalar, ValueOp,
};
use insitu_protocol::schema::Schema;
use insitu_rows::arrow::{arrow_type, batch_row, projected_schema};

use crate::QueryError;
use crate::arith::{ArgType, compile_arg};
use crate::build::array_of;
use crate::compile::top_k_columns;
use crate::sink::cmp_rows;
use crate::value::{cmp_scalars, describe, exact_to_f64, pow10_i128};

fn bad_answer(m: String) -> QueryError {
    QueryError::Eval(format!("a tablet's answer does not fit the query: {m}"))
}

fn aggregate_plan(plan: &QueryPlan) -> Result<(&[u16], &[AggSpec]), QueryError> {
    match &plan.output {
        QueryOutput::Aggregate { group_by, aggs } => Ok((group_by, aggs)),
        QueryOutput::Rows { .. } => Err(QueryError::Plan(
            "groups are merged only for an aggregate query".into(),
        )),
    }
}

/// A group key's bytes for hashing: per value a tag then its bytes (floats
/// normalised: -0.0 as 0.0, one NaN), so equal keys hash alike.
fn key_bytes(key: &[Scalar], out: &mut Vec<u8>) {
    out.clear();
    for v in key {
        match v {
            Scalar::Null => out.push(0),
            Scalar::Bool(b) => out.extend_from_slice(&[1, u8::from(*b)]),
            Scalar::Int(i) => {
                out.push(2);
                out.extend_from_slice(&i.to_le_bytes());
            }
            Scalar::Float(f) => {
                let f = if f.is_nan() { f64::NAN } else { f + 0.0 };
                out.push(3);
                out.extend_from_slice(&f.to_bits().to_le_bytes());
            }
            Scalar::Decimal { value, scale } => {
                out.push(4);
                out.extend_from_slice(&value.to_le_bytes());
                out.push(*scale);
            }
            Scalar::Date(d) => {
                out.push(5);
                out.extend_from_slice(&d.to_le_bytes());
            }
            Scalar::Str(s) => {
                out.push(6);
                out.extend_from_slice(&(s.len() as u64).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
    }
}

/// The smaller (`want` Less) or larger of a stored extreme and a new one;
/// NULL means none yet.
fn pick(cur: &mut Scalar, new: Scalar, want: Ordering) -> Result<(), QueryError> {
    if new == Scalar::Null {
        return Ok(());
    }
    if *cur == Scalar::Null {
        *cur = new;
        return Ok(());
    }
    match cmp_scalars(&new, cur) {
        Some(o) if o == want => *cur = new,
        Some(_) => {}
        None => {
            return Err(bad_answer(format!(
                "min/max values {} and {} do not compare",
                describe(&new),
                describe(cur)
            )));
        }
    }
    Ok(())
}

fn merge_state(into: &mut AggState, s: AggState) -> Result<(), QueryError> {
    into.count = into
        .count
        .checked_add(s.count)
        .ok_or_else(|| bad_answer("counts overflow".into()))?;
    into.sum_int = into
        .sum_int
        .checked_add(s.sum_int)
        .ok_or_else(|| QueryError::Eval("a sum overflowed 128 bits".into()))?;
    into.sum_float += s.sum_float;
    pick(&mut into.min, s.min, Ordering::Less)?;
    pick(&mut into.max, s.max, Ordering::Greater)?;
    Ok(())
}

/// Merge tablets' partial groups (and pages of one tablet) into one
/// partial per group, in order of first appearance.
pub fn merge_groups(
    plan: &QueryPlan,
    parts: Vec<Vec<GroupPartial>>,
) -> Result<Vec<GroupPartial>, QueryError> {
    let (group_by, aggs) = aggregate_plan(plan)?;
    let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut out: Vec<GroupPartial> = Vec::new();
    let mut buf = Vec::new();
    for g in parts.into_iter().flatten() {
        if g.key.len() != group_by.len() || g.states.len() != aggs.len() {
            return Err(bad_answer(format!(
                "a group of {} values and {} aggregates, the query has {} and {}",
                g.key.len(),
                g.states.len(),
                group_by.len(),
                aggs.len()
            )));
        }
        key_bytes(&g.key, &mut buf);
        match index.get(buf.as_slice()) {
            Some(&i) => {
                for (into, s) in out[i].states.iter_mut().zip(g.states) {
                    merge_state(into, s)?;
                }
            }
            None => {
                index.insert(buf.clone(), out.len());
                out.push(g);
            }
        }
    }
    Ok(out)
}

/// The name of an aggregate's column: `count(*)`, `sum(l_quantity)`,
/// `sum(l_extendedprice * (1 - l_discount))`.
pub fn agg_name(schema: &Schema, spec: &AggSpec) -> String {
    let func = match spec.func {
        AggFunc::CountStar => return "count(*)".into(),
        AggFunc::Count => "count",
        AggFunc::Sum => "sum",
        AggFunc::Min => "min",
        AggFunc::Max => "max",
        AggFunc::Avg => "avg",
    };
    // (text, whether it is a bare operand that needs no parentheses)
    let mut st: Vec<(String, bool)> = Vec::new();
    for op in &spec.arg {
        let item = match op {
            ValueOp::Col(c) => (
                schema
                    .columns
                    .get(*c as usize)
                    .map_or_else(|| format!("#{c}"), |col| col.name.clone()),
                true,
            ),
            ValueOp::Lit(v) => (describe(v), true),
            ValueOp::Neg => {
                let (a, atom) = st.pop().unwrap_or_default();
                (
                    if atom {
                        format!("-{a}")
                    } else {
                        format!("-({a})")
                    },
                    true,
                )
            }
            ValueOp::Add | ValueOp::Sub | ValueOp::Mul => {
                let (b, batom) = st.pop().unwrap_or_default();
                let (a, aatom) = st.pop().unwrap_or_default();
                let sym = match op {
                    ValueOp::Add => "+",
                    ValueOp::Sub => "-",
                    _ => "*",
                };
                let wrap = |t: String, atom: bool| if atom { t } else { format!("({t})") };
                (
                    format!("{} {sym} {}", wrap(a, aatom), wrap(b, batom)),
                    false,
                )
            }
        };
        st.push(item);
    }
    format!("{func}({})", st.pop().unwrap_or_default().0)
}

/// The Arrow type of an aggregate's result.
fn result_type(schema: &Schema, spec: &AggSpec, ty: Option<ArgType>) -> DataType {
    match (spec.func, ty) {
        (AggFunc::CountStar | AggFunc::Count, _) | (_, None) => DataType::Int64,
        (AggFunc::Avg, _) => DataType::Float64,
        (AggFunc::Min | AggFunc::Max, _) if matches!(spec.arg.as_slice(), [ValueOp::Col(_)]) => {
            let [ValueOp::Col(c)] = spec.arg.as_slice() else {
                unreachable!("matched above")
            };
            arrow_type(schema.columns[*c as usize].ty)
        }
        (_, Some(ArgType::Int)) => DataType::Int64,
        (_, Some(ArgType::Decimal(s))) => DataType::Decimal128(38, s as i8),
        (_, Some(ArgType::Float)) => DataType::Float64,
        (_, Some(ArgType::Date)) => DataType::Date32,
        (_, Some(ArgType::Text)) => DataType::Utf8,
        (_, Some(ArgType::Bool)) => DataType::Boolean,
    }
}

/// The final batch of an aggregate query: the group columns (named as the
/// columns), then one column per aggregate (named by `agg_name`). count →
/// Int64; sum of integers → Int64 (an error beyond it); sum of decimals of
/// scale s → Decimal128(38, s); sum of floats → Float64; min/max → the
/// argument's type; avg → Float64. Sum, min, max and avg over no values are
/// NULL. Without GROUP BY there is one row even over no groups.
pub fn finalize_groups(
    schema: &Schema,
    plan: &QueryPlan,
    groups: &[GroupPartial],
) -> Result<RecordBatch, QueryError> {
    let (group_by, aggs) = aggregate_plan(plan)?;
    let empty;
    let groups = if group_by.is_empty() && groups.is_empty() {
        empty = [GroupPartial {
            key: Vec::new(),
            states: (0..aggs.len()).map(|_| AggState::empty()).collect(),
        }];
        &empty[..]
    } else {
        groups
    };
    for g in groups {
        if g.key.len() != group_by.len() || g.states.len() != aggs.len() {
            return Err(bad_answer("a group of the wrong shape".into()));
        }
    }
    let mut fields = Vec::new();
    let mut arrays: Vec<ArrayRef> = Vec::new();
    for (j, &c) in group_by.iter().enumerate() {
        let col = crate::compile::column(schema, c, "GROUP BY")?;
        let dt = arrow_type(col.ty);
        arrays.push(array_of(&dt, &col.name, groups.iter().map(|g| &g.key[j]))?);
        fields.push(Field::new(&col.name, dt, true));
    }
    for (a, spec) in aggs.iter().enumerate() {
        let name = agg_name(schema, spec);
        let (_, ty) = compile_arg(schema, &spec.arg, &name)?;
        let dt = result_type(schema, spec, ty);
        let states = groups.iter().map(|g| &g.states[a]);
        let array: ArrayRef = match spec.func {
            AggFunc::CountStar | AggFunc::Count => Arc::new(
                states
                    .map(|s| i64::try_from(s.count).map(Some))
                    .collect::<Result<Int64Array, _>>()
                    .map_err(|_| bad_answer("a count beyond int64".into()))?,
            ),
            AggFunc::Avg => Arc::new(
                states
                    .map(|s| {
                        (s.count > 0).then(|| match ty {
                            Some(ArgType::Float) => s.sum_float / s.count as f64,
                            t => {
                                exact_to_f64(s.sum_int, t.map_or(0, ArgType::scale))
                                    / s.count as f64
                            }
                        })
                    })
                    .collect::<Float64Array>(),
            ),
            AggFunc::Sum => match ty {
                Some(ArgType::Float) => Arc::new(
                    states
                        .map(|s| (s.count > 0).then_some(s.sum_float))
                        .collect::<Float64Array>(),
                ),
                Some(ArgType::Decimal(scale)) => {
                    let bound = pow10_i128(38);
                    let values = states
                        .map(|s| {
                            if s.count == 0 {
                                Ok(None)
                            } else if s.sum_int.abs() >= bound {
                                Err(QueryError::Eval(format!("{name} has more than 38 digits")))
                            } else {
                                Ok(Some(s.sum_int))
                            }
                        })
                        .collect::<Result<Decimal128Array, _>>()?;
                    Arc::new(
                        values
                            .with_precision_and_scale(38, scale as i8)
                            .map_err(|e| QueryError::Arrow(e.to_string()))?,
                    )
                }
                _ => Arc::new(
                    states
                        .map(|s| {
                            if s.count == 0 {
                                Ok(None)
                            } else {
                                i64::try_from(s.sum_int).map(Some).map_err(|_| {
                                    QueryError::Eval(format!(
                                        "{name} = {} does not fit int64",
                                        s.sum_int
                                    ))
                                })
                            }
                        })
                        .collect::<Result<Int64Array, _>>()?,
                ),
            },
            AggFunc::Min => array_of(&dt, &name, states.map(|s| &s.min))?,
            AggFunc::Max => array_of(&dt, &name, states.map(|s| &s.max))?,
        };
        fields.push(Field::new(&name, dt, true));
        arrays.push(array);
    }
    let schema = Arc::new(arrow_schema::Schema::new(fields));
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(groups.len()));
    RecordBatch::try_new_with_options(schema, arrays, &options)
        .map_err(|e| QueryError::Arrow(e.to_string()))
}

/// Merge tablets' top-k answers (each: the columns of `answer_columns`, in
/// sort order or not): sort all rows by the plan's ORDER BY, keep `limit`,
/// and return one batch of the projected columns only.
pub fn merge_top_k(
    schema: &Schema,
    plan: &QueryPlan,
    batches: Vec<RecordBatch>,
) -> Result<Vec<RecordBatch>, QueryError> {
    let QueryOutput::Rows {
        columns,
        order_by,
        limit,
    } = &plan.output
    else {
        return Err(QueryError::Plan("merge_top_k needs a Rows query".into()));
    };
    for &c in columns.iter().chain(order_by.iter().map(|k| &k.col)) {
        crate::compile::column(schema, c, "top-k")?;
    }
    let (out_columns, keys) = top_k_columns(columns, order_by);
    let expected = projected_schema(schema, &out_columns);
    let key_cols: Vec<usize> = keys.iter().map(|(i, _)| *i).collect();
    // Keys renumbered to index the projected key batch.
    let local_keys: Vec<(usize, insitu_protocol::query::SortKey)> =
        keys.iter().enumerate().map(|(j, (_, k))| (j, *k)).collect();
    let mut entries: Vec<(usize, usize, Vec<Scalar>)> = Vec::new();
    for (b, batch) in batches.iter().enumerate() {
        let types: Vec<&DataType> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.data_type())
            .collect();
        let want: Vec<&DataType> = expected.fields().iter().map(|f| f.data_type()).collect();
        if types != want {
            return Err(bad_answer(format!(
                "a top-k batch of types {types:?}, expected {want:?}"
            )));
        }
        let key_batch = batch
            .project(&key_cols)
            .map_err(|e| QueryError::Arrow(e.to_string()))?;
        for i in 0..batch.num_rows() {
            entries.push((b, i, batch_row(&key_batch, i)?));
        }
    }
    entries.sort_by(|a, b| cmp_rows(&local_keys, &a.2, &b.2));
    entries.truncate(limit.map_or(usize::MAX, |l| l as usize));
    let picks: Vec<(usize, usize)> = entries.iter().map(|(b, i, _)| (*b, *i)).collect();
    let out_schema = projected_schema(schema, columns);
    let arrays = (0..columns.len())
        .map(|j| {
            let sources: Vec<&dyn arrow_array::Array> =
                batches.iter().map(|b| b.column(j).as_ref()).collect();
            if sources.is_empty() {
                return Ok(arrow_array::new_empty_array(
                    out_schema.field(j).data_type(),
                ));
            }
            arrow_select::interleave::interleave(&sources, &picks)
                .map_err(|e| QueryError::Arrow(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(picks.len()));
    let batch = RecordBatch::try_new_with_options(out_schema, arrays, &options)
        .map_err(|e| QueryError::Arrow(e.to_string()))?;
    Ok(vec![batch])
}
