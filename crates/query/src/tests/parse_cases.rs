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

#[test]
fn comparisons_with_literals_and_columns() {
    assert_eq!(
        parse("q >= 5"),
        vec![Pred::Cmp {
            col: 2,
            op: CmpOp::Ge,
            value: Scalar::Int(5)
        }]
    );
    assert_eq!(
        parse("d < -12.50"),
        vec![Pred::Cmp {
            col: 3,
            op: CmpOp::Lt,
            value: Scalar::Decimal {
                value: -1250,
                scale: 2
            }
        }]
    );
    assert_eq!(
        parse("f <> 1e3"),
        vec![Pred::Cmp {
            col: 5,
            op: CmpOp::Ne,
            value: Scalar::Float(1000.0)
        }]
    );
    assert_eq!(
        parse("s = 'it''s'"),
        vec![Pred::Cmp {
            col: 7,
            op: CmpOp::Eq,
            value: Scalar::Str("it's".into())
        }]
    );
    let day = insitu_rows::date::parse_date("1998-09-02").unwrap();
    let date = Pred::Cmp {
        col: 6,
        op: CmpOp::Le,
        value: Scalar::Date(day),
    };
    assert_eq!(parse("dt <= DATE '1998-09-02'"), vec![date.clone()]);
    assert_eq!(
        parse("dt <= '1998-09-02'"),
        vec![date],
        "a quoted date against a date column"
    );
    assert_eq!(
        parse("b = TRUE"),
        vec![Pred::Cmp {
            col: 9,
            op: CmpOp::Eq,
            value: Scalar::Bool(true)
        }]
    );
    assert_eq!(
        parse("i = q"),
        vec![Pred::CmpCols {
            left: 1,
            op: CmpOp::Eq,
            right: 2
        }]
    );
    assert_eq!(
        parse("\"s\" != T"),
        vec![Pred::CmpCols {
            left: 7,
            op: CmpOp::Ne,
            right: 8
        }]
    );
}

#[test]
fn between_in_is_null_like_regex_and_their_negations() {
    assert_eq!(
        parse("q BETWEEN 1 AND 3"),
        vec![Pred::Between {
            col: 2,
            lo: Scalar::Int(1),
            hi: Scalar::Int(3)
        }]
    );
    assert_eq!(
        parse("q NOT BETWEEN 1 AND 3"),
        vec![
            Pred::Between {
                col: 2,
                lo: Scalar::Int(1),
                hi: Scalar::Int(3)
            },
            Pred::Not
        ]
    );
    assert_eq!(
        parse("s in ('a', 'b', NULL)"),
        vec![Pred::In {
            col: 7,
            values: vec![
                Scalar::Str("a".into()),
                Scalar::Str("b".into()),
                Scalar::Null
            ]
        }]
    );
    assert_eq!(
        parse("i NOT IN (1)"),
        vec![
            Pred::In {
                col: 1,
                values: vec![Scalar::Int(1)]
            },
            Pred::Not
        ]
    );
    assert_eq!(parse("t IS NULL"), vec![Pred::IsNull { col: 8 }]);
    assert_eq!(
        parse("t is not null"),
        vec![Pred::IsNull { col: 8 }, Pred::Not]
    );
    assert_eq!(
        parse("s LIKE 'a%'"),
        vec![Pred::Like {
            col: 7,
            pattern: "a%".into(),
            case_insensitive: false
        }]
    );
    assert_eq!(
        parse("s NOT ILIKE '%x'"),
        vec![
            Pred::Like {
                col: 7,
                pattern: "%x".into(),
                case_insensitive: true
            },
            Pred::Not
        ]
    );
    assert_eq!(
        parse("s ~ '^a+'"),
        vec![Pred::Regex {
            col: 7,
            pattern: "^a+".into(),
            case_insensitive: false
        }]
    );
    assert_eq!(
        parse("s !~* 'b'"),
        vec![
            Pred::Regex {
                col: 7,
                pattern: "b".into(),
                case_insensitive: true
            },
            Pred::Not
        ]
    );
}

#[test]
fn and_binds_tighter_than_or_and_parentheses_group() {
    let a = Pred::Cmp {
        col: 1,
        op: CmpOp::Eq,
        value: Scalar::Int(1),
    };
    let b = Pred::Cmp {
        col: 2,
        op: CmpOp::Eq,
        value: Scalar::Int(2),
    };
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
