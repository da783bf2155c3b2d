//! A `TableSource` over rows held in memory, with a small evaluator of
//! `QueryPlan`s written to be obviously right (not fast; filters and row
//! order by the query crate's reference): the reference the SQL front end's
//! pushdown is checked against. It splits the rows into two
//! "tablets" (even and odd row numbers) so per-tablet limits and merged
//! partials are exercised.

#![allow(dead_code)]

pub mod fixture;

use std::cmp::Ordering;
use std::sync::{Arc, Mutex};

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use insitu_protocol::query::{
    AggFunc, AggState, GroupPartial, Pred, QueryOutput, QueryPlan, Scalar, ValueOp,
};
use insitu_protocol::schema::{ColumnType, Schema};
use insitu_query::reference::{sort_rows, truth};
use insitu_sql::{TableSource, arrow_schema};

/// Rows per batch the fake servers send (small: many batches).
const BATCH_ROWS: usize = 4;

#[derive(Debug)]
pub struct MemSource {
    pub name: String,
    pub schema: Schema,
    /// The rows, changed by `update` (through the servers' own `RowUpdate`).
    pub rows: Mutex<Vec<Vec<Scalar>>>,
    /// Every plan received, to check what was pushed.
    pub plans: Mutex<Vec<QueryPlan>>,
}

impl MemSource {
    pub fn new(name: &str, schema: Schema, rows: Vec<Vec<Scalar>>) -> Arc<Self> {
        schema.check().unwrap();
        Arc::new(Self {
            name: name.into(),
            schema,
            rows: Mutex::new(rows),
            plans: Mutex::new(vec![]),
        })
    }

    /// The rows of each fake tablet.
    fn tablets(rows: &[Vec<Scalar>]) -> [Vec<&Vec<Scalar>>; 2] {
        let mut t = [vec![], vec![]];
        for (i, r) in rows.iter().enumerate() {
            t[i % 2].push(r);
        }
        t
    }

    /// All rows as one batch (for the reference MemTable).
    pub fn batch(&self) -> RecordBatch {
        let all: Vec<usize> = (0..self.schema.columns.len()).collect();
        let all_rows = self.rows.lock().unwrap();
        let rows: Vec<&Vec<Scalar>> = all_rows.iter().collect();
        to_batch(&self.schema, &all, &rows)
    }
}

