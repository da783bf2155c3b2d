//! One tablet's grouped aggregates: a hash map from the group key (the
//! group columns' raw bytes) to per-aggregate states, turned into
//! `GroupPartial`s at the end.

use std::cmp::Ordering;
use std::sync::Arc;

use hashbrown::HashMap;
use insitu_protocol::query::{AggFunc, AggState, GroupPartial, MAX_GROUPS, Scalar};
use insitu_protocol::schema::ColumnType;
use insitu_rows::{RowRef, Slot};

use crate::QueryError;
use crate::agg_fast::FastAggs;
use crate::arith::{ArgType, Val};
use crate::compile::Output;
use crate::value::float_cmp;

/// A min or max while it is being computed (owned: it outlives the row).
#[derive(Clone, Debug, PartialEq)]
enum Extreme {
    None,
    Exact(i128),
    Float(f64),
    Bytes(Vec<u8>),
}

#[derive(Clone, Debug)]
pub(crate) struct State {
    /// Rows (count(*)) or non-NULL arguments.
    pub count: u64,
    /// Exact sum at the argument's scale (checked adds).
    pub sum_int: i128,
    /// Sum of float arguments.
    sum_float: f64,
    /// Tracked only by min / max (None until a value is seen).
    min: Extreme,
    max: Extreme,
}

const EMPTY: State = State {
    count: 0,
    sum_int: 0,
    sum_float: 0.0,
    min: Extreme::None,
    max: Extreme::None,
};

/// `v` against a stored extreme: Less when v is smaller.
fn cmp_extreme(v: &Val<'_>, e: &Extreme) -> Ordering {
    match (v, e) {
        (Val::Exact(a), Extreme::Exact(b)) => a.cmp(b),
        (Val::Float(a), Extreme::Float(b)) => float_cmp(*a, *b),
        (Val::Bytes(a), Extreme::Bytes(b)) => (*a).cmp(b.as_slice()),
        _ => unreachable!("an aggregate's argument has one type"),
    }
}

fn own(v: &Val<'_>) -> Extreme {
    match v {
        Val::Exact(x) => Extreme::Exact(*x),
        Val::Float(f) => Extreme::Float(*f),
        Val::Bytes(b) => Extreme::Bytes(b.to_vec()),
        Val::Null => Extreme::None,
    }
}

/// A per-tablet sum beyond i128 (the general and the fast path).
pub(crate) fn sum_overflow() -> QueryError {
    QueryError::Eval("a sum overflowed 128 bits".into())
}

fn update(state: &mut State, func: AggFunc, v: Val<'_>) -> Result<(), QueryError> {
    if func == AggFunc::CountStar {
        state.count += 1;
        return Ok(());
    }
    if v == Val::Null {
        return Ok(());
    }
    state.count += 1;
    match func {
        AggFunc::Sum | AggFunc::Avg => match v {
            Val::Exact(x) => {
                state.sum_int = state.sum_int.checked_add(x).ok_or_else(sum_overflow)?
            }
            Val::Float(f) => state.sum_float += f,
            _ => unreachable!("compile: sum and avg take numbers"),
        },
        AggFunc::Min => {
            if state.min == Extreme::None || cmp_extreme(&v, &state.min) == Ordering::Less {
                state.min = own(&v);
            }
        }
        AggFunc::Max => {
            if state.max == Extreme::None || cmp_extreme(&v, &state.max) == Ordering::Greater {
                state.max = own(&v);
            }
        }
        AggFunc::Count | AggFunc::CountStar => {}
    }
    Ok(())
}

/// A finished extreme as a `Scalar` of the argument's type.
fn extreme_scalar(e: Extreme, ty: Option<ArgType>) -> Result<Scalar, QueryError> {
    let too_big = || QueryError::Eval("a min/max does not fit 64 bits".into());
    Ok(match (e, ty) {
        (Extreme::None, _) => Scalar::Null,
        (Extreme::Exact(x), Some(ArgType::Int)) => {
            Scalar::Int(i64::try_from(x).map_err(|_| too_big())?)
        }
        (Extreme::Exact(x), Some(ArgType::Decimal(s))) => Scalar::Decimal {
            value: i64::try_from(x).map_err(|_| too_big())?,
            scale: u8::try_from(s).map_err(|_| too_big())?,
        },
        (Extreme::Exact(x), Some(ArgType::Date)) => {
            Scalar::Date(i32::try_from(x).map_err(|_| too_big())?)
        }
        (Extreme::Exact(x), Some(ArgType::Bool)) => Scalar::Bool(x != 0),
        (Extreme::Float(f), _) => Scalar::Float(f),
        (Extreme::Bytes(b), _) => Scalar::Str(String::from_utf8(b).map_err(|_| {
            QueryError::Row(insitu_rows::RowError::Malformed(
                "a text value is not valid UTF-8".into(),
            ))
        })?),
        (e, t) => unreachable!("extreme {e:?} of type {t:?}"),
    })
}

