//! Filter and aggregate-argument translation: every `Pred` form, operand
//! order, NULL handling and the refusals that keep pushdown exact.

use std::sync::Arc;

use arrow_schema::{DataType, Field};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::expr::{Cast, InList, Like, ScalarFunction};
use datafusion::logical_expr::{Expr, Operator, binary_expr};
use datafusion::prelude::{col, lit};
use insitu_protocol::plan::CmpOp;
use insitu_protocol::query::{Pred, Scalar, ValueOp};
use insitu_protocol::schema::{Column, ColumnType, Schema};
use insitu_sql::translate::{filter_to_preds, value_program};

fn schema() -> Schema {
    let c = |name: &str, ty| Column::new(name, ty, true);
    let decimal = |name: &str, scale| {
        c(
            name,
            ColumnType::Decimal {
                precision: 15,
                scale,
            },
        )
    };
    let mut s = Schema {
        columns: vec![
            c("i", ColumnType::Int64),
            c("s", ColumnType::Int32),
            decimal("d", 2),
            c("f", ColumnType::Float64),
            c("t", ColumnType::Utf8),
            c("dt", ColumnType::Date32),
            c("b", ColumnType::Bool),
            decimal("e", 3),
        ],
        key: vec![0],
    };
    s.columns[0].nullable = false;
    s
}

/// `col op value`.
fn cmp(col: u16, op: CmpOp, value: Scalar) -> Pred {
    Pred::Cmp { col, op, value }
}

fn ok(e: Expr) -> Vec<Pred> {
    filter_to_preds(&e, &schema()).unwrap_or_else(|r| panic!("{e}: {r}"))
}

fn refused(e: Expr) {
    assert!(
        filter_to_preds(&e, &schema()).is_err(),
        "{e} should not be pushed"
    );
}

fn dec(v: i128, p: u8, s: i8) -> Expr {
    lit(ScalarValue::Decimal128(Some(v), p, s))
}

fn cast(e: Expr, t: DataType) -> Expr {
    Expr::Cast(Cast {
        expr: Box::new(e),
        field: Arc::new(Field::new("", t, true)),
    })
}

#[test]
fn comparisons_both_orders() {
    assert_eq!(
        ok(col("i").gt(lit(5i64))),
        vec![cmp(0, CmpOp::Gt, Scalar::Int(5))]
    );
    // 5 > i is i < 5.
    assert_eq!(
        ok(lit(5i64).gt(col("i"))),
        vec![cmp(0, CmpOp::Lt, Scalar::Int(5))]
    );
    for (op, want) in [
        (Operator::Eq, CmpOp::Eq),
        (Operator::NotEq, CmpOp::Ne),
        (Operator::LtEq, CmpOp::Ge),
        (Operator::GtEq, CmpOp::Le),
        (Operator::Lt, CmpOp::Gt),
    ] {
        assert_eq!(
            ok(binary_expr(lit(1i64), op, col("i"))),
            vec![cmp(0, want, Scalar::Int(1))]
        );
    }
}

#[test]
fn literals_take_the_column_type_exactly() {
    assert_eq!(
        ok(col("d").lt(dec(2400, 15, 2))),
        vec![cmp(
            2,
            CmpOp::Lt,
            Scalar::Decimal {
                value: 2400,
                scale: 2
            }
        )]
    );
    // 0.5 at scale 1 is 50 at the column's scale 2.
    assert_eq!(
        ok(col("d").eq(dec(5, 2, 1))),
        vec![cmp(
            2,
            CmpOp::Eq,
            Scalar::Decimal {
                value: 50,
                scale: 2
            }
        )]
    );
    // 0.005 is not a decimal(15,2) value: refused, not rounded.
    refused(col("d").lt(dec(5, 4, 3)));
    assert_eq!(
        ok(col("dt").gt_eq(lit(ScalarValue::Date32(Some(100))))),
        vec![cmp(5, CmpOp::Ge, Scalar::Date(100))]
    );
    assert_eq!(
        ok(col("t").eq(lit("x"))),
        vec![cmp(4, CmpOp::Eq, Scalar::Str("x".into()))]
    );
    assert_eq!(
        ok(col("t").eq(lit(ScalarValue::Utf8View(Some("x".into()))))),
        ok(col("t").eq(lit("x")))
    );
    assert_eq!(
        ok(col("f").gt(lit(1.5f64))),
        vec![cmp(3, CmpOp::Gt, Scalar::Float(1.5))]
    );
    // NaN orders differently in Arrow and IEEE: kept in DataFusion.
    refused(col("f").gt(lit(f64::NAN)));
    // A NULL literal and mismatched families stay in DataFusion.
    refused(col("i").eq(lit(ScalarValue::Int64(None))));
    refused(col("i").eq(lit("5")));
    refused(col("t").eq(lit(5i64)));
    refused(lit(1i64).eq(lit(1i64)));
}

