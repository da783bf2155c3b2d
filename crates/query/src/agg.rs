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
use crate::agg_fast::{Batch, FastAggs};
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

/// Bytes of a packed group key (`small_key`).
const SMALL_KEY_BYTES: usize = 16;
/// Groups with packed keys looked up by a linear scan before the map.
/// Why: TPC-H Q1 has 4 groups; comparing a few u128s beats hashing.
const SMALL_SCAN: usize = 8;

/// The group key of `row` packed into 16 bytes, when it fits: per column a
/// presence byte, then the value's bytes (text: a length byte first;
/// floats normalised as in `group_key`), zero-padded. None when it does not
/// fit (then `group_key` builds the byte key). Why: building a byte key and
/// hashing it was a third of TPC-H Q1's time for 4 groups of two 1-byte
/// columns. The encoding is self-delimiting (every column's length is known
/// from its type or its length byte), so two keys equal after padding are
/// the same key; a given key either always fits or never does, so a group
/// is never split between the two maps.
#[inline]
fn small_key(row: &RowRef<'_>, group_by: &[usize]) -> Option<u128> {
    let mut key = Packed::default();
    for &c in group_by {
        if row.is_null(c) {
            key.put(0, 1)?;
            continue;
        }
        match row.layout().slots[c] {
            Slot::Var { .. } => {
                let b = row.var(c);
                key.put(1 | (u64::from(u8::try_from(b.len()).ok()?) << 8), 2)?;
                for &x in b {
                    key.put(u64::from(x), 1)?;
                }
            }
            Slot::Fixed { width, .. } => {
                key.put(1, 1)?;
                let v = match row.layout().types[c] {
                    ColumnType::Float64 => {
                        let f = row.f64(c);
                        let f = if f.is_nan() { f64::NAN } else { f + 0.0 };
                        f.to_bits()
                    }
                    ColumnType::Bool => u64::from(row.bool(c)),
                    ColumnType::Int32 | ColumnType::Date32 => u64::from(row.i32(c) as u32),
                    _ => row.i64(c) as u64,
                };
                debug_assert!(width <= 8 && (width == 8 || v >> (8 * width) == 0));
                key.put(v, width)?;
            }
        }
    }
    Some(key.bits)
}

/// A key being packed little-endian into a u128 with shifts. Why not bytes
/// in an array read back as a u128: that read could not be forwarded from
/// the byte stores and stalled (an eighth of Q1's time).
#[derive(Default)]
struct Packed {
    bits: u128,
    /// Bytes used.
    len: usize,
}

impl Packed {
    /// Append the low `bytes` bytes of `v` (the rest of `v` is zero); None
    /// when the key would pass `SMALL_KEY_BYTES`.
    #[inline]
    fn put(&mut self, v: u64, bytes: usize) -> Option<()> {
        if self.len + bytes > SMALL_KEY_BYTES {
            return None;
        }
        if bytes > 0 {
            self.bits |= u128::from(v) << (8 * self.len);
        }
        self.len += bytes;
        Some(())
    }
}

/// Grouped aggregation of one tablet's rows.
pub(crate) struct GroupSink {
    /// The compiled plan's group columns and aggregates.
    out: Arc<Output>,
    /// Group key bytes -> index into `keys`, for keys `small_key` cannot pack.
    map: HashMap<Box<[u8]>, usize>,
    /// The first `SMALL_SCAN` packed keys and their groups, scanned in order.
    small: Vec<(u128, usize)>,
    /// Packed keys past the first `SMALL_SCAN`.
    small_map: HashMap<u128, usize>,
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
    /// The fast form's rows not yet aggregated (`states` lacks them until
    /// `flush_batch`).
    batch: Batch,
}

/// A new group for `row`'s key: its key values and empty states; refused
/// past `MAX_GROUPS`.
#[cold]
fn new_group(
    row: &RowRef<'_>,
    group_by: &[usize],
    aggs: usize,
    keys: &mut Vec<Vec<Scalar>>,
    states: &mut Vec<State>,
) -> Result<usize, QueryError> {
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
    keys.push(key);
    states.extend(std::iter::repeat_n(EMPTY, aggs));
    Ok(keys.len() - 1)
}

impl GroupSink {
    pub fn new(out: Arc<Output>, fast: Option<Arc<FastAggs>>) -> GroupSink {
        GroupSink {
            fast,
            batch: Batch::default(),
            out,
            map: HashMap::new(),
            small: Vec::new(),
            small_map: HashMap::new(),
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
        self.batch.clear();
        self.map.clear();
        self.small.clear();
        self.small_map.clear();
        self.keys.clear();
        self.states.clear();
    }

    pub fn push(&mut self, row: &RowRef<'_>) -> Result<(), QueryError> {
        // Borrowed field by field (not through a clone of the `Arc`: that
        // was an atomic increment and decrement per row).
        let GroupSink {
            out,
            map,
            small,
            small_map,
            keys,
            states,
            key_buf,
            stack,
            fast,
            batch,
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
        } else if let Some(k) = small_key(row, group_by) {
            let found = match small.iter().find(|(s, _)| *s == k) {
                Some(&(_, g)) => Some(g),
                None => small_map.get(&k).copied(),
            };
            match found {
                Some(g) => g,
                None => {
                    let g = new_group(row, group_by, aggs.len(), keys, states)?;
                    if small.len() < SMALL_SCAN {
                        small.push((k, g));
                    } else {
                        small_map.insert(k, g);
                    }
                    g
                }
            }
        } else {
            group_key(row, group_by, key_buf);
            match map.get(key_buf.as_slice()) {
                Some(&g) => g,
                None => {
                    let g = new_group(row, group_by, aggs.len(), keys, states)?;
                    map.insert(key_buf.as_slice().into(), g);
                    g
                }
            }
        };
        if let Some(fast) = fast
            && fast.present(row)
        {
            if fast.add(batch, row, g) {
                fast.flush(batch, states, aggs.len())?;
            }
            return Ok(());
        }
        let base = g * aggs.len();
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
        if let Some(fast) = &self.fast
            && n > 0
        {
            fast.flush(&mut self.batch, &mut self.states, n)?;
            for group in self.states.chunks_exact_mut(n) {
                fast.fill_same(group);
            }
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
