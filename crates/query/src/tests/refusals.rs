//! Every refusal of `compile`, with its message.

use insitu_protocol::plan::CmpOp;
use insitu_protocol::query::{
    AggFunc, AggSpec, MAX_IN_LIST, MAX_PATTERN_BYTES, MAX_TOP_K, Pred, QueryOutput, QueryPlan,
    Scalar, SortKey, ValueOp,
};

use super::{rows_plan, schema};
use crate::{QueryError, compile};

/// The refusal message of a plan that must be refused.
fn refusal(plan: QueryPlan) -> String {
    match compile(&schema(), &plan) {
        Err(QueryError::Plan(m)) => m,
        Err(e) => panic!("refused with the wrong kind of error: {e}"),
        Ok(_) => panic!("accepted a bad plan: {plan:?}"),
    }
}

fn filter_refusal(filter: Vec<Pred>) -> String {
    refusal(rows_plan(filter))
}

fn assert_contains(m: &str, parts: &[&str]) {
    for p in parts {
        assert!(m.contains(p), "{m:?} does not mention {p:?}");
    }
}

fn cmp(col: u16, value: Scalar) -> Pred {
    Pred::Cmp {
        col,
        op: CmpOp::Eq,
        value,
    }
}

#[test]
fn a_column_out_of_range_is_refused_wherever_it_is_named() {
    let m = filter_refusal(vec![cmp(10, Scalar::Int(1))]);
    assert_contains(
        &m,
        &["filter step 0", "column 10 does not exist", "10 columns"],
    );
    let m = filter_refusal(vec![Pred::IsNull { col: 999 }]);
    assert_contains(&m, &["column 999"]);
    let m = filter_refusal(vec![Pred::CmpCols {
        left: 1,
        op: CmpOp::Lt,
        right: 44,
    }]);
    assert_contains(&m, &["column 44"]);
    let m = refusal(QueryPlan {
        filter: vec![],
        output: QueryOutput::Rows {
            columns: vec![0, 12],
            order_by: vec![],
            limit: None,
        },
    });
    assert_contains(&m, &["projection", "column 12"]);
    let m = refusal(QueryPlan {
        filter: vec![],
        output: QueryOutput::Rows {
            columns: vec![0],
            order_by: vec![SortKey {
                col: 13,
                descending: false,
                nulls_first: false,
            }],
            limit: Some(1),
        },
    });
    assert_contains(&m, &["ORDER BY", "column 13"]);
    let m = refusal(QueryPlan {
        filter: vec![],
        output: QueryOutput::Aggregate {
            group_by: vec![14],
            aggs: vec![],
        },
    });
    assert_contains(&m, &["GROUP BY", "column 14"]);
    let m = refusal(QueryPlan {
        filter: vec![],
        output: QueryOutput::Aggregate {
            group_by: vec![],
            aggs: vec![AggSpec {
                func: AggFunc::Sum,
                arg: vec![ValueOp::Col(15)],
            }],
        },
    });
    assert_contains(&m, &["aggregate 0", "column 15"]);
}

