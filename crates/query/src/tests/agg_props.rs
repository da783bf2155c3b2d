//! Grouped aggregates and top-k over random rows split at random into
//! "tablets" (each its own sink), merged as a client merges them, against
//! the reference over all rows at once.

use insitu_protocol::plan::CmpOp;
use insitu_protocol::query::{
    AggFunc, AggSpec, Pred, QueryData, QueryOutput, QueryPlan, Scalar, SortKey, ValueOp,
};
use insitu_rows::RowRef;
use insitu_rows::arrow::{batch_row, from_ipc};
use proptest::prelude::*;

use super::{rows, schema};
use crate::reference::{self, Answer};
use crate::value::sort_cmp;

/// Values equal for the test: exact kinds equal, floats equal within a
/// relative 1e-9 (sums differ in rounding with the order of addition) or
/// both NaN.
fn close(a: &Scalar, b: &Scalar) -> bool {
    match (a, b) {
        (Scalar::Float(x), Scalar::Float(y)) => {
            (x.is_nan() && y.is_nan())
                || x == y
                || (x.is_finite()
                    && y.is_finite()
                    && (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0))
        }
        _ => a == b,
    }
}

pub(super) fn agg() -> BoxedStrategy<AggSpec> {
    let col = |c: u16| vec![ValueOp::Col(c)];
    let numeric_args = vec![
        col(1),
        col(2),
        col(3),
        col(4),
        col(5),
        vec![ValueOp::Col(3), ValueOp::Col(4), ValueOp::Mul],
        // Starts with the program above (computed from its value).
        vec![
            ValueOp::Col(3),
            ValueOp::Col(4),
            ValueOp::Mul,
            ValueOp::Col(2),
            ValueOp::Add,
        ],
        vec![ValueOp::Col(1), ValueOp::Lit(Scalar::Int(2)), ValueOp::Add],
        vec![
            ValueOp::Col(3),
            ValueOp::Lit(Scalar::Decimal { value: 1, scale: 1 }),
            ValueOp::Sub,
            ValueOp::Col(2),
            ValueOp::Mul,
        ],
        vec![ValueOp::Col(5), ValueOp::Col(1), ValueOp::Add],
        vec![ValueOp::Col(2), ValueOp::Neg],
        vec![ValueOp::Col(4), ValueOp::Col(3), ValueOp::Sub, ValueOp::Neg],
        vec![ValueOp::Lit(Scalar::Null), ValueOp::Col(1), ValueOp::Add],
    ];
    let any_args: Vec<Vec<ValueOp>> = (0..10).map(col).chain(numeric_args.clone()).collect();
    prop_oneof![
        Just(AggSpec {
            func: AggFunc::CountStar,
            arg: vec![]
        }),
        proptest::sample::select(any_args.clone()).prop_map(|arg| AggSpec {
            func: AggFunc::Count,
            arg
        }),
        (
            proptest::sample::select(vec![AggFunc::Sum, AggFunc::Avg]),
            proptest::sample::select(numeric_args)
        )
            .prop_map(|(func, arg)| AggSpec { func, arg }),
        (
            proptest::sample::select(vec![AggFunc::Min, AggFunc::Max]),
            proptest::sample::select(any_args)
        )
            .prop_map(|(func, arg)| AggSpec { func, arg }),
    ]
    .boxed()
}

/// Rows with distinct ids, each given a tablet (0..3).
fn split_rows() -> BoxedStrategy<(Vec<Vec<Scalar>>, Vec<usize>)> {
    rows(40)
        .prop_flat_map(|rows| {
            let n = rows.len();
            (Just(rows), proptest::collection::vec(0usize..3, n))
        })
        .prop_map(|(mut rows, tablets)| {
            for (i, r) in rows.iter_mut().enumerate() {
                r[0] = Scalar::Int(i as i64);
            }
            (rows, tablets)
        })
        .boxed()
}

fn filter() -> BoxedStrategy<Vec<Pred>> {
    prop_oneof![
        Just(vec![]),
        Just(vec![Pred::Cmp {
            col: 2,
            op: CmpOp::Ge,
            value: Scalar::Int(0)
        }]),
        Just(vec![Pred::IsNull { col: 7 }, Pred::Not]),
    ]
    .boxed()
}