#[test]
fn casts_unwrapped_only_when_widening_in_one_family() {
    // int32 -> int64 keeps every comparison.
    assert_eq!(
        ok(cast(col("s"), DataType::Int64).lt(lit(5_000_000_000i64))),
        vec![cmp(1, CmpOp::Lt, Scalar::Int(5_000_000_000))]
    );
    // decimal(15,2) -> decimal(20,4) keeps every comparison; the literal is
    // brought back to the column's scale.
    assert_eq!(
        ok(cast(col("d"), DataType::Decimal128(20, 4)).gt(dec(12300, 20, 4))),
        vec![cmp(
            2,
            CmpOp::Gt,
            Scalar::Decimal {
                value: 123,
                scale: 2
            }
        )]
    );
    // Narrowing and cross-family casts change results: refused.
    refused(cast(col("i"), DataType::Int32).lt(lit(5i32)));
    refused(cast(col("d"), DataType::Decimal128(10, 1)).lt(dec(5, 10, 1)));
    refused(cast(col("d"), DataType::Float64).lt(lit(0.5f64)));
    refused(cast(col("s"), DataType::Float64).lt(lit(0.5f64)));
    refused(cast(col("t"), DataType::Int64).lt(lit(5i64)));
}

#[test]
fn column_comparisons() {
    assert_eq!(
        ok(col("s").lt(col("i"))),
        vec![Pred::CmpCols {
            left: 1,
            op: CmpOp::Lt,
            right: 0
        }]
    );
    // Two decimals of different scales: not pushed.
    refused(col("d").eq(col("e")));
    refused(col("t").eq(col("i")));
}

#[test]
fn between_in_null_and_logic() {
    assert_eq!(
        ok(col("i").between(lit(1i64), lit(9i64))),
        vec![Pred::Between {
            col: 0,
            lo: Scalar::Int(1),
            hi: Scalar::Int(9)
        }]
    );
    assert_eq!(
        ok(col("i").not_between(lit(1i64), lit(9i64))),
        vec![
            Pred::Between {
                col: 0,
                lo: Scalar::Int(1),
                hi: Scalar::Int(9)
            },
            Pred::Not
        ]
    );
    refused(col("i").between(col("s"), lit(9i64)));
    assert_eq!(
        ok(col("s").in_list(vec![lit(1i32), lit(2i32)], true)),
        vec![
            Pred::In {
                col: 1,
                values: vec![Scalar::Int(1), Scalar::Int(2)]
            },
            Pred::Not
        ]
    );
    // A NULL in the list makes NOT IN never true: left to DataFusion.
    refused(col("s").in_list(vec![lit(1i32), lit(ScalarValue::Int32(None))], true));
    refused(Expr::InList(InList::new(Box::new(col("s")), vec![], false)));
    refused(col("s").in_list(vec![col("i")], false));
    assert_eq!(ok(col("t").is_null()), vec![Pred::IsNull { col: 4 }]);
    assert_eq!(
        ok(col("t").is_not_null()),
        vec![Pred::IsNull { col: 4 }, Pred::Not]
    );
    refused(col("t").is_true());
    assert_eq!(
        ok(col("i").gt(lit(1i64)).and(col("t").is_null().or(!col("b")))),
        vec![
            cmp(0, CmpOp::Gt, Scalar::Int(1)),
            Pred::IsNull { col: 4 },
            cmp(6, CmpOp::Eq, Scalar::Bool(true)),
            Pred::Not,
            Pred::Or,
            Pred::And,
        ]
    );
    // A bare non-boolean column is not a predicate.
    refused(col("i"));
    // One untranslatable side refuses the whole conjunction.
    refused(
        col("i")
            .gt(lit(1i64))
            .and((col("i") % lit(2i64)).eq(lit(0i64))),
    );
}