#[test]
fn a_literal_of_the_wrong_kind_is_refused_naming_the_column() {
    let m = filter_refusal(vec![cmp(2, Scalar::Str("abc".into()))]);
    assert_contains(&m, &["\"q\"", "int64", "\"abc\"", "text"]);
    // A date column takes a date, not text that looks like one.
    let m = filter_refusal(vec![cmp(6, Scalar::Str("2024-01-01".into()))]);
    assert_contains(&m, &["\"dt\"", "date32"]);
    let m = filter_refusal(vec![cmp(6, Scalar::Int(3))]);
    assert_contains(&m, &["\"dt\"", "a number"]);
    let m = filter_refusal(vec![cmp(7, Scalar::Int(3))]);
    assert_contains(&m, &["\"s\"", "utf8"]);
    let m = filter_refusal(vec![cmp(9, Scalar::Int(1))]);
    assert_contains(&m, &["\"b\"", "bool"]);
    let m = filter_refusal(vec![Pred::Between {
        col: 3,
        lo: Scalar::Int(1),
        hi: Scalar::Bool(true),
    }]);
    assert_contains(&m, &["\"d\"", "true"]);
    let m = filter_refusal(vec![Pred::In {
        col: 1,
        values: vec![Scalar::Int(1), Scalar::Date(2)],
    }]);
    assert_contains(&m, &["\"i\"", "a date"]);
    let m = filter_refusal(vec![cmp(
        3,
        Scalar::Decimal {
            value: 1,
            scale: 40,
        },
    )]);
    assert_contains(&m, &["40 digits after the point"]);
    let m = filter_refusal(vec![Pred::CmpCols {
        left: 7,
        op: CmpOp::Eq,
        right: 1,
    }]);
    assert_contains(&m, &["\"s\"", "\"i\""]);
    // Numbers of every kind compare with each other.
    compile(
        &schema(),
        &rows_plan(vec![cmp(
            5,
            Scalar::Decimal {
                value: 15,
                scale: 1,
            },
        )]),
    )
    .unwrap();
    compile(&schema(), &rows_plan(vec![cmp(3, Scalar::Float(1.5))])).unwrap();
    compile(
        &schema(),
        &rows_plan(vec![Pred::CmpCols {
            left: 1,
            op: CmpOp::Lt,
            right: 4,
        }]),
    )
    .unwrap();
}

#[test]
fn in_lists_and_patterns_are_bounded_and_checked() {
    let m = filter_refusal(vec![Pred::In {
        col: 2,
        values: vec![Scalar::Int(1); MAX_IN_LIST + 1],
    }]);
    assert_contains(&m, &["IN list", &format!("{}", MAX_IN_LIST + 1)]);
    let long = "a".repeat(MAX_PATTERN_BYTES + 1);
    let m = filter_refusal(vec![Pred::Like {
        col: 7,
        pattern: long.clone(),
        case_insensitive: false,
    }]);
    assert_contains(&m, &["\"s\"", "more than the limit of 4096"]);
    let m = filter_refusal(vec![Pred::Regex {
        col: 7,
        pattern: long,
        case_insensitive: false,
    }]);
    assert_contains(&m, &["more than the limit"]);
    let m = filter_refusal(vec![Pred::Regex {
        col: 8,
        pattern: "a(b".into(),
        case_insensitive: false,
    }]);
    assert_contains(&m, &["\"t\"", "not a valid regular expression"]);
    // Small text, huge program: refused by the size limit, not built.
    let m = filter_refusal(vec![Pred::Regex {
        col: 7,
        pattern: "(\\w{100}){100}".into(),
        case_insensitive: true,
    }]);
    assert_contains(&m, &["too complex"]);
    let m = filter_refusal(vec![Pred::Like {
        col: 7,
        pattern: "ab\\".into(),
        case_insensitive: false,
    }]);
    assert_contains(&m, &["ends with the escape character"]);
    let m = filter_refusal(vec![Pred::Like {
        col: 2,
        pattern: "a%".into(),
        case_insensitive: false,
    }]);
    assert_contains(&m, &["\"q\" is int64, not text"]);
}

#[test]
fn malformed_programs_are_refused() {
    let m = filter_refusal(vec![Pred::And]);
    assert_contains(&m, &["malformed", "step 0", "needs two values"]);
    let m = filter_refusal(vec![Pred::Not]);
    assert_contains(&m, &["malformed", "Not"]);
    let m = filter_refusal(vec![Pred::IsNull { col: 1 }, Pred::IsNull { col: 2 }]);
    assert_contains(&m, &["leaves 2 values"]);
    let m = filter_refusal(vec![Pred::IsNull { col: 1 }, Pred::Or]);
    assert_contains(&m, &["step 1", "needs two values"]);
    let m = filter_refusal(vec![Pred::IsNull { col: 1 }; 300]);
    assert_contains(&m, &["300 steps", "256"]);
}