/// Each tablet's sink answer for `plan` over its rows.
fn tablet_answers(plan: &QueryPlan, rows: &[Vec<Scalar>], tablets: &[usize]) -> Vec<QueryData> {
    let s = schema();
    let bytes = super::encode(rows);
    (0..3)
        .map(|t| {
            let compiled = crate::compile(&s, plan).expect("valid plan");
            let mut sink = compiled.sink(usize::MAX);
            for (b, _) in bytes.iter().zip(tablets).filter(|(_, tt)| **tt == t) {
                let row = RowRef::new(compiled.layout(), b).expect("row");
                if compiled.filter(&row) {
                    sink.push(&row).expect("push");
                }
            }
            sink.finish().expect("finish")
        })
        .collect()
}

fn key_order(n: usize) -> impl Fn(&Vec<Scalar>, &Vec<Scalar>) -> std::cmp::Ordering {
    move |a, b| {
        for i in 0..n {
            let o = sort_cmp(&a[i], &b[i], false, true);
            if o.is_ne() {
                return o;
            }
        }
        std::cmp::Ordering::Equal
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn merged_tablet_aggregates_equal_the_reference(
        (rows, tablets) in split_rows(),
        // [7, 8] and [7, 8, 2]: keys that fit 16 bytes packed and keys that
        // do not, in one tablet (`agg.rs` keeps the two apart).
        group_by in proptest::sample::select(vec![vec![], vec![1u16], vec![6], vec![7], vec![9], vec![3], vec![5], vec![1, 9], vec![7, 6], vec![7, 8], vec![7, 8, 2]]),
        // Up to 6: repeats (sum and avg of one argument) and programs that
        // start with another are common.
        aggs in proptest::collection::vec(agg(), 1..7),
        filter in filter(),
    ) {
        let s = schema();
        let plan = QueryPlan { filter, output: QueryOutput::Aggregate { group_by: group_by.clone(), aggs } };
        let parts = tablet_answers(&plan, &rows, &tablets)
            .into_iter()
            .map(|d| match d {
                QueryData::Groups(g) => g,
                QueryData::Rows(_) => panic!("an aggregate answers groups"),
            })
            .collect();
        let merged = crate::merge_groups(&plan, parts).expect("merge");
        let batch = crate::finalize_groups(&s, &plan, &merged).expect("finalize");
        let mut got: Vec<Vec<Scalar>> = (0..batch.num_rows()).map(|i| batch_row(&batch, i).expect("row")).collect();
        let Answer::Groups(mut want) = reference::run(&s, &plan, &rows).expect("reference") else {
            panic!("groups")
        };
        got.sort_by(key_order(group_by.len()));
        want.sort_by(key_order(group_by.len()));
        prop_assert_eq!(got.len(), want.len(), "groups {:?} vs {:?}", got, want);
        for (g, w) in got.iter().zip(&want) {
            prop_assert!(g.len() == w.len() && g.iter().zip(w).all(|(a, b)| close(a, b)), "{:?} vs {:?}", g, w);
        }
    }

    #[test]
    fn merged_tablet_top_k_equals_the_reference_sort_and_limit(
        (rows, tablets) in split_rows(),
        columns in proptest::collection::vec(0u16..10, 0..4),
        keys in proptest::collection::vec((0u16..10, any::<bool>(), any::<bool>()), 0..3),
        limit in 0u64..12,
        filter in filter(),
    ) {
        let s = schema();
        // The unique id last makes the order total, so the rows kept are
        // exactly determined.
        let order_by: Vec<SortKey> = keys
            .into_iter()
            .map(|(col, descending, nulls_first)| SortKey { col, descending, nulls_first })
            .chain([SortKey { col: 0, descending: false, nulls_first: false }])
            .collect();
        let plan = QueryPlan { filter, output: QueryOutput::Rows { columns: columns.clone(), order_by, limit: Some(limit) } };
        let mut batches = Vec::new();
        for d in tablet_answers(&plan, &rows, &tablets) {
            let QueryData::Rows(ipc) = d else { panic!("rows") };
            batches.extend(from_ipc(&ipc).expect("ipc"));
        }
        let out = crate::merge_top_k(&s, &plan, batches).expect("merge");
        prop_assert_eq!(out.len(), 1);
        prop_assert_eq!(out[0].num_columns(), columns.len());
        let got: Vec<Vec<Scalar>> = (0..out[0].num_rows()).map(|i| batch_row(&out[0], i).expect("row")).collect();
        let Answer::Rows(want) = reference::run(&s, &plan, &rows).expect("reference") else { panic!("rows") };
        prop_assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            prop_assert!(g.iter().zip(w).all(|(a, b)| close(a, b)), "{:?} vs {:?}", g, w);
        }
    }
}