#[test]
fn like_and_regex() {
    let like = |negated, pattern: &str, escape, ci| {
        Expr::Like(Like::new(
            negated,
            Box::new(col("t")),
            Box::new(lit(pattern)),
            escape,
            ci,
        ))
    };
    assert_eq!(
        ok(like(false, "a%", None, false)),
        vec![Pred::Like {
            col: 4,
            pattern: "a%".into(),
            case_insensitive: false
        }]
    );
    assert_eq!(
        ok(like(true, "a\\%", Some('\\'), true)),
        vec![
            Pred::Like {
                col: 4,
                pattern: "a\\%".into(),
                case_insensitive: true
            },
            Pred::Not
        ]
    );
    refused(like(false, "a!%", Some('!'), false));
    refused(like(false, &"x".repeat(5000), None, false));
    refused(Expr::Like(Like::new(
        false,
        Box::new(col("i")),
        Box::new(lit("1%")),
        None,
        false,
    )));
    refused(Expr::Like(Like::new(
        false,
        Box::new(col("t")),
        Box::new(col("t")),
        None,
        false,
    )));
    assert_eq!(
        ok(binary_expr(col("t"), Operator::RegexIMatch, lit("^b"))),
        vec![Pred::Regex {
            col: 4,
            pattern: "^b".into(),
            case_insensitive: true
        }]
    );
    assert_eq!(
        ok(binary_expr(col("t"), Operator::RegexNotMatch, lit("x"))),
        vec![
            Pred::Regex {
                col: 4,
                pattern: "x".into(),
                case_insensitive: false
            },
            Pred::Not
        ]
    );
    let f = datafusion::functions::regex::regexp_like();
    let call = |args| Expr::ScalarFunction(ScalarFunction::new_udf(f.clone(), args));
    assert_eq!(
        ok(call(vec![col("t"), lit("a+"), lit("i")])),
        vec![Pred::Regex {
            col: 4,
            pattern: "a+".into(),
            case_insensitive: true
        }]
    );
    refused(call(vec![col("t"), lit("a+"), lit("s")]));
    refused(binary_expr(
        col("t"),
        Operator::RegexMatch,
        lit("x".repeat(5000)),
    ));
}

#[test]
fn aggregate_arguments() {
    let s = schema();
    let p = value_program(&(col("d") * (lit(1i64) - col("d"))), &s).unwrap();
    assert_eq!(
        p.ops,
        vec![
            ValueOp::Col(2),
            ValueOp::Lit(Scalar::Int(1)),
            ValueOp::Col(2),
            ValueOp::Sub,
            ValueOp::Mul
        ]
    );
    assert_eq!(p.scale, Some(4));
    assert!(!p.integer);
    let p = value_program(&(-col("s") + col("i")), &s).unwrap();
    assert_eq!(
        p.ops,
        vec![ValueOp::Col(1), ValueOp::Neg, ValueOp::Col(0), ValueOp::Add]
    );
    assert_eq!((p.scale, p.integer), (Some(0), true));
    let p = value_program(&(col("f") * lit(2i64)), &s).unwrap();
    assert_eq!(p.scale, None);
    assert_eq!(
        value_program(&col("t"), &s).unwrap().column,
        Some(ColumnType::Utf8)
    );
    assert!(value_program(&(col("t") + lit(1i64)), &s).is_err());
    assert!(value_program(&(col("i") / lit(2i64)), &s).is_err());
    assert!(value_program(&cast(col("i"), DataType::Float64), &s).is_err());
}
