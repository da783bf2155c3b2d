//! An obviously-correct evaluator of plans over rows of `Scalar`s, written
//! from SQL's definitions rather than for speed, for tests (of this crate
//! and of others): three-valued logic on `Option<bool>`, `IN` as an OR of
//! equalities, LIKE by dynamic programming over characters, arithmetic on
//! (i128, scale) pairs, groups found by linear search, sorts by a stable
//! sort. The plan is assumed to have passed `compile`.

use std::cmp::Ordering;

use insitu_protocol::plan::CmpOp;
use insitu_protocol::query::{
    AggFunc, AggSpec, Pred, QueryOutput, QueryPlan, Scalar, SortKey, ValueOp,
};
use insitu_protocol::schema::{ColumnType, Schema};

use crate::QueryError;
use crate::value::{cmp_scalars, exact_to_f64, group_eq, pow10_i128, sort_cmp};

fn holds(op: CmpOp, o: Ordering) -> bool {
    match op {
        CmpOp::Eq => o.is_eq(),
        CmpOp::Ne => o.is_ne(),
        CmpOp::Lt => o.is_lt(),
        CmpOp::Le => o.is_le(),
        CmpOp::Gt => o.is_gt(),
        CmpOp::Ge => o.is_ge(),
    }
}

fn cmp(a: &Scalar, op: CmpOp, b: &Scalar) -> Option<bool> {
    cmp_scalars(a, b).map(|o| holds(op, o))
}

