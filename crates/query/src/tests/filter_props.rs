//! The compiled filter against the reference: random rows with NULLs,
//! random programs of every `Pred` kind.

use insitu_protocol::plan::CmpOp;
use insitu_protocol::query::{Pred, Scalar};
use insitu_protocol::schema::ColumnType;
use insitu_rows::RowRef;
use proptest::prelude::*;

use super::{float, rows, rows_plan, schema, text};
use crate::reference;

pub(super) fn op() -> BoxedStrategy<CmpOp> {
    proptest::sample::select(vec![
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ])
    .boxed()
}

/// A literal comparable with a column of type `ty` (NULL sometimes).
fn literal(ty: ColumnType) -> BoxedStrategy<Scalar> {
    let v = match ty {
        ColumnType::Int32
        | ColumnType::Int64
        | ColumnType::Decimal { .. }
        | ColumnType::Float64 => prop_oneof![
            (-5i64..6).prop_map(Scalar::Int),
            (-700i64..700, 0u8..5).prop_map(|(value, scale)| Scalar::Decimal { value, scale }),
            float().prop_map(Scalar::Float),
        ]
        .boxed(),
        ColumnType::Date32 => (-4i32..5).prop_map(Scalar::Date).boxed(),
        ColumnType::Utf8 => text().prop_map(Scalar::Str).boxed(),
        ColumnType::Bool => any::<bool>().prop_map(Scalar::Bool).boxed(),
    };
    prop_oneof![1 => Just(Scalar::Null), 8 => v].boxed()
}

fn column_and<T: std::fmt::Debug + 'static>(
    f: impl Fn(u16, ColumnType) -> BoxedStrategy<T> + 'static,
) -> BoxedStrategy<T> {
    let s = schema();
    let types: Vec<ColumnType> = s.columns.iter().map(|c| c.ty).collect();
    (0..types.len() as u16)
        .prop_flat_map(move |c| f(c, types[c as usize]))
        .boxed()
}

/// A LIKE pattern with no lone trailing backslash.
fn like_pattern() -> BoxedStrategy<String> {
    let tok = prop_oneof![
        Just("%".to_string()),
        Just("_".to_string()),
        proptest::sample::select(super::ALPHABET).prop_map(|c| c.to_string()),
        proptest::sample::select(super::ALPHABET).prop_map(|c| format!("\\{c}")),
    ];
    proptest::collection::vec(tok, 0..5)
        .prop_map(|v| v.concat())
        .boxed()
}

fn leaf() -> BoxedStrategy<Pred> {
    let text_col = proptest::sample::select(vec![7u16, 8]);
    prop_oneof![
        3 => column_and(|col, ty| (op(), literal(ty))
            .prop_map(move |(op, value)| Pred::Cmp { col, op, value })
            .boxed()),
        2 => (
            proptest::sample::select(vec![(1u16, 2u16), (1, 3), (3, 4), (2, 5), (4, 5), (7, 8), (6, 6), (9, 9), (5, 5), (0, 3), (8, 7)]),
            op()
        ).prop_map(|((left, right), op)| Pred::CmpCols { left, op, right }),
        2 => column_and(|col, ty| (literal(ty), literal(ty))
            .prop_map(move |(lo, hi)| Pred::Between { col, lo, hi })
            .boxed()),
        2 => column_and(|col, ty| proptest::collection::vec(literal(ty), 0..4)
            .prop_map(move |values| Pred::In { col, values })
            .boxed()),
        1 => (0u16..10).prop_map(|col| Pred::IsNull { col }),
        2 => (text_col.clone(), like_pattern(), any::<bool>())
            .prop_map(|(col, pattern, case_insensitive)| Pred::Like { col, pattern, case_insensitive }),
        1 => (
            text_col,
            proptest::sample::select(vec!["a", "^a", "b$", "a.b", "[aé]+", "\\.", "", "^$", "É"]),
            any::<bool>()
        ).prop_map(|(col, p, case_insensitive)| Pred::Regex { col, pattern: p.to_string(), case_insensitive }),
    ]
    .boxed()
}

/// A postfix program: a random tree of leaves under AND/OR/NOT.
pub(super) fn program() -> BoxedStrategy<Vec<Pred>> {
    leaf()
        .prop_map(|p| vec![p])
        .prop_recursive(4, 24, 2, |inner| {
            prop_oneof![
                (inner.clone(), inner.clone()).prop_map(|(mut a, b)| {
                    a.extend(b);
                    a.push(Pred::And);
                    a
                }),
                (inner.clone(), inner.clone()).prop_map(|(mut a, b)| {
                    a.extend(b);
                    a.push(Pred::Or);
                    a
                }),
                inner.prop_map(|mut a| {
                    a.push(Pred::Not);
                    a
                }),
            ]
        })
        .boxed()
}

/// A comparison of an exact column with a literal at the ends of i64
/// (bounds no value passes, or every value does).
fn extreme_cmp() -> BoxedStrategy<Pred> {
    (
        proptest::sample::select(vec![0u16, 1, 2, 3, 6]),
        op(),
        proptest::sample::select(vec![i64::MIN, i64::MIN + 1, i64::MAX - 1, i64::MAX]),
    )
        .prop_map(|(col, op, v)| Pred::Cmp {
            col,
            op,
            value: if col == 6 {
                Scalar::Date(v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32)
            } else {
                Scalar::Int(v)
            },
        })
        .boxed()
}

