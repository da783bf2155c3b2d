//! `compile`: a plan checked against a table's schema, everything a hostile
//! client could send refused with a message naming the column, and turned
//! into the forms evaluated per row (`filter.rs`, `arith.rs`, `sink.rs`).

use std::sync::Arc;

use hashbrown::HashSet;
use insitu_protocol::plan::{CmpOp, MAX_PRED_OPS};
use insitu_protocol::query::{
    AggFunc, AggSpec, MAX_AGGS, MAX_IN_LIST, MAX_TOP_K, Pred, QueryOutput, QueryPlan, Scalar,
    SortKey,
};
use insitu_protocol::schema::{Column, ColumnType, Schema};
use insitu_rows::{RowError, RowLayout, RowRef};

use crate::QueryError;
use crate::agg_fast::FastAggs;
use crate::arith::{Arg, ArgType, compile_arg};
use crate::filter::{
    ExactCol, ExactRead, FALSE, Filter, FloatCol, InList, Op, Operand, STACK_CAP, UNKNOWN,
    fixed_offset,
};
use crate::like;
use crate::value::{Kind, describe, pow10_i128};

/// Largest scale of a decimal literal in a filter (a column's is at most 18).
const MAX_LITERAL_SCALE: u8 = 18;

/// A plan checked against a schema, regexes compiled once. Shared by every
/// page of a query; `Sync`, so one plan may serve several threads.
pub struct Compiled {
    /// The table's row layout: where each column's bytes are.
    layout: RowLayout,
    filter: Filter,
    /// What sinks need (shared: a sink outlives no borrow of `Compiled`).
    pub(crate) out: Arc<Output>,
    /// An aggregate plan's fast form, when every aggregate has one.
    pub(crate) fast: Option<Arc<FastAggs>>,
}

/// One aggregate, checked.
#[derive(Debug)]
pub(crate) struct CompiledAgg {
    /// Which aggregate (decides what the state tracks).
    pub func: AggFunc,
    /// The argument, compiled to reads and exact arithmetic.
    pub arg: Arg,
    /// None for `count(*)`.
    pub ty: Option<ArgType>,
}

/// The compiled output of a plan.
#[derive(Debug)]
pub(crate) enum Output {
    Rows {
        /// For the Arrow builder of each page.
        schema: Arc<Schema>,
        /// The projection, in output order.
        columns: Vec<u16>,
        /// Rows per tablet (pages count the rows sent before them).
        limit: Option<u64>,
    },
    TopK {
        /// For the Arrow schema of the answer.
        schema: Arc<Schema>,
        /// The projection followed by the sort columns not in it: the columns
        /// a tablet returns, so the client can merge tablets' answers.
        out_columns: Vec<u16>,
        /// Per sort key: its index in `out_columns`, and the key.
        keys: Vec<(usize, SortKey)>,
        /// Rows kept (checked <= MAX_TOP_K).
        limit: usize,
    },
    Groups {
        /// Columns of the group key, checked.
        group_by: Vec<usize>,
        /// One per aggregate of the plan, in order.
        aggs: Vec<CompiledAgg>,
    },
}

impl Compiled {
    pub fn layout(&self) -> &RowLayout {
        &self.layout
    }

    /// True only when the filter is TRUE for the row (false and unknown
    /// reject it).
    #[inline]
    pub fn filter(&self, row: &RowRef<'_>) -> bool {
        self.filter.matches(row)
    }

    /// `value` as a row when the filter keeps it (None when it rejects
    /// it), checked as far as needed: when the filter reads fixed-width
    /// columns only, a rejected row's offset table is never read, and a
    /// kept row is checked whole before a sink reads its text. Why: the
    /// offset table check was a fifth of a selective scan's time (TPC-H
    /// Q6), spent on rows the filter then rejected.
    #[inline]
    pub fn keep<'a>(&'a self, value: &'a [u8]) -> Result<Option<RowRef<'a>>, RowError> {
        if self.rejects(value) {
            return Ok(None);
        }
        self.keep_unrejected(value)
    }

    /// A cheap first look before `keep`, for the log walk's every row:
    /// true only when `keep(value)` would be `Ok(None)` (the filter
    /// rejects a row that passes the tag and length checks on one of its
    /// range checks). False says nothing: the caller runs `keep_unrejected`,
    /// which also reports a malformed row. A filter that reads text never
    /// rejects here, so `keep` still checks each of its rows whole first.
    /// Why: on a selective scan (TPC-H Q6 keeps 2 % of the rows) the
    /// rejected rows are the scan; with this small test inlined into the
    /// walk, they cost no call and no stack frame.
    #[inline(always)]
    pub fn rejects(&self, value: &[u8]) -> bool {
        if self.filter.reads_var {
            return false;
        }
        match RowRef::new_fixed(&self.layout, value) {
            Ok(row) => self.filter.ranges_reject(&row),
            Err(_) => false,
        }
    }

