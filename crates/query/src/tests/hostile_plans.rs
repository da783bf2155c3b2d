//! Plans a hostile or buggy client sent. A shard compiles every typed plan
//! against the table's schema (`compile`), and what compiles runs on every
//! row of a tablet, so `compile` must refuse whatever evaluation cannot
//! run: columns past the schema, comparisons of mismatched types, stack
//! programs that underflow or leave too much, aggregates of text, extreme
//! literals, scales and limits. Plans of any shape (not the well-formed
//! ones the other properties build) are compiled; the ones accepted run
//! over valid rows through the sink to the end, as a shard runs them: an
//! error is fine, a panic is not.

use insitu_protocol::query::{
    AggFunc, AggSpec, Pred, QueryOutput, QueryPlan, Scalar, SortKey, ValueOp,
};
use proptest::prelude::*;

use super::filter_props::op;
use super::{encode, rows, schema};

/// Any column index: the schema's 10 and a few past its end.
fn col() -> BoxedStrategy<u16> {
    prop_oneof![18 => 0u16..10, 1 => 10u16..12, 1 => Just(u16::MAX)].boxed()
}

/// Any scalar, extremes included.
fn scalar() -> BoxedStrategy<Scalar> {
    prop_oneof![
        Just(Scalar::Null),
        any::<bool>().prop_map(Scalar::Bool),
        prop_oneof![any::<i64>(), -3i64..3, Just(i64::MIN), Just(i64::MAX)].prop_map(Scalar::Int),
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(-0.0)
        ]
        .prop_map(Scalar::Float),
        (any::<i64>(), prop_oneof![0u8..5, any::<u8>()])
            .prop_map(|(value, scale)| Scalar::Decimal { value, scale }),
        any::<i32>().prop_map(Scalar::Date),
        ".{0,6}".prop_map(Scalar::Str),
    ]
    .boxed()
}

fn pred() -> BoxedStrategy<Pred> {
    prop_oneof![
        3 => (col(), op(), scalar()).prop_map(|(col, op, value)| Pred::Cmp { col, op, value }),
        1 => (col(), op(), col()).prop_map(|(left, op, right)| Pred::CmpCols { left, op, right }),
        1 => (col(), scalar(), scalar()).prop_map(|(col, lo, hi)| Pred::Between { col, lo, hi }),
        1 => (col(), proptest::collection::vec(scalar(), 0..4))
            .prop_map(|(col, values)| Pred::In { col, values }),
        1 => col().prop_map(|col| Pred::IsNull { col }),
        1 => (col(), "[a%_\\\\.*(\\[]{0,6}", any::<bool>())
            .prop_map(|(col, pattern, case_insensitive)| Pred::Like { col, pattern, case_insensitive }),
        1 => (col(), "[a.*+?(\\[{\\\\]{0,6}", any::<bool>())
            .prop_map(|(col, pattern, case_insensitive)| Pred::Regex { col, pattern, case_insensitive }),
        2 => Just(Pred::And),
        2 => Just(Pred::Or),
        1 => Just(Pred::Not),
    ]
    .boxed()
}

/// A filter: any sequence of steps, or a well-formed tree of hostile leaves
/// (most random sequences are refused for their shape alone).
fn filter() -> BoxedStrategy<Vec<Pred>> {
    let leaf = pred().prop_filter("a leaf", |p| !matches!(p, Pred::And | Pred::Or | Pred::Not));
    let tree = leaf
        .prop_map(|p| vec![p])
        .prop_recursive(3, 12, 2, |inner| {
            prop_oneof![
                (
                    inner.clone(),
                    inner.clone(),
                    proptest::sample::select(vec![Pred::And, Pred::Or])
                )
                    .prop_map(|(mut a, b, join)| {
                        a.extend(b);
                        a.push(join);
                        a
                    }),
                inner.prop_map(|mut a| {
                    a.push(Pred::Not);
                    a
                }),
            ]
        });
    prop_oneof![1 => proptest::collection::vec(pred(), 0..6), 1 => Just(vec![]), 2 => tree].boxed()
}

/// A value program: any sequence of steps, or one column or literal with
/// unary and binary steps that keep one value on the stack.
fn program() -> BoxedStrategy<Vec<ValueOp>> {
    let operand =
        prop_oneof![3 => col().prop_map(ValueOp::Col), 1 => scalar().prop_map(ValueOp::Lit)];
    let shaped = (
        operand.clone(),
        proptest::collection::vec(
            (
                operand,
                proptest::sample::select(vec![ValueOp::Add, ValueOp::Sub, ValueOp::Mul]),
                any::<bool>(),
            ),
            0..3,
        ),
    )
        .prop_map(|(first, steps)| {
            let mut p = vec![first];
            for (operand, op, negate) in steps {
                p.push(operand);
                p.push(op);
                if negate {
                    p.push(ValueOp::Neg);
                }
            }
            p
        });
    prop_oneof![proptest::collection::vec(value_op(), 0..5), shaped].boxed()
}

fn value_op() -> BoxedStrategy<ValueOp> {
    prop_oneof![
        3 => col().prop_map(ValueOp::Col),
        1 => scalar().prop_map(ValueOp::Lit),
        1 => Just(ValueOp::Add),
        1 => Just(ValueOp::Sub),
        1 => Just(ValueOp::Mul),
        1 => Just(ValueOp::Neg),
    ]
    .boxed()
}

fn agg() -> BoxedStrategy<AggSpec> {
    (
        proptest::sample::select(vec![
            AggFunc::CountStar,
            AggFunc::Count,
            AggFunc::Sum,
            AggFunc::Min,
            AggFunc::Max,
            AggFunc::Avg,
        ]),
        program(),
    )
        .prop_map(|(func, arg)| AggSpec { func, arg })
        .boxed()
}

fn output() -> BoxedStrategy<QueryOutput> {
    let sort_key =
        (col(), any::<bool>(), any::<bool>()).prop_map(|(col, descending, nulls_first)| SortKey {
            col,
            descending,
            nulls_first,
        });
    prop_oneof![
        (
            proptest::collection::vec(col(), 0..4),
            proptest::collection::vec(sort_key, 0..3),
            proptest::option::of(prop_oneof![0u64..5, any::<u64>()]),
        )
            .prop_map(|(columns, order_by, limit)| QueryOutput::Rows {
                columns,
                order_by,
                limit
            }),
        (
            proptest::collection::vec(col(), 0..3),
            proptest::collection::vec(agg(), 0..4)
        )
            .prop_map(|(group_by, aggs)| QueryOutput::Aggregate { group_by, aggs }),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn any_plan_is_refused_or_runs_to_the_end(
        filter in filter(),
        output in output(),
        rows in rows(12),
    ) {
        let s = schema();
        let plan = QueryPlan { filter, output };
        let Ok(compiled) = crate::compile(&s, &plan) else { return Ok(()) };
        let mut sink = compiled.sink(1 << 20);
        for v in encode(&rows) {
            if compiled.rejects(&v) {
                continue;
            }
            let row = compiled.keep_unrejected(&v);
            prop_assert!(row.is_ok(), "a valid row refused: {:?}", row.err());
            if let Ok(Some(row)) = row {
                let _ = compiled.truth(&row);
                if sink.push(&row).is_err() {
                    break;
                }
            }
        }
        let _ = sink.finish();
    }
}