/// More rows than a batch takes (`agg_fast.rs` BATCH_ROWS), with NULLs in
/// some arguments (the general path) and repeats and continued programs
/// among the aggregates, against the reference; and a sink reset half-way
/// (a restarted scan) forgets the rows it had batched.
#[test]
fn batched_aggregates_over_many_rows_equal_the_reference() {
    use ValueOp::*;
    let n = 2500i64;
    let rows: Vec<Vec<Scalar>> = (0..n)
        .map(|i| {
            let null_every = |k: i64, v: Scalar| if i % k == 0 { Scalar::Null } else { v };
            vec![
                Scalar::Int(i),
                null_every(13, Scalar::Int(i % 7 - 3)),
                Scalar::Int(i % 5 * 1_000_000_007),
                null_every(
                    17,
                    Scalar::Decimal {
                        value: (i * 37) % 1200 - 600,
                        scale: 2,
                    },
                ),
                Scalar::Decimal {
                    value: (i * 11) % 9000,
                    scale: 4,
                },
                Scalar::Float(0.5),
                Scalar::Date((i % 3) as i32),
                Scalar::Str(["a", "b", "é"][(i % 3) as usize].into()),
                null_every(5, Scalar::Str("t".into())),
                Scalar::Bool(i % 2 == 0),
            ]
        })
        .collect();
    let program = vec![Col(3), Lit(Scalar::Int(1)), Sub, Col(2), Mul];
    let mut continued = program.clone();
    continued.extend([Col(4), Add]);
    let agg = |func, arg: &Vec<ValueOp>| AggSpec {
        func,
        arg: arg.clone(),
    };
    let aggs = vec![
        agg(AggFunc::Sum, &vec![Col(2)]),
        agg(AggFunc::Avg, &vec![Col(2)]),
        agg(AggFunc::Sum, &program),
        agg(AggFunc::Sum, &continued),
        agg(AggFunc::Avg, &continued),
        agg(AggFunc::Count, &vec![Col(1)]),
        agg(AggFunc::Sum, &vec![Col(1)]),
        agg(AggFunc::CountStar, &vec![]),
    ];
    let s = schema();
    for group_by in [vec![], vec![7u16, 8], vec![6]] {
        let plan = QueryPlan {
            filter: vec![],
            output: QueryOutput::Aggregate {
                group_by: group_by.clone(),
                aggs: aggs.clone(),
            },
        };
        let compiled = crate::compile(&s, &plan).expect("valid plan");
        let bytes = super::encode(&rows);
        let mut sink = compiled.sink(usize::MAX);
        for b in &bytes[..1500] {
            sink.push(&RowRef::new(compiled.layout(), b).expect("row"))
                .expect("push");
        }
        sink.reset();
        for b in &bytes {
            sink.push(&RowRef::new(compiled.layout(), b).expect("row"))
                .expect("push");
        }
        let QueryData::Groups(part) = sink.finish().expect("finish") else {
            panic!("groups")
        };
        let merged = crate::merge_groups(&plan, vec![part]).expect("merge");
        let batch = crate::finalize_groups(&s, &plan, &merged).expect("finalize");
        let mut got: Vec<Vec<Scalar>> = (0..batch.num_rows())
            .map(|i| batch_row(&batch, i).expect("row"))
            .collect();
        let Answer::Groups(mut want) = reference::run(&s, &plan, &rows).expect("reference") else {
            panic!("groups")
        };
        got.sort_by(key_order(group_by.len()));
        want.sort_by(key_order(group_by.len()));
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!(g.iter().zip(w).all(|(a, b)| close(a, b)), "{g:?} vs {w:?}");
        }
    }
}