    /// `keep(value)` for a value `rejects` said false of: the range
    /// checks, which passed there, are not run again. Why: on a scan that
    /// keeps most rows (TPC-H Q1, 98 %) every row would pay them twice.
    #[inline(always)]
    pub fn keep_unrejected<'a>(&'a self, value: &'a [u8]) -> Result<Option<RowRef<'a>>, RowError> {
        debug_assert!(!self.rejects(value), "keep_unrejected of a rejected row");
        if self.filter.reads_var {
            let row = RowRef::new(&self.layout, value)?;
            return Ok(self.filter.matches(&row).then_some(row));
        }
        let row = RowRef::new_fixed(&self.layout, value)?;
        if !self.filter.rest_holds(&row) {
            return Ok(None);
        }
        row.check_vars()?;
        Ok(Some(row))
    }

    /// The filter's three-valued answer (0 false, 1 true, 2 unknown).
    pub fn truth(&self, row: &RowRef<'_>) -> u8 {
        self.filter.truth(row)
    }
}

fn refuse(m: String) -> QueryError {
    QueryError::Plan(m)
}

/// Column `c` of the schema, or an error saying where it was named.
pub(crate) fn column<'s>(schema: &'s Schema, c: u16, what: &str) -> Result<&'s Column, QueryError> {
    schema.columns.get(c as usize).ok_or_else(|| {
        refuse(format!(
            "{what}: column {c} does not exist (the table has {} columns)",
            schema.columns.len()
        ))
    })
}

fn exact_read(ty: ColumnType) -> Option<ExactRead> {
    match ty {
        ColumnType::Int32 | ColumnType::Date32 => Some(ExactRead::I32),
        ColumnType::Int64 | ColumnType::Decimal { .. } => Some(ExactRead::I64),
        ColumnType::Bool => Some(ExactRead::Bool),
        ColumnType::Float64 | ColumnType::Utf8 => None,
    }
}

fn col_scale(ty: ColumnType) -> u32 {
    match ty {
        ColumnType::Decimal { scale, .. } => u32::from(scale),
        _ => 0,
    }
}

fn float_col(layout: &RowLayout, col: usize, ty: ColumnType) -> FloatCol {
    FloatCol {
        col,
        offset: fixed_offset(layout, col),
        exact: exact_read(ty).map(|r| (r, col_scale(ty))),
    }
}

/// An exact literal as (unscaled value, scale): ints, decimals, dates, bools.
fn exact_lit(v: &Scalar) -> Option<(i128, u32)> {
    match *v {
        Scalar::Int(i) => Some((i128::from(i), 0)),
        Scalar::Decimal { value, scale } => Some((i128::from(value), u32::from(scale))),
        Scalar::Date(d) => Some((i128::from(d), 0)),
        Scalar::Bool(b) => Some((i128::from(b), 0)),
        _ => None,
    }
}

fn lit_to_f64(v: &Scalar) -> f64 {
    match v {
        Scalar::Float(f) => *f,
        other => exact_lit(other)
            .map(|(x, s)| crate::value::exact_to_f64(x, s))
            .unwrap_or(f64::NAN),
    }
}

/// Check that literal `v` may be compared with column `col`.
fn check_literal(col: &Column, v: &Scalar, what: &str) -> Result<(), QueryError> {
    let Some(kind) = Kind::of_scalar(v) else {
        return Ok(());
    };
    if kind != Kind::of_column(col.ty) {
        return Err(refuse(format!(
            "{what}: column {:?} ({}) cannot be compared with {} ({})",
            col.name,
            col.ty,
            describe(v),
            kind.name()
        )));
    }
    if let Scalar::Decimal { scale, .. } = v
        && *scale > MAX_LITERAL_SCALE
    {
        return Err(refuse(format!(
            "{what}: the decimal literal {} has {scale} digits after the point (at most {MAX_LITERAL_SCALE})",
            describe(v)
        )));
    }
    Ok(())
}