fn and(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn or(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

/// SQL LIKE by dynamic programming: `%` any run, `_` one character, `\x`
/// the character x.
pub fn like(pattern: &str, text: &str, case_insensitive: bool) -> bool {
    enum Tok {
        Any,
        One,
        Lit(char),
    }
    let mut toks = Vec::new();
    let mut it = pattern.chars();
    while let Some(c) = it.next() {
        toks.push(match c {
            '%' => Tok::Any,
            '_' => Tok::One,
            '\\' => Tok::Lit(it.next().unwrap_or('\\')),
            c => Tok::Lit(c),
        });
    }
    let same =
        |a: char, b: char| a == b || (case_insensitive && a.to_lowercase().eq(b.to_lowercase()));
    let s: Vec<char> = text.chars().collect();
    // m[j]: the tokens so far match s[..j].
    let mut m = vec![false; s.len() + 1];
    m[0] = true;
    for t in &toks {
        let mut next = vec![false; s.len() + 1];
        for j in 0..=s.len() {
            next[j] = match t {
                Tok::Any => m[j] || (j > 0 && next[j - 1]),
                Tok::One => j > 0 && m[j - 1],
                Tok::Lit(c) => j > 0 && m[j - 1] && same(*c, s[j - 1]),
            };
        }
        m = next;
    }
    m[s.len()]
}

/// The filter's value for one row: Some(true), Some(false) or None
/// (unknown).
pub fn truth(preds: &[Pred], row: &[Scalar]) -> Option<bool> {
    if preds.is_empty() {
        return Some(true);
    }
    let mut stack: Vec<Option<bool>> = Vec::new();
    for p in preds {
        let v = match p {
            Pred::Cmp { col, op, value } => cmp(&row[*col as usize], *op, value),
            Pred::CmpCols { left, op, right } => {
                cmp(&row[*left as usize], *op, &row[*right as usize])
            }
            Pred::Between { col, lo, hi } => {
                let x = &row[*col as usize];
                and(cmp(x, CmpOp::Ge, lo), cmp(x, CmpOp::Le, hi))
            }
            Pred::In { col, values } => {
                // x IN (a, b) is x = a OR x = b (a NULL among them: unknown).
                let mut acc = Some(false);
                for v in values {
                    acc = or(acc, cmp(&row[*col as usize], CmpOp::Eq, v));
                }
                acc
            }
            Pred::IsNull { col } => Some(row[*col as usize] == Scalar::Null),
            Pred::Like {
                col,
                pattern,
                case_insensitive,
            } => match &row[*col as usize] {
                Scalar::Str(s) => Some(like(pattern, s, *case_insensitive)),
                _ => None,
            },
            Pred::Regex {
                col,
                pattern,
                case_insensitive,
            } => match &row[*col as usize] {
                Scalar::Str(s) => Some(
                    regex::RegexBuilder::new(pattern)
                        .case_insensitive(*case_insensitive)
                        .build()
                        .expect("compile accepted the pattern")
                        .is_match(s),
                ),
                _ => None,
            },
            Pred::And | Pred::Or => {
                let b = stack.pop().expect("well formed");
                let a = stack.pop().expect("well formed");
                if matches!(p, Pred::And) {
                    and(a, b)
                } else {
                    or(a, b)
                }
            }
            Pred::Not => stack.pop().expect("well formed").map(|b| !b),
        };
        stack.push(v);
    }
    stack.pop().expect("well formed")
}

/// An argument's value: exact (unscaled, scale, whether an integer), float,
/// or another kind as it is.
#[derive(Clone, Debug, PartialEq)]
enum V {
    Null,
    Exact(i128, u32, bool),
    Float(f64),
    Other(Scalar),
}

fn value_of(s: &Scalar) -> V {
    match *s {
        Scalar::Null => V::Null,
        Scalar::Int(i) => V::Exact(i128::from(i), 0, true),
        Scalar::Decimal { value, scale } => V::Exact(i128::from(value), u32::from(scale), false),
        Scalar::Float(f) => V::Float(f),
        ref other => V::Other(other.clone()),
    }
}

fn arith(prog: &[ValueOp], row: &[Scalar]) -> Result<V, QueryError> {
    let ovf = || QueryError::Eval("overflow".into());
    let mut st: Vec<V> = Vec::new();
    for op in prog {
        let v = match op {
            ValueOp::Col(c) => value_of(&row[*c as usize]),
            ValueOp::Lit(s) => value_of(s),
            ValueOp::Neg => match st.pop().expect("well formed") {
                V::Exact(x, s, i) => V::Exact(x.checked_neg().ok_or_else(ovf)?, s, i),
                V::Float(f) => V::Float(-f),
                other => other,
            },
            ValueOp::Add | ValueOp::Sub | ValueOp::Mul => {
                let b = st.pop().expect("well formed");
                let a = st.pop().expect("well formed");
                match (a, b) {
                    (V::Null, _) | (_, V::Null) => V::Null,
                    (V::Exact(x, sx, ix), V::Exact(y, sy, iy)) => {
                        if matches!(op, ValueOp::Mul) {
                            V::Exact(x.checked_mul(y).ok_or_else(ovf)?, sx + sy, ix && iy)
                        } else {
                            let s = sx.max(sy);
                            let x = x.checked_mul(pow10_i128(s - sx)).ok_or_else(ovf)?;
                            let y = y.checked_mul(pow10_i128(s - sy)).ok_or_else(ovf)?;
                            let r = if matches!(op, ValueOp::Add) {
                                x.checked_add(y)
                            } else {
                                x.checked_sub(y)
                            };
                            V::Exact(r.ok_or_else(ovf)?, s, ix && iy)
                        }
                    }
                    (a, b) => {
                        let f = |v: V| match v {
                            V::Exact(x, s, _) => exact_to_f64(x, s),
                            V::Float(f) => f,
                            _ => unreachable!("numbers only"),
                        };
                        let (x, y) = (f(a), f(b));
                        V::Float(match op {
                            ValueOp::Add => x + y,
                            ValueOp::Sub => x - y,
                            _ => x * y,
                        })
                    }
                }
            }
        };
        st.push(v);
    }
    Ok(st.pop().unwrap_or(V::Null))
}

/// The final value of one aggregate over some rows (as `finalize_groups`
/// reports it, read back as scalars).
fn aggregate_one(
    schema: &Schema,
    spec: &AggSpec,
    rows: &[&Vec<Scalar>],
) -> Result<Scalar, QueryError> {
    if spec.func == AggFunc::CountStar {
        return Ok(Scalar::Int(rows.len() as i64));
    }
    let mut vals = Vec::new();
    for r in rows {
        let v = arith(&spec.arg, r)?;
        if v != V::Null {
            vals.push(v);
        }
    }
    let single_col = match spec.arg.as_slice() {
        [ValueOp::Col(c)] => Some(schema.columns[*c as usize].ty),
        _ => None,
    };
    Ok(match spec.func {
        AggFunc::Count => Scalar::Int(vals.len() as i64),
        AggFunc::Sum | AggFunc::Avg if vals.is_empty() => Scalar::Null,
        AggFunc::Sum | AggFunc::Avg => {
            let mut exact: Option<(i128, u32, bool)> = None;
            let mut float = 0.0;
            for v in &vals {
                match *v {
                    V::Exact(x, s, i) => {
                        let (acc, _, _) = exact.unwrap_or((0, s, i));
                        exact = Some((
                            acc.checked_add(x)
                                .ok_or_else(|| QueryError::Eval("overflow".into()))?,
                            s,
                            i,
                        ));
                    }
                    V::Float(f) => float += f,
                    _ => unreachable!("numbers only"),
                }
            }
            let n = vals.len() as f64;
            match (spec.func, exact) {
                (AggFunc::Avg, Some((x, s, _))) => Scalar::Float(exact_to_f64(x, s) / n),
                (AggFunc::Avg, None) => Scalar::Float(float / n),
                (_, Some((x, _, true))) => Scalar::Int(
                    i64::try_from(x).map_err(|_| QueryError::Eval("sum beyond int64".into()))?,
                ),
                (_, Some((x, s, false))) => Scalar::Decimal {
                    value: i64::try_from(x).map_err(|_| QueryError::Eval("big".into()))?,
                    scale: s as u8,
                },
                (_, None) => Scalar::Float(float),
            }
        }
        AggFunc::Min | AggFunc::Max => {
            let pick = |a: &V, b: &V| -> Ordering {
                let s = |v: &V| match v {
                    V::Exact(x, s, _) => Scalar::Decimal {
                        value: *x as i64,
                        scale: *s as u8,
                    },
                    V::Float(f) => Scalar::Float(*f),
                    V::Other(o) => o.clone(),
                    V::Null => Scalar::Null,
                };
                cmp_scalars(&s(a), &s(b)).unwrap_or(Ordering::Equal)
            };
            let best = if spec.func == AggFunc::Min {
                vals.iter().min_by(|a, b| pick(a, b))
            } else {
                vals.iter().max_by(|a, b| pick(a, b))
            };
            match best {
                None => Scalar::Null,
                Some(V::Exact(x, s, int)) => {
                    let is_int =
                        *int || matches!(single_col, Some(ColumnType::Int32 | ColumnType::Int64));
                    if is_int {
                        Scalar::Int(*x as i64)
                    } else {
                        Scalar::Decimal {
                            value: *x as i64,
                            scale: *s as u8,
                        }
                    }
                }
                Some(V::Float(f)) => Scalar::Float(*f),
                Some(V::Other(o)) => o.clone(),
                Some(V::Null) => Scalar::Null,
            }
        }
        AggFunc::CountStar => unreachable!("handled above"),
    })
}

/// What a plan returns over all rows at once.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// Projected rows (sorted and cut to the limit for a top-k; all
    /// filtered rows, in input order, without ORDER BY, cut to the limit).
    Rows(Vec<Vec<Scalar>>),
    /// Per group (in order of first appearance): the group values then one
    /// final value per aggregate (count → Int, sum of ints → Int, of
    /// decimals → Decimal, of floats → Float, min/max → the argument's
    /// kind, avg → Float; NULL over no values).
    Groups(Vec<Vec<Scalar>>),
}

/// Evaluate `plan` over `rows` (one `Vec<Scalar>` per row, schema order).
pub fn run(schema: &Schema, plan: &QueryPlan, rows: &[Vec<Scalar>]) -> Result<Answer, QueryError> {
    let passed: Vec<&Vec<Scalar>> = rows
        .iter()
        .filter(|r| truth(&plan.filter, r) == Some(true))
        .collect();
    match &plan.output {
        QueryOutput::Rows {
            columns,
            order_by,
            limit,
        } => {
            let mut sorted = passed;
            sorted.sort_by(|a, b| sort_rows(order_by, a, b));
            let n = limit.map_or(usize::MAX, |l| l as usize);
            Ok(Answer::Rows(
                sorted
                    .into_iter()
                    .take(n)
                    .map(|r| columns.iter().map(|&c| r[c as usize].clone()).collect())
                    .collect(),
            ))
        }
        QueryOutput::Aggregate { group_by, aggs } => {
            let mut groups: Vec<(Vec<Scalar>, Vec<&Vec<Scalar>>)> = Vec::new();
            for r in passed {
                let key: Vec<Scalar> = group_by.iter().map(|&c| r[c as usize].clone()).collect();
                match groups
                    .iter_mut()
                    .find(|(k, _)| k.iter().zip(&key).all(|(a, b)| group_eq(a, b)))
                {
                    Some((_, members)) => members.push(r),
                    None => groups.push((key, vec![r])),
                }
            }
            if group_by.is_empty() && groups.is_empty() {
                groups.push((Vec::new(), Vec::new()));
            }
            let mut out = Vec::new();
            for (key, members) in groups {
                let mut row = key;
                for a in aggs {
                    row.push(aggregate_one(schema, a, &members)?);
                }
                out.push(row);
            }
            Ok(Answer::Groups(out))
        }
    }
}

/// The order of two rows by `keys` (full rows, schema order).
pub fn sort_rows(keys: &[SortKey], a: &[Scalar], b: &[Scalar]) -> Ordering {
    for k in keys {
        let o = sort_cmp(
            &a[k.col as usize],
            &b[k.col as usize],
            k.descending,
            k.nulls_first,
        );
        if o.is_ne() {
            return o;
        }
    }
    Ordering::Equal
}
