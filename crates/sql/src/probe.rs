//! Choosing a secondary index for a scan: which of the pushed filters can
//! find its rows through an index (`IndexProbe`), and how EXPLAIN shows it.
//!
//! The rule, without statistics: an equality or an IN list on an indexed
//! column always probes (a point lookup); otherwise a range bounded on both
//! sides (BETWEEN, or `>`/`>=` and `<`/`<=` on the same column) probes. A
//! one-sided range does not: it usually matches a large part of the table,
//! where walking the log is faster. The servers make the final call: a
//! probe matching more than their candidate limit walks the log anyway, and
//! the filter is applied to every candidate either way, so a probe never
//! changes an answer.

use datafusion::logical_expr::Expr;
use insitu_protocol::plan::CmpOp;
use insitu_protocol::query::{IndexProbe, Pred, Scalar};
use insitu_protocol::schema::Schema;

use crate::translate::filter_to_preds;

/// The probe for a scan whose pushed filters (each one conjunct) are
/// `filters`, on a table whose indexed columns are `indexes`.
pub fn choose(filters: &[Expr], schema: &Schema, indexes: &[u16]) -> Option<IndexProbe> {
    let indexed = |c: u16| indexes.binary_search(&c).is_ok();
    let mut best_eq: Option<(u16, Vec<Scalar>)> = None;
    let mut between: Option<IndexProbe> = None;
    // Per column: the tightest-known lower and upper bound seen.
    let mut lo: Vec<(u16, (Scalar, bool))> = Vec::new();
    let mut hi: Vec<(u16, (Scalar, bool))> = Vec::new();
    for f in filters {
        let Ok(preds) = filter_to_preds(f, schema) else {
            continue;
        };
        match preds.as_slice() {
            [Pred::Cmp { col, op, value }] if indexed(*col) && *value != Scalar::Null => match op {
                CmpOp::Eq => {
                    if best_eq.as_ref().is_none_or(|(_, v)| v.len() > 1) {
                        best_eq = Some((*col, vec![value.clone()]));
                    }
                }
                CmpOp::Gt | CmpOp::Ge => lo.push((*col, (value.clone(), *op == CmpOp::Ge))),
                CmpOp::Lt | CmpOp::Le => hi.push((*col, (value.clone(), *op == CmpOp::Le))),
                CmpOp::Ne => {}
            },
            [Pred::In { .. }, ..] | [Pred::Cmp { op: CmpOp::Eq, .. }, _, ..] => {
                if let Some((col, values)) = disjunction(&preds)
                    && indexed(col)
                    && best_eq.as_ref().is_none_or(|(_, v)| v.len() > values.len())
                {
                    best_eq = Some((col, values));
                }
            }
            [Pred::Between { col, lo, hi }]
                if indexed(*col) && *lo != Scalar::Null && *hi != Scalar::Null =>
            {
                between.get_or_insert(IndexProbe::Range {
                    col: *col,
                    lo: Some((lo.clone(), true)),
                    hi: Some((hi.clone(), true)),
                });
            }
            _ => {}
        }
    }
    if let Some((col, values)) = best_eq {
        return Some(IndexProbe::Eq { col, values });
    }
    if between.is_some() {
        return between;
    }
    // Both bounds on one column. (Any pair will do: the filter applies all.)
    lo.iter().find_map(|(col, l)| {
        let (_, h) = hi.iter().find(|(c, _)| c == col)?;
        Some(IndexProbe::Range {
            col: *col,
            lo: Some(l.clone()),
            hi: Some(h.clone()),
        })
    })
}

/// `col = a OR col = b OR col IN (c, d) ...` (how DataFusion writes a
/// short IN list) as the column and its values; None for anything else.
fn disjunction(preds: &[Pred]) -> Option<(u16, Vec<Scalar>)> {
    let mut column = None;
    let mut values = Vec::new();
    let (mut leaves, mut ors) = (0usize, 0usize);
    let mut same = |c: u16| *column.get_or_insert(c) == c;
    for p in preds {
        match p {
            Pred::Cmp {
                col,
                op: CmpOp::Eq,
                value,
            } if same(*col) && *value != Scalar::Null => {
                values.push(value.clone());
                leaves += 1;
            }
            Pred::In { col, values: v } if same(*col) && !v.contains(&Scalar::Null) => {
                values.extend(v.iter().cloned());
                leaves += 1;
            }
            Pred::Or => ors += 1,
            _ => return None,
        }
    }
    // Only ORs join the leaves, so the program is one disjunction of them.
    (leaves > 0 && ors + 1 == leaves && values.len() <= insitu_protocol::query::MAX_IN_LIST)
        .then(|| (column.expect("a leaf set it"), values))
}

/// `probe` as EXPLAIN shows it, with column names.
pub fn describe(probe: &IndexProbe, schema: &Schema) -> String {
    let name = |c: u16| {
        schema
            .columns
            .get(c as usize)
            .map_or_else(|| format!("#{c}"), |c| c.name.clone())
    };
    match probe {
        IndexProbe::Eq { col, values } if values.len() == 1 => {
            format!("{} = {}", name(*col), show(&values[0]))
        }
        IndexProbe::Eq { col, values } => {
            let shown: Vec<String> = values.iter().take(8).map(show).collect();
            let more = if values.len() > 8 { ", ..." } else { "" };
            format!("{} IN ({}{more})", name(*col), shown.join(", "))
        }
        IndexProbe::Range { col, lo, hi } => {
            let mut s = String::new();
            if let Some((v, incl)) = lo {
                s += &format!("{} {} ", show(v), if *incl { "<=" } else { "<" });
            }
            s += &name(*col);
            if let Some((v, incl)) = hi {
                s += &format!(" {} {}", if *incl { "<=" } else { "<" }, show(v));
            }
            s
        }
    }
}

fn show(v: &Scalar) -> String {
    match v {
        Scalar::Null => "NULL".into(),
        Scalar::Bool(b) => b.to_string(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Float(f) => f.to_string(),
        Scalar::Decimal { value, scale } => {
            let p = 10i128.pow(u32::from(*scale));
            let (v, p) = (i128::from(*value), p);
            if *scale == 0 {
                v.to_string()
            } else {
                let sign = if v < 0 { "-" } else { "" };
                format!(
                    "{sign}{}.{:0width$}",
                    v.abs() / p,
                    v.abs() % p,
                    width = *scale as usize
                )
            }
        }
        Scalar::Date(d) => format!("date '{}'", insitu_rows::date::format_date(*d)),
        Scalar::Str(s) => format!("'{}'", s.replace('\'', "''")),
    }
}