impl TableSource for MemSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn schema(&self) -> &Schema {
        &self.schema
    }

    fn rows(&self, plan: QueryPlan) -> BoxStream<'static, Result<RecordBatch, String>> {
        self.plans.lock().unwrap().push(plan.clone());
        let QueryOutput::Rows {
            columns,
            order_by,
            limit,
        } = &plan.output
        else {
            panic!("rows() with a non-Rows plan");
        };
        let cols: Vec<usize> = columns.iter().map(|&c| c as usize).collect();
        let all_rows = self.rows.lock().unwrap().clone();
        let mut answers: Vec<Vec<&Vec<Scalar>>> = vec![];
        for tablet in Self::tablets(&all_rows) {
            let mut kept: Vec<&Vec<Scalar>> = tablet
                .into_iter()
                .filter(|r| truth(&plan.filter, r) == Some(true))
                .collect();
            // A top-k: each tablet sorts and keeps its first `limit` rows.
            if !order_by.is_empty() {
                assert!(limit.is_some(), "a top-k without a limit");
                kept.sort_by(|a, b| sort_rows(order_by, a, b));
            }
            if let Some(l) = limit {
                kept.truncate(*l as usize);
            }
            answers.push(kept);
        }
        if !order_by.is_empty() {
            // The client's merge of the tablets' lists, cut to the limit.
            let mut merged: Vec<&Vec<Scalar>> = answers.concat();
            merged.sort_by(|a, b| sort_rows(order_by, a, b));
            merged.truncate(limit.unwrap_or(0) as usize);
            answers = vec![merged];
        }
        let mut batches = vec![];
        for kept in answers {
            for chunk in kept.chunks(BATCH_ROWS) {
                batches.push(Ok(to_batch(&self.schema, &cols, chunk)));
            }
        }
        Box::pin(futures::stream::iter(batches))
    }

    fn aggregate(&self, plan: QueryPlan) -> BoxFuture<'static, Result<Vec<GroupPartial>, String>> {
        self.plans.lock().unwrap().push(plan.clone());
        let QueryOutput::Aggregate { group_by, aggs } = &plan.output else {
            panic!("aggregate() with a non-Aggregate plan");
        };
        let mut groups: Vec<GroupPartial> = vec![];
        let all_rows = self.rows.lock().unwrap().clone();
        for r in &all_rows {
            if truth(&plan.filter, r) != Some(true) {
                continue;
            }
            let key: Vec<Scalar> = group_by.iter().map(|&c| r[c as usize].clone()).collect();
            let gi = match groups.iter().position(|g| g.key == key) {
                Some(i) => i,
                None => {
                    groups.push(GroupPartial {
                        key,
                        states: aggs.iter().map(|_| AggState::empty()).collect(),
                    });
                    groups.len() - 1
                }
            };
            for (a, st) in aggs.iter().zip(groups[gi].states.iter_mut()) {
                if a.func == AggFunc::CountStar {
                    st.count += 1;
                    continue;
                }
                let v = eval_value(&a.arg, r);
                if v == Scalar::Null {
                    continue;
                }
                st.count += 1;
                match &v {
                    Scalar::Int(i) => st.sum_int += *i as i128,
                    Scalar::Decimal { value, .. } => st.sum_int += *value as i128,
                    Scalar::Float(f) => st.sum_float += f,
                    _ => {}
                }
                if st.min == Scalar::Null || cmp(&v, &st.min) == Some(Ordering::Less) {
                    st.min = v.clone();
                }
                if st.max == Scalar::Null || cmp(&v, &st.max) == Some(Ordering::Greater) {
                    st.max = v.clone();
                }
            }
        }
        Box::pin(futures::future::ready(Ok(groups)))
    }

    /// The update as a shard runs it: each row encoded, changed by the
    /// servers' `RowUpdate`, decoded again; all rows or none.
    fn update(
        &self,
        filter: Vec<Pred>,
        set: Vec<(u16, insitu_protocol::plan::RowAction)>,
    ) -> BoxFuture<'static, Result<u64, String>> {
        let run = || -> Result<u64, String> {
            let u = insitu_query::RowUpdate::compile(&self.schema, &filter, &set)
                .map_err(|e| e.to_string())?;
            let layout = insitu_rows::RowLayout::new(&self.schema);
            let mut rows = self.rows.lock().unwrap();
            let mut new_rows = rows.clone();
            let mut n = 0;
            for r in new_rows.iter_mut() {
                let bytes = insitu_rows::encode_row(&self.schema, &layout, r).unwrap();
                if let Some(new) = u.apply(&bytes)? {
                    let row = insitu_rows::RowRef::new(&layout, &new).unwrap();
                    for (c, v) in r.iter_mut().enumerate() {
                        *v = row.scalar(c).unwrap();
                    }
                    n += 1;
                }
            }
            *rows = new_rows;
            Ok(n)
        };
        Box::pin(futures::future::ready(run()))
    }

    /// The removal as a shard decides it: each row encoded and passed
    /// through the servers' compiled filter.
    fn delete(&self, filter: Vec<Pred>) -> BoxFuture<'static, Result<u64, String>> {
        let run = || -> Result<u64, String> {
            let compiled =
                insitu_query::compile_filter(&self.schema, &filter).map_err(|e| e.to_string())?;
            let layout = insitu_rows::RowLayout::new(&self.schema);
            let mut rows = self.rows.lock().unwrap();
            let before = rows.len();
            rows.retain(|r| {
                let bytes = insitu_rows::encode_row(&self.schema, &layout, r).unwrap();
                let row = insitu_rows::RowRef::new(&layout, &bytes).unwrap();
                !compiled.filter(&row)
            });
            Ok((before - rows.len()) as u64)
        };
        Box::pin(futures::future::ready(run()))
    }
}

/// Compare two non-NULL values of compatible types; None if either is NULL.
pub fn cmp(a: &Scalar, b: &Scalar) -> Option<Ordering> {
    use Scalar::*;
    match (a, b) {
        (Null, _) | (_, Null) => None,
        (Int(x), Int(y)) => Some(x.cmp(y)),
        (Float(x), Float(y)) => x.partial_cmp(y),
        (Decimal { value: x, scale: s }, Decimal { value: y, scale: t }) => {
            let (x, y) = align(*x as i128, *s, *y as i128, *t);
            Some(x.cmp(&y))
        }
        (Date(x), Date(y)) => Some(x.cmp(y)),
        (Str(x), Str(y)) => Some(x.cmp(y)),
        (Bool(x), Bool(y)) => Some(x.cmp(y)),
        _ => panic!("comparison of mismatched types {a:?} and {b:?}"),
    }
}

fn align(x: i128, s: u8, y: i128, t: u8) -> (i128, i128) {
    let m = s.max(t);
    (
        x * 10i128.pow((m - s) as u32),
        y * 10i128.pow((m - t) as u32),
    )
}

