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
    let conjuncts: Vec<Vec<Pred>> = filters
        .iter()
        .filter_map(|f| filter_to_preds(f, schema).ok())
        .collect();
    choose_preds(&conjuncts, indexes)
}

/// The probe for a filter made of `conjuncts` (each a postfix program,
/// all ANDed), on a table whose indexed columns are `indexes`.
pub fn choose_preds(conjuncts: &[Vec<Pred>], indexes: &[u16]) -> Option<IndexProbe> {
    let indexed = |c: u16| indexes.binary_search(&c).is_ok();
    let mut best_eq: Option<(u16, Vec<Scalar>)> = None;
    let mut between: Option<IndexProbe> = None;
    // Per column: the tightest-known lower and upper bound seen.
    let mut lo: Vec<(u16, (Scalar, bool))> = Vec::new();
    let mut hi: Vec<(u16, (Scalar, bool))> = Vec::new();
    for preds in conjuncts {
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
                if let Some((col, values)) = disjunction(preds)
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

/// A postfix filter program split at its top-level ANDs: the conjuncts,
/// each a program of its own (`a AND (b AND c)` gives `a`, `b`, `c`). A
/// malformed program is returned whole.
pub fn conjuncts(program: &[Pred]) -> Vec<Vec<Pred>> {
    // Per stack entry: its span in `program` and, for an AND, its operands.
    #[derive(Clone)]
    enum Node {
        Span(usize, usize),
        And(Box<Node>, Box<Node>, usize, usize),
    }
    let span = |n: &Node| match n {
        Node::Span(a, b) | Node::And(_, _, a, b) => (*a, *b),
    };
    let mut stack: Vec<Node> = Vec::new();
    for (i, p) in program.iter().enumerate() {
        let node = match p {
            Pred::And | Pred::Or => {
                let (Some(r), Some(l)) = (stack.pop(), stack.pop()) else {
                    return vec![program.to_vec()];
                };
                let (start, end) = (span(&l).0, i + 1);
                debug_assert_eq!(span(&r).1, i);
                if matches!(p, Pred::And) {
                    Node::And(Box::new(l), Box::new(r), start, end)
                } else {
                    Node::Span(start, end)
                }
            }
            Pred::Not => {
                let Some(x) = stack.pop() else {
                    return vec![program.to_vec()];
                };
                Node::Span(span(&x).0, i + 1)
            }
            _ => Node::Span(i, i + 1),
        };
        stack.push(node);
    }
    let [root] = stack.as_slice() else {
        return vec![program.to_vec()];
    };
    let mut out = Vec::new();
    let mut todo = vec![root.clone()];
    while let Some(n) = todo.pop() {
        match n {
            Node::And(l, r, ..) => {
                todo.push(*r);
                todo.push(*l);
            }
            Node::Span(a, b) => out.push(program[a..b].to_vec()),
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn eq(col: u16, v: i64) -> Pred {
        Pred::Cmp {
            col,
            op: CmpOp::Eq,
            value: Scalar::Int(v),
        }
    }

    #[test]
    fn conjuncts_split_only_top_level_ands() {
        // a AND (b OR c) AND NOT d, as postfix: a b c Or And d Not And
        let p = vec![
            eq(0, 1),
            eq(1, 2),
            eq(1, 3),
            Pred::Or,
            Pred::And,
            eq(2, 4),
            Pred::Not,
            Pred::And,
        ];
        assert_eq!(
            conjuncts(&p),
            vec![
                vec![eq(0, 1)],
                vec![eq(1, 2), eq(1, 3), Pred::Or],
                vec![eq(2, 4), Pred::Not],
            ]
        );
        assert_eq!(conjuncts(&[eq(0, 1)]), vec![vec![eq(0, 1)]]);
        // Malformed: returned whole.
        assert_eq!(conjuncts(&[Pred::And]), vec![vec![Pred::And]]);
    }

    #[test]
    fn the_probe_prefers_equality_then_two_sided_ranges() {
        let c = conjuncts(&[
            Pred::Cmp {
                col: 1,
                op: CmpOp::Gt,
                value: Scalar::Int(5),
            },
            Pred::Cmp {
                col: 1,
                op: CmpOp::Le,
                value: Scalar::Int(9),
            },
            Pred::And,
            eq(2, 7),
            Pred::And,
        ]);
        assert_eq!(
            choose_preds(&c, &[1, 2]),
            Some(IndexProbe::Eq {
                col: 2,
                values: vec![Scalar::Int(7)]
            })
        );
        assert_eq!(
            choose_preds(&c, &[1]),
            Some(IndexProbe::Range {
                col: 1,
                lo: Some((Scalar::Int(5), false)),
                hi: Some((Scalar::Int(9), true)),
            })
        );
        // Not indexed, or only one side of a range: no probe.
        assert_eq!(choose_preds(&c, &[0]), None);
        assert_eq!(choose_preds(&c[..1], &[1]), None);
        // col = 1 OR col = 2 is an IN list.
        let or = vec![vec![eq(3, 1), eq(3, 2), Pred::Or]];
        assert_eq!(
            choose_preds(&or, &[3]),
            Some(IndexProbe::Eq {
                col: 3,
                values: vec![Scalar::Int(1), Scalar::Int(2)]
            })
        );
        let mixed = vec![vec![eq(3, 1), eq(4, 2), Pred::Or]];
        assert_eq!(choose_preds(&mixed, &[3, 4]), None);
    }
}
