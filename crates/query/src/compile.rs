//! `compile`: a plan checked against a table's schema, everything a hostile
//! client could send refused with a message naming the column, and turned
//! into the forms evaluated per row (`filter.rs`, `arith.rs`, `sink.rs`).
//! The filter's own checks and compilation are in `compile_filter.rs`.

use std::sync::Arc;

use insitu_protocol::query::{
    AggFunc, AggSpec, MAX_AGGS, MAX_TOP_K, QueryOutput, QueryPlan, SortKey,
};
use insitu_protocol::schema::{Column, Schema};
use insitu_rows::{RowError, RowLayout, RowRef};

use crate::QueryError;
use crate::agg_fast::FastAggs;
use crate::arith::{Arg, ArgType, compile_arg};
use crate::filter::{Filter, fixed_offset};

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

// The filter's checks and compilation.
#[path = "compile_filter.rs"]
mod compile_filter;
pub(crate) use compile_filter::compile_filter;

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