/// An aggregate argument's value for one row: Int, Decimal (exact, at the
/// tracked scale), Float, Null, or the column's own value.
pub fn eval_value(prog: &[ValueOp], row: &[Scalar]) -> Scalar {
    let mut st: Vec<Scalar> = vec![];
    for op in prog {
        match op {
            ValueOp::Col(c) => st.push(row[*c as usize].clone()),
            ValueOp::Lit(v) => st.push(v.clone()),
            ValueOp::Neg => {
                let v = st.pop().unwrap();
                st.push(match v {
                    Scalar::Int(i) => Scalar::Int(-i),
                    Scalar::Decimal { value, scale } => Scalar::Decimal {
                        value: -value,
                        scale,
                    },
                    Scalar::Float(f) => Scalar::Float(-f),
                    other => other,
                });
            }
            ValueOp::Add | ValueOp::Sub | ValueOp::Mul => {
                let b = st.pop().unwrap();
                let a = st.pop().unwrap();
                st.push(arith(op, a, b));
            }
        }
    }
    st.pop().unwrap()
}

fn exact(v: &Scalar) -> Option<(i128, u8)> {
    match v {
        Scalar::Int(i) => Some((*i as i128, 0)),
        Scalar::Decimal { value, scale } => Some((*value as i128, *scale)),
        _ => None,
    }
}

fn float(v: &Scalar) -> f64 {
    match v {
        Scalar::Float(f) => *f,
        Scalar::Int(i) => *i as f64,
        Scalar::Decimal { value, scale } => *value as f64 / 10f64.powi(*scale as i32),
        _ => panic!("not a number: {v:?}"),
    }
}

fn arith(op: &ValueOp, a: Scalar, b: Scalar) -> Scalar {
    if a == Scalar::Null || b == Scalar::Null {
        return Scalar::Null;
    }
    match (exact(&a), exact(&b)) {
        (Some((x, s)), Some((y, t))) => {
            let (v, scale) = match op {
                ValueOp::Mul => (x * y, s + t),
                _ => {
                    let (x, y) = align(x, s, y, t);
                    (if *op == ValueOp::Add { x + y } else { x - y }, s.max(t))
                }
            };
            let both_int = matches!(a, Scalar::Int(_)) && matches!(b, Scalar::Int(_));
            if both_int {
                Scalar::Int(v as i64)
            } else {
                Scalar::Decimal {
                    value: v as i64,
                    scale,
                }
            }
        }
        _ => {
            let (x, y) = (float(&a), float(&b));
            Scalar::Float(match op {
                ValueOp::Add => x + y,
                ValueOp::Sub => x - y,
                _ => x * y,
            })
        }
    }
}

/// Arrow arrays of `cols` of `rows`, typed by the schema.
pub fn to_batch(schema: &Schema, cols: &[usize], rows: &[&Vec<Scalar>]) -> RecordBatch {
    let full = arrow_schema(schema);
    let projected = Arc::new(full.project(cols).unwrap());
    let arrays: Vec<ArrayRef> = cols
        .iter()
        .map(|&c| column(schema.columns[c].ty, rows.iter().map(|r| &r[c])))
        .collect();
    RecordBatch::try_new(projected, arrays).unwrap()
}

fn column<'a>(ty: ColumnType, vals: impl Iterator<Item = &'a Scalar>) -> ArrayRef {
    macro_rules! build {
        ($b:expr, $pat:pat => $v:expr) => {{
            let mut b = $b;
            for v in vals {
                match v {
                    Scalar::Null => b.append_null(),
                    $pat => b.append_value($v),
                    other => panic!("{other:?} in a {ty} column"),
                }
            }
            Arc::new(b.finish()) as ArrayRef
        }};
    }
    match ty {
        ColumnType::Int32 => build!(Int32Builder::new(), Scalar::Int(i) => *i as i32),
        ColumnType::Int64 => build!(Int64Builder::new(), Scalar::Int(i) => *i),
        ColumnType::Float64 => build!(Float64Builder::new(), Scalar::Float(f) => *f),
        ColumnType::Decimal { precision, scale } => {
            let mut b = Decimal128Builder::new();
            for v in vals {
                match v {
                    Scalar::Null => b.append_null(),
                    Scalar::Decimal { value, scale: s } => {
                        assert_eq!(*s, scale);
                        b.append_value(*value as i128)
                    }
                    other => panic!("{other:?} in a decimal column"),
                }
            }
            Arc::new(
                b.finish()
                    .with_precision_and_scale(precision, scale as i8)
                    .unwrap(),
            )
        }
        ColumnType::Date32 => build!(Date32Builder::new(), Scalar::Date(d) => *d),
        ColumnType::Utf8 => build!(StringBuilder::new(), Scalar::Str(s) => s),
        ColumnType::Bool => build!(BooleanBuilder::new(), Scalar::Bool(x) => *x),
    }
}