/// `column OP literal` as one step.
fn compile_cmp(
    schema: &Schema,
    layout: &RowLayout,
    c: u16,
    op: CmpOp,
    v: &Scalar,
    what: &str,
) -> Result<Op, QueryError> {
    let col = column(schema, c, what)?;
    check_literal(col, v, what)?;
    let i = c as usize;
    Ok(match v {
        Scalar::Null => Op::Const(UNKNOWN),
        Scalar::Str(s) => Op::Text {
            col: i,
            op,
            lit: s.as_bytes().into(),
        },
        Scalar::Float(_) => Op::Float {
            c: float_col(layout, i, col.ty),
            op,
            lit: lit_to_f64(v),
        },
        _ if col.ty == ColumnType::Float64 => Op::Float {
            c: float_col(layout, i, col.ty),
            op,
            lit: lit_to_f64(v),
        },
        _ => {
            let (x, sl) = exact_lit(v).expect("kinds checked: an exact literal");
            let sc = col_scale(col.ty);
            let s = sc.max(sl);
            let c = ExactCol {
                col: i,
                offset: fixed_offset(layout, i),
                read: exact_read(col.ty).expect("kinds checked: an exact column"),
                mul: pow10_i128(s - sc),
            };
            let lit = x * pow10_i128(s - sl);
            match i64::try_from(lit) {
                // The column at its own scale and a literal that fits: the
                // common case (`l_discount between 0.05 and 0.07`), compared
                // without i128 arithmetic.
                Ok(lit) if c.mul == 1 => Op::Exact64 {
                    col: i,
                    offset: c.offset,
                    read: c.read,
                    op,
                    lit,
                },
                _ => Op::Exact { c, op, lit },
            }
        }
    })
}

fn compile_cols(
    schema: &Schema,
    layout: &RowLayout,
    left: u16,
    op: CmpOp,
    right: u16,
    what: &str,
) -> Result<Op, QueryError> {
    let (a, b) = (column(schema, left, what)?, column(schema, right, what)?);
    let (ka, kb) = (Kind::of_column(a.ty), Kind::of_column(b.ty));
    if ka != kb {
        return Err(refuse(format!(
            "{what}: column {:?} ({}) cannot be compared with column {:?} ({})",
            a.name, a.ty, b.name, b.ty
        )));
    }
    let (li, ri) = (left as usize, right as usize);
    let (l, r) = if ka == Kind::Text {
        (Operand::Text(li), Operand::Text(ri))
    } else if a.ty == ColumnType::Float64 || b.ty == ColumnType::Float64 {
        (
            Operand::Float(float_col(layout, li, a.ty)),
            Operand::Float(float_col(layout, ri, b.ty)),
        )
    } else {
        let (sa, sb) = (col_scale(a.ty), col_scale(b.ty));
        let s = sa.max(sb);
        let side = |i, ty, sc| {
            Operand::Exact(ExactCol {
                col: i,
                offset: fixed_offset(layout, i),
                read: exact_read(ty).expect("not float, not text: exact"),
                mul: pow10_i128(s - sc),
            })
        };
        (side(li, a.ty, sa), side(ri, b.ty, sb))
    };
    Ok(Op::Cols { l, r, op })
}

fn compile_in(
    schema: &Schema,
    layout: &RowLayout,
    c: u16,
    values: &[Scalar],
    what: &str,
) -> Result<Op, QueryError> {
    let col = column(schema, c, what)?;
    if values.len() > MAX_IN_LIST {
        return Err(refuse(format!(
            "{what}: an IN list of {} values, more than the limit of {MAX_IN_LIST}",
            values.len()
        )));
    }
    for v in values {
        check_literal(col, v, what)?;
    }
    let i = c as usize;
    // `x IN ()` is the OR of no comparisons: false, even for a NULL x.
    if values.is_empty() {
        return Ok(Op::Const(FALSE));
    }
    let mut list = InList {
        col: i,
        exact: None,
        floats: None,
        text: HashSet::new(),
        has_null: values.iter().any(|v| matches!(v, Scalar::Null)),
    };
    let float_column = col.ty == ColumnType::Float64;
    let mut floats = Vec::new();
    let mut exact = Vec::new();
    for v in values {
        match v {
            Scalar::Null => {}
            Scalar::Str(s) => {
                list.text.insert(s.as_bytes().into());
            }
            Scalar::Float(_) => floats.push(lit_to_f64(v)),
            _ if float_column => floats.push(lit_to_f64(v)),
            _ => exact.push(exact_lit(v).expect("kinds checked: an exact literal")),
        }
    }
    if !floats.is_empty() {
        list.floats = Some((float_col(layout, i, col.ty), floats));
    }
    if !exact.is_empty() {
        let sc = col_scale(col.ty);
        let s = exact.iter().map(|&(_, sl)| sl).max().unwrap_or(0).max(sc);
        let set = exact
            .iter()
            .map(|&(x, sl)| x * pow10_i128(s - sl))
            .collect();
        let read = exact_read(col.ty).expect("kinds checked: an exact column");
        list.exact = Some((
            ExactCol {
                col: i,
                offset: fixed_offset(layout, i),
                read,
                mul: pow10_i128(s - sc),
            },
            set,
        ));
    }
    Ok(Op::In(Box::new(list)))
}