fn agg_refusal(func: AggFunc, arg: Vec<ValueOp>) -> String {
    refusal(QueryPlan {
        filter: vec![],
        output: QueryOutput::Aggregate {
            group_by: vec![],
            aggs: vec![AggSpec { func, arg }],
        },
    })
}

#[test]
fn aggregate_arguments_are_type_checked() {
    assert_contains(
        &agg_refusal(AggFunc::Sum, vec![ValueOp::Col(7)]),
        &["needs a number"],
    );
    assert_contains(
        &agg_refusal(AggFunc::Avg, vec![ValueOp::Col(6)]),
        &["needs a number"],
    );
    assert_contains(
        &agg_refusal(AggFunc::CountStar, vec![ValueOp::Col(1)]),
        &["count(*) takes no argument"],
    );
    assert_contains(&agg_refusal(AggFunc::Sum, vec![]), &["needs an argument"]);
    assert_contains(
        &agg_refusal(
            AggFunc::Sum,
            vec![ValueOp::Col(7), ValueOp::Col(1), ValueOp::Add],
        ),
        &["\"s\" (utf8) cannot be used in arithmetic"],
    );
    assert_contains(
        &agg_refusal(
            AggFunc::Max,
            vec![
                ValueOp::Lit(Scalar::Str("x".into())),
                ValueOp::Col(1),
                ValueOp::Mul,
            ],
        ),
        &["cannot be used in arithmetic"],
    );
    assert_contains(
        &agg_refusal(AggFunc::Sum, vec![ValueOp::Add]),
        &["step 0", "no operand"],
    );
    assert_contains(
        &agg_refusal(AggFunc::Sum, vec![ValueOp::Col(1), ValueOp::Col(2)]),
        &["leaves 2 values"],
    );
    // decimal(12,4) multiplied by itself 10 times: scale 40.
    let mut arg = vec![ValueOp::Col(4)];
    for _ in 0..9 {
        arg.extend([ValueOp::Col(4), ValueOp::Mul]);
    }
    assert_contains(&agg_refusal(AggFunc::Sum, arg), &["digits after the point"]);
    assert_contains(
        &agg_refusal(AggFunc::Sum, vec![ValueOp::Col(1); 65]),
        &["65 steps"],
    );
    let m = refusal(QueryPlan {
        filter: vec![],
        output: QueryOutput::Aggregate {
            group_by: vec![],
            aggs: vec![
                AggSpec {
                    func: AggFunc::CountStar,
                    arg: vec![]
                };
                65
            ],
        },
    });
    assert_contains(&m, &["65 aggregates"]);
    // Any comparable type is fine for min/max/count.
    for func in [AggFunc::Min, AggFunc::Max, AggFunc::Count] {
        for c in 0..10 {
            compile(
                &schema(),
                &QueryPlan {
                    filter: vec![],
                    output: QueryOutput::Aggregate {
                        group_by: vec![],
                        aggs: vec![AggSpec {
                            func,
                            arg: vec![ValueOp::Col(c)],
                        }],
                    },
                },
            )
            .unwrap();
        }
    }
}

#[test]
fn top_k_needs_a_bounded_limit() {
    let key = SortKey {
        col: 1,
        descending: true,
        nulls_first: false,
    };
    let m = refusal(QueryPlan {
        filter: vec![],
        output: QueryOutput::Rows {
            columns: vec![0],
            order_by: vec![key],
            limit: Some(MAX_TOP_K + 1),
        },
    });
    assert_contains(&m, &["LIMIT 100001", "100000"]);
    let m = refusal(QueryPlan {
        filter: vec![],
        output: QueryOutput::Rows {
            columns: vec![0],
            order_by: vec![key],
            limit: None,
        },
    });
    assert_contains(&m, &["ORDER BY without LIMIT"]);
}

#[test]
fn a_bad_schema_is_refused() {
    let mut s = schema();
    s.key = vec![];
    match compile(&s, &rows_plan(vec![])) {
        Err(QueryError::Plan(m)) => assert_contains(&m, &["schema is invalid", "primary key"]),
        _ => panic!("a schema without a key was accepted"),
    }
}
