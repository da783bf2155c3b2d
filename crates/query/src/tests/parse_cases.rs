//! `parse_where`: every form of the grammar, literal typing, refusals.

use insitu_protocol::plan::CmpOp;
use insitu_protocol::query::{Pred, Scalar};

use super::schema;
use crate::{QueryError, parse_where};

fn parse(text: &str) -> Vec<Pred> {
    parse_where(&schema(), text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

fn refused(text: &str) -> String {
    match parse_where(&schema(), text) {
        Err(e) => e.to_string(),
        Ok(p) => panic!("{text:?} parsed to {p:?}"),
    }
}

/// `col op value`.
fn cmp(col: u16, op: CmpOp, value: Scalar) -> Pred {
    Pred::Cmp { col, op, value }
}

/// `left op right`, two columns.
fn cmp_cols(left: u16, op: CmpOp, right: u16) -> Pred {
    Pred::CmpCols { left, op, right }
}

/// `col LIKE pattern` (ILIKE when `ci`).
fn like(col: u16, pattern: &str, ci: bool) -> Pred {
    Pred::Like {
        col,
        pattern: pattern.into(),
        case_insensitive: ci,
    }
}

/// `col ~ pattern` (`~*` when `ci`).
fn regex(col: u16, pattern: &str, ci: bool) -> Pred {
    Pred::Regex {
        col,
        pattern: pattern.into(),
        case_insensitive: ci,
    }
}

/// Each text parses to exactly its program.
fn assert_parses(cases: Vec<(&str, Vec<Pred>)>) {
    for (text, want) in cases {
        assert_eq!(parse(text), want, "{text:?}");
    }
}

#[test]
fn comparisons_with_literals_and_columns() {
    let decimal = Scalar::Decimal {
        value: -1250,
        scale: 2,
    };
    assert_parses(vec![
        ("q >= 5", vec![cmp(2, CmpOp::Ge, Scalar::Int(5))]),
        ("d < -12.50", vec![cmp(3, CmpOp::Lt, decimal)]),
        ("f <> 1e3", vec![cmp(5, CmpOp::Ne, Scalar::Float(1000.0))]),
        (
            "s = 'it''s'",
            vec![cmp(7, CmpOp::Eq, Scalar::Str("it's".into()))],
        ),
    ]);
    let day = insitu_rows::date::parse_date("1998-09-02").unwrap();
    let date = cmp(6, CmpOp::Le, Scalar::Date(day));
    assert_eq!(parse("dt <= DATE '1998-09-02'"), vec![date.clone()]);
    assert_eq!(
        parse("dt <= '1998-09-02'"),
        vec![date],
        "a quoted date against a date column"
    );
    assert_parses(vec![
        ("b = TRUE", vec![cmp(9, CmpOp::Eq, Scalar::Bool(true))]),
        ("i = q", vec![cmp_cols(1, CmpOp::Eq, 2)]),
        ("\"s\" != T", vec![cmp_cols(7, CmpOp::Ne, 8)]),
    ]);
}

#[test]
fn between_in_is_null_like_regex_and_their_negations() {
    let between = Pred::Between {
        col: 2,
        lo: Scalar::Int(1),
        hi: Scalar::Int(3),
    };
    let in_s = Pred::In {
        col: 7,
        values: vec![
            Scalar::Str("a".into()),
            Scalar::Str("b".into()),
            Scalar::Null,
        ],
    };
    let in_i = Pred::In {
        col: 1,
        values: vec![Scalar::Int(1)],
    };
    let is_null = Pred::IsNull { col: 8 };
    assert_parses(vec![
        ("q BETWEEN 1 AND 3", vec![between.clone()]),
        ("q NOT BETWEEN 1 AND 3", vec![between, Pred::Not]),
        ("s in ('a', 'b', NULL)", vec![in_s]),
        ("i NOT IN (1)", vec![in_i, Pred::Not]),
        ("t IS NULL", vec![is_null.clone()]),
        ("t is not null", vec![is_null, Pred::Not]),
        ("s LIKE 'a%'", vec![like(7, "a%", false)]),
        ("s NOT ILIKE '%x'", vec![like(7, "%x", true), Pred::Not]),
        ("s ~ '^a+'", vec![regex(7, "^a+", false)]),
        ("s !~* 'b'", vec![regex(7, "b", true), Pred::Not]),
    ]);
}

#[test]
fn and_binds_tighter_than_or_and_parentheses_group() {
    let a = cmp(1, CmpOp::Eq, Scalar::Int(1));
    let b = cmp(2, CmpOp::Eq, Scalar::Int(2));
    let c = Pred::IsNull { col: 7 };
    assert_eq!(
        parse("i = 1 OR q = 2 AND s IS NULL"),
        vec![a.clone(), b.clone(), c.clone(), Pred::And, Pred::Or]
    );
    assert_eq!(
        parse("(i = 1 OR q = 2) AND s IS NULL"),
        vec![a.clone(), b.clone(), Pred::Or, c.clone(), Pred::And]
    );
    assert_eq!(parse("NOT NOT i = 1"), vec![a, Pred::Not, Pred::Not]);
}

#[test]
fn bad_text_is_refused_clearly() {
    let m = refused("nope = 1");
    assert!(
        m.contains("unknown column \"nope\"") && m.contains("id, i, q, d, e, f, dt, s, t, b"),
        "{m}"
    );
    assert!(refused("q = 'x'").contains("\"q\""));
    assert!(refused("dt = '1998-13-45'").contains("not a date"));
    assert!(refused("q =").contains("expected a value"));
    assert!(refused("q = 1 2").contains("expected AND, OR or the end"));
    assert!(refused("(q = 1").contains("')'"));
    assert!(refused("s = 'open").contains("unterminated quote"));
    assert!(refused("q ? 1").contains("unexpected character"));
    assert!(refused("q NOT = 1").contains("NOT after a column"));
    assert!(refused("s LIKE 'a\\'").contains("escape character"));
    assert!(refused("").contains("empty"));
    let deep = format!("{}q = 1{}", "(".repeat(100), ")".repeat(100));
    assert!(refused(&deep).contains("nested more than 64 deep"));
    let long = vec!["q = 1"; 200].join(" AND ");
    assert!(refused(&long).contains("more than 256 steps"));
    assert!(matches!(
        parse_where(&schema(), "q = "),
        Err(QueryError::Parse(_))
    ));
}