fn text_column<'s>(schema: &'s Schema, c: u16, what: &str) -> Result<&'s Column, QueryError> {
    let col = column(schema, c, what)?;
    if col.ty != ColumnType::Utf8 {
        return Err(refuse(format!(
            "{what}: column {:?} is {}, not text",
            col.name, col.ty
        )));
    }
    Ok(col)
}

/// Check and compile a postfix filter program.
pub(crate) fn compile_filter(schema: &Schema, preds: &[Pred]) -> Result<Filter, QueryError> {
    let layout = &RowLayout::new(schema);
    if preds.len() > MAX_PRED_OPS {
        return Err(refuse(format!(
            "the filter has {} steps, more than the limit of {MAX_PRED_OPS}",
            preds.len()
        )));
    }
    let mut ops = Vec::with_capacity(preds.len() + 4);
    let mut depth = 0usize;
    let mut max_depth = 0usize;
    for (i, p) in preds.iter().enumerate() {
        let what = format!("filter step {i}");
        let what = what.as_str();
        let pushes_leaf = !matches!(p, Pred::And | Pred::Or | Pred::Not);
        match p {
            Pred::Cmp { col, op, value } => {
                ops.push(compile_cmp(schema, layout, *col, *op, value, what)?)
            }
            Pred::CmpCols { left, op, right } => {
                ops.push(compile_cols(schema, layout, *left, *op, *right, what)?)
            }
            Pred::Between { col, lo, hi } => {
                ops.push(compile_cmp(schema, layout, *col, CmpOp::Ge, lo, what)?);
                ops.push(compile_cmp(schema, layout, *col, CmpOp::Le, hi, what)?);
                ops.push(Op::And);
                max_depth = max_depth.max(depth + 2);
            }
            Pred::In { col, values } => ops.push(compile_in(schema, layout, *col, values, what)?),
            Pred::IsNull { col } => {
                column(schema, *col, what)?;
                ops.push(Op::IsNull(*col as usize));
            }
            Pred::Like {
                col,
                pattern,
                case_insensitive,
            } => {
                let c = text_column(schema, *col, what)?;
                let re = like::like(pattern, *case_insensitive)
                    .map_err(|m| refuse(format!("{what} (column {:?}): {m}", c.name)))?;
                ops.push(Op::Match {
                    col: *col as usize,
                    re: Box::new(re),
                });
            }
            Pred::Regex {
                col,
                pattern,
                case_insensitive,
            } => {
                let c = text_column(schema, *col, what)?;
                let re = like::regex(pattern, *case_insensitive)
                    .map_err(|m| refuse(format!("{what} (column {:?}): {m}", c.name)))?;
                ops.push(Op::Match {
                    col: *col as usize,
                    re: Box::new(re),
                });
            }
            Pred::And | Pred::Or => {
                if depth < 2 {
                    return Err(refuse(format!(
                        "the filter is malformed: step {i} ({p:?}) needs two values, the stack holds {depth}"
                    )));
                }
                depth -= 1;
                ops.push(if matches!(p, Pred::And) {
                    Op::And
                } else {
                    Op::Or
                });
            }
            Pred::Not => {
                if depth < 1 {
                    return Err(refuse(format!(
                        "the filter is malformed: step {i} (Not) needs a value, the stack is empty"
                    )));
                }
                ops.push(Op::Not);
            }
        }
        if pushes_leaf {
            depth += 1;
            max_depth = max_depth.max(depth);
        }
    }
    if !preds.is_empty() && depth != 1 {
        return Err(refuse(format!(
            "the filter is malformed: it leaves {depth} values instead of one"
        )));
    }
    assert!(max_depth <= STACK_CAP, "MAX_PRED_OPS bounds the stack");
    Ok(Filter::new(ops, max_depth))
}