/// The group key of `row` into `buf`: per column a presence byte, then the
/// value's bytes (floats normalised so -0.0 groups with 0.0 and NaNs
/// together; text length-prefixed so keys cannot run into each other).
fn group_key(row: &RowRef<'_>, group_by: &[usize], buf: &mut Vec<u8>) {
    buf.clear();
    for &c in group_by {
        if row.is_null(c) {
            buf.push(0);
            continue;
        }
        buf.push(1);
        match row.layout().slots[c] {
            Slot::Var { .. } => {
                let b = row.var(c);
                buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
                buf.extend_from_slice(b);
            }
            Slot::Fixed { offset, width } => match row.layout().types[c] {
                ColumnType::Float64 => {
                    let f = row.f64(c);
                    let f = if f.is_nan() { f64::NAN } else { f + 0.0 };
                    buf.extend_from_slice(&f.to_bits().to_le_bytes());
                }
                ColumnType::Bool => buf.push(u8::from(row.bool(c))),
                // RowRef::new checked the fixed region is inside the row.
                _ => buf.extend_from_slice(&row.bytes()[offset..offset + width]),
            },
        }
    }
}

/// Grouped aggregation of one tablet's rows.
pub(crate) struct GroupSink {
    /// The compiled plan's group columns and aggregates.
    out: Arc<Output>,
    /// Group key bytes -> index into `keys`.
    map: HashMap<Box<[u8]>, usize>,
    /// Each group's key values, in order of first appearance.
    keys: Vec<Vec<Scalar>>,
    /// `keys.len() * aggs` states, group-major.
    states: Vec<State>,
    /// Scratch: the key being looked up (no allocation per row).
    key_buf: Vec<u8>,
    /// Scratch for argument programs (numbers only: no borrow of a row).
    stack: Vec<Val<'static>>,
    /// The aggregates' fast form, when they all have one (`agg_fast.rs`).
    fast: Option<Arc<FastAggs>>,
}

impl GroupSink {
    pub fn new(out: Arc<Output>, fast: Option<Arc<FastAggs>>) -> GroupSink {
        GroupSink {
            fast,
            out,
            map: HashMap::new(),
            keys: Vec::new(),
            states: Vec::new(),
            key_buf: Vec::new(),
            stack: Vec::new(),
        }
    }

    /// Groups so far.
    pub fn groups(&self) -> usize {
        self.keys.len()
    }

    pub fn reset(&mut self) {
        self.map.clear();
        self.keys.clear();
        self.states.clear();
    }

    pub fn push(&mut self, row: &RowRef<'_>) -> Result<(), QueryError> {
        // Borrowed field by field (not through a clone of the `Arc`: that
        // was an atomic increment and decrement per row).
        let GroupSink {
            out,
            map,
            keys,
            states,
            key_buf,
            stack,
            fast,
        } = self;
        let Output::Groups { group_by, aggs } = &**out else {
            unreachable!("a group sink is made for an aggregate plan")
        };
        let g = if group_by.is_empty() {
            // One group: no key to build or look up.
            if keys.is_empty() {
                keys.push(Vec::new());
                states.extend(std::iter::repeat_n(EMPTY, aggs.len()));
            }
            0
        } else {
            group_key(row, group_by, key_buf);
            match map.get(key_buf.as_slice()) {
                Some(&g) => g,
                None => {
                    if keys.len() >= MAX_GROUPS {
                        return Err(QueryError::Eval(format!(
                            "too many groups (more than {MAX_GROUPS}) for the servers; \
                             group in the client instead (fetch the rows)"
                        )));
                    }
                    let key = group_by
                        .iter()
                        .map(|&c| row.scalar(c))
                        .collect::<Result<Vec<_>, _>>()?;
                    let g = keys.len();
                    keys.push(key);
                    states.extend(std::iter::repeat_n(EMPTY, aggs.len()));
                    map.insert(key_buf.as_slice().into(), g);
                    g
                }
            }
        };
        let base = g * aggs.len();
        let group = &mut states[base..base + aggs.len()];
        if let Some(fast) = fast
            && fast.apply(row, group)?
        {
            return Ok(());
        }
        for (a, agg) in aggs.iter().enumerate() {
            let v = agg.arg.eval(row, stack)?;
            update(&mut states[base + a], agg.func, v)?;
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<Vec<GroupPartial>, QueryError> {
        let out = self.out.clone();
        let Output::Groups { group_by, aggs } = &*out else {
            unreachable!("a group sink is made for an aggregate plan")
        };
        let n = aggs.len();
        let types: Vec<Option<ArgType>> = aggs.iter().map(|a| a.ty).collect();
        // A query without GROUP BY has one group even over no rows (SQL:
        // `count(*)` of nothing is one row holding 0).
        if group_by.is_empty() && self.keys.is_empty() {
            self.keys.push(Vec::new());
            self.states.extend(std::iter::repeat_n(EMPTY, n));
        }
        let mut states = self.states.into_iter();
        self.keys
            .into_iter()
            .map(|key| {
                let states = (0..n)
                    .map(|a| {
                        let s = states.next().expect("n states per group");
                        Ok(AggState {
                            count: s.count,
                            sum_int: s.sum_int,
                            sum_float: s.sum_float,
                            min: extreme_scalar(s.min, types[a])?,
                            max: extreme_scalar(s.max, types[a])?,
                        })
                    })
                    .collect::<Result<Vec<_>, QueryError>>()?;
                Ok(GroupPartial { key, states })
            })
            .collect()
    }
}