/// A comparison of an exact column (int, decimal, date) with a literal
/// from the rows' small range, so that ties are common: the leaves the
/// filter turns into range checks.
fn exact_cmp() -> BoxedStrategy<Pred> {
    (
        proptest::sample::select(vec![0u16, 1, 2, 3, 4, 6]),
        op(),
        -6i64..7,
    )
        .prop_map(|(col, op, v)| Pred::Cmp {
            col,
            op,
            value: match col {
                6 => Scalar::Date(v as i32),
                // The decimals' own scales (2 and 4), values near the rows'.
                3 => Scalar::Decimal {
                    value: v * 100,
                    scale: 2,
                },
                4 => Scalar::Decimal {
                    value: v * 100,
                    scale: 4,
                },
                _ => Scalar::Int(v),
            },
        })
        .boxed()
}

/// A conjunction: leaves joined by ANDs (several bounds of one column
/// merge into one range check; the rest stop at the first non-TRUE).
fn conjunction() -> BoxedStrategy<Vec<Pred>> {
    proptest::collection::vec(
        prop_oneof![4 => exact_cmp(), 3 => leaf(), 1 => extreme_cmp()],
        1..7,
    )
    .prop_map(|leaves| {
        let n = leaves.len();
        let mut prog = leaves;
        prog.extend(std::iter::repeat_n(Pred::And, n - 1));
        prog
    })
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn conjunctions_equal_the_reference_and_keep_agrees(
        prog in conjunction(),
        rows in rows(24),
    ) {
        let s = schema();
        let compiled = crate::compile(&s, &rows_plan(prog.clone())).expect("generated programs are valid");
        for (r, bytes) in rows.iter().zip(super::encode(&rows)) {
            let row = RowRef::new(compiled.layout(), &bytes).expect("encoded row");
            let want = reference::truth(&prog, r) == Some(true);
            prop_assert_eq!(compiled.filter(&row), want, "row {:?}", r);
            let kept = compiled.keep(&bytes).expect("encoded row");
            prop_assert_eq!(kept.is_some(), want, "keep, row {:?}", r);
            // The walk's first look may only reject what keep rejects,
            // and what it lets through, keep_unrejected decides as keep.
            if compiled.rejects(&bytes) {
                prop_assert!(!want, "rejects a kept row {:?}", r);
            } else {
                let rest = compiled.keep_unrejected(&bytes).expect("encoded row");
                prop_assert_eq!(rest.is_some(), want, "keep_unrejected, row {:?}", r);
            }
        }
    }

    #[test]
    fn compiled_filter_equals_the_reference_kleene_evaluation(
        prog in program(),
        rows in rows(24),
    ) {
        let s = schema();
        let compiled = crate::compile(&s, &rows_plan(prog.clone())).expect("generated programs are valid");
        for (r, bytes) in rows.iter().zip(super::encode(&rows)) {
            let row = RowRef::new(compiled.layout(), &bytes).expect("encoded row");
            let want = match reference::truth(&prog, r) {
                Some(false) => crate::filter::FALSE,
                Some(true) => crate::filter::TRUE,
                None => crate::filter::UNKNOWN,
            };
            prop_assert_eq!(compiled.truth(&row), want, "row {:?}", r);
            prop_assert_eq!(compiled.filter(&row), want == crate::filter::TRUE);
            prop_assert!(
                !(compiled.rejects(&bytes) && want == crate::filter::TRUE),
                "rejects a kept row {:?}", r
            );
        }
    }
}

/// `keep` checks a row's offset table only when the filter reads text or
/// keeps the row: a bad table in a row a fixed-column filter rejects is
/// not an error, in a kept row it is.
#[test]
fn keep_checks_the_offset_table_of_kept_rows_only() {
    let s = schema();
    let layout = insitu_rows::RowLayout::new(&s);
    let mut row = vec![Scalar::Null; s.columns.len()];
    row[0] = Scalar::Int(7);
    row[7] = Scalar::Str("ab".into());
    let mut bytes = super::encode(&[row]).remove(0);
    bytes[layout.fixed_end..layout.fixed_end + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let keep = |filter: Vec<Pred>| {
        crate::compile(&s, &rows_plan(filter))
            .expect("valid plan")
            .keep(&bytes)
            .map(|r| r.is_some())
    };
    let rejects = |filter: Vec<Pred>, bytes: &[u8]| {
        crate::compile(&s, &rows_plan(filter))
            .expect("valid plan")
            .rejects(bytes)
    };
    let id = |v: i64| Pred::Cmp {
        col: 0,
        op: CmpOp::Eq,
        value: Scalar::Int(v),
    };
    assert_eq!(keep(vec![id(8)]), Ok(false));
    assert!(keep(vec![id(7)]).is_err());
    let text = Pred::Cmp {
        col: 7,
        op: CmpOp::Eq,
        value: Scalar::Str("zz".into()),
    };
    assert!(keep(vec![text.clone()]).is_err());
    // The walk's first look (`rejects`) ends the rejected row alone; the
    // kept one, the text filter's and a row that is not a row go on to
    // `keep`, which reports them.
    assert!(rejects(vec![id(8)], &bytes));
    assert!(!rejects(vec![id(7)], &bytes));
    assert!(!rejects(vec![text], &bytes));
    assert!(!rejects(vec![id(8)], b"not a row"));
    assert!(!rejects(vec![id(8)], &bytes[..layout.fixed_end - 1]));
}