fn compile_agg(schema: &Schema, i: usize, spec: &AggSpec) -> Result<CompiledAgg, QueryError> {
    let what = format!("aggregate {i} ({:?})", spec.func);
    let (arg, ty) = compile_arg(schema, &spec.arg, &what)?;
    match (spec.func, ty) {
        (AggFunc::CountStar, None) => {}
        (AggFunc::CountStar, Some(_)) => {
            return Err(refuse(format!("{what}: count(*) takes no argument")));
        }
        (_, None) => return Err(refuse(format!("{what}: needs an argument"))),
        (AggFunc::Sum | AggFunc::Avg, Some(t)) if !t.is_numeric() => {
            return Err(refuse(format!("{what}: needs a number, not {t:?}")));
        }
        _ => {}
    }
    Ok(CompiledAgg {
        func: spec.func,
        arg,
        ty,
    })
}

/// The columns a tablet returns for a top-k: the projection, then each
/// ORDER BY column not in it (so the client can merge tablets' answers); and
/// per sort key its index among them.
pub(crate) fn top_k_columns(
    columns: &[u16],
    order_by: &[SortKey],
) -> (Vec<u16>, Vec<(usize, SortKey)>) {
    let mut out_columns = columns.to_vec();
    let keys = order_by
        .iter()
        .map(|k| {
            let at = match out_columns.iter().position(|&c| c == k.col) {
                Some(at) => at,
                None => {
                    out_columns.push(k.col);
                    out_columns.len() - 1
                }
            };
            (at, *k)
        })
        .collect();
    (out_columns, keys)
}

/// The columns of a tablet's Arrow answer to a `Rows` plan, in order: the
/// projection, and for a top-k (ORDER BY) also the sort columns not in it
/// (`merge_top_k` drops them). Empty for an aggregate plan.
pub fn answer_columns(plan: &QueryPlan) -> Vec<u16> {
    match &plan.output {
        QueryOutput::Rows {
            columns, order_by, ..
        } if !order_by.is_empty() => top_k_columns(columns, order_by).0,
        QueryOutput::Rows { columns, .. } => columns.clone(),
        QueryOutput::Aggregate { .. } => Vec::new(),
    }
}

/// Check `plan` against `schema` and compile it.
pub fn compile(schema: &Schema, plan: &QueryPlan) -> Result<Compiled, QueryError> {
    schema
        .check()
        .map_err(|m| refuse(format!("the table's schema is invalid: {m}")))?;
    let filter = compile_filter(schema, &plan.filter)?;
    let shared = Arc::new(schema.clone());
    let out = match &plan.output {
        QueryOutput::Rows {
            columns,
            order_by,
            limit,
        } => {
            for &c in columns {
                column(schema, c, "projection")?;
            }
            for k in order_by {
                column(schema, k.col, "ORDER BY")?;
            }
            if order_by.is_empty() {
                Output::Rows {
                    schema: shared,
                    columns: columns.clone(),
                    limit: *limit,
                }
            } else {
                let limit = limit.ok_or_else(|| {
                    refuse("ORDER BY without LIMIT cannot be evaluated by the servers (sort in the client)".into())
                })?;
                if limit > MAX_TOP_K {
                    return Err(refuse(format!(
                        "ORDER BY .. LIMIT {limit}: more than the {MAX_TOP_K} rows a tablet may sort"
                    )));
                }
                let (out_columns, keys) = top_k_columns(columns, order_by);
                Output::TopK {
                    schema: shared,
                    out_columns,
                    keys,
                    limit: limit as usize,
                }
            }
        }
        QueryOutput::Aggregate { group_by, aggs } => {
            for &c in group_by {
                column(schema, c, "GROUP BY")?;
            }
            if aggs.len() > MAX_AGGS {
                return Err(refuse(format!(
                    "{} aggregates, more than the limit of {MAX_AGGS}",
                    aggs.len()
                )));
            }
            let aggs = aggs
                .iter()
                .enumerate()
                .map(|(i, a)| compile_agg(schema, i, a))
                .collect::<Result<Vec<_>, _>>()?;
            Output::Groups {
                group_by: group_by.iter().map(|&c| c as usize).collect(),
                aggs,
            }
        }
    };
    let layout = RowLayout::new(schema);
    let fast = match &out {
        Output::Groups { aggs, .. } => {
            FastAggs::new(aggs, |c| fixed_offset(&layout, c)).map(Arc::new)
        }
        _ => None,
    };
    Ok(Compiled {
        layout,
        filter,
        out: Arc::new(out),
        fast,
    })
}
