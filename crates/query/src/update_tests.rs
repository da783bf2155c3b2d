//! Typed updates against a model: the new row equals the old one with the
//! one column replaced by the value computed over `Scalar`s; refusals name
//! what is wrong.

use insitu_protocol::plan::{CmpOp, RowAction};
use insitu_protocol::query::{Pred, Scalar};
use insitu_rows::{RowLayout, RowRef};
use proptest::prelude::*;

use super::RowUpdate;
use crate::reference;
use crate::tests::{encode, row, schema};

fn decode(bytes: &[u8]) -> Vec<Scalar> {
    let s = schema();
    let layout = RowLayout::new(&s);
    let row = RowRef::new(&layout, bytes).expect("an encoded row decodes");
    (0..s.columns.len())
        .map(|c| row.scalar(c).expect("decodes"))
        .collect()
}

fn col(name: &str) -> u16 {
    schema()
        .column_index(name)
        .expect("column of the test schema") as u16
}

fn update(filter: &[Pred], name: &str, action: RowAction) -> RowUpdate {
    RowUpdate::compile(&schema(), filter, &[(col(name), action)]).expect("a valid update")
}

fn refusal(name: &str, action: RowAction) -> String {
    match RowUpdate::compile(&schema(), &[], &[(col(name), action.clone())]) {
        Ok(_) => panic!("{name} {action:?} was accepted"),
        Err(e) => e.to_string(),
    }
}

/// The model: what the column becomes (every matching row is written).
fn model(current: &Scalar, action: &RowAction) -> Option<Scalar> {
    match (action, current) {
        (RowAction::Set(v), _) => Some(v.clone()),
        (RowAction::Add(_), Scalar::Null) => Some(Scalar::Null),
        (RowAction::Add(Scalar::Int(d)), Scalar::Int(a)) => Some(Scalar::Int(a + d)),
        (RowAction::Add(Scalar::Int(d)), Scalar::Date(a)) => Some(Scalar::Date(a + *d as i32)),
        (
            RowAction::Add(Scalar::Decimal { value: d, scale: 2 }),
            Scalar::Decimal { value, scale: 2 },
        ) => Some(Scalar::Decimal {
            value: value + d,
            scale: 2,
        }),
        (RowAction::Add(Scalar::Float(d)), Scalar::Float(a)) => Some(Scalar::Float(a + d)),
        other => panic!("no model for {other:?}"),
    }
}

fn same(a: &Scalar, b: &Scalar) -> bool {
    match (a, b) {
        (Scalar::Float(x), Scalar::Float(y)) => {
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
        }
        _ => a == b,
    }
}

fn actions() -> BoxedStrategy<(&'static str, RowAction)> {
    prop_oneof![
        (-3i64..4).prop_map(|v| ("q", RowAction::Set(Scalar::Int(v)))),
        (-3i64..4).prop_map(|d| ("q", RowAction::Add(Scalar::Int(d)))),
        (-3i64..4).prop_map(|d| ("i", RowAction::Add(Scalar::Int(d)))),
        (-3i64..4).prop_map(|d| ("dt", RowAction::Add(Scalar::Int(d)))),
        (-300i64..300).prop_map(|d| ("d", RowAction::Add(Scalar::Decimal { value: d, scale: 2 }))),
        (-3i64..4).prop_map(|d| ("f", RowAction::Add(Scalar::Float(d as f64 / 4.0)))),
        "[a-c]{0,6}".prop_map(|s| ("s", RowAction::Set(Scalar::Str(s)))),
        Just(("t", RowAction::Set(Scalar::Null))),
        Just(("b", RowAction::Set(Scalar::Bool(true)))),
    ]
    .boxed()
}

proptest! {
    /// Every row: written exactly when the filter is true, and then equal to the old row with the one column changed.
    #[test]
    fn an_update_changes_exactly_its_column_of_matching_rows(
        rows in proptest::collection::vec(row(), 1..20),
        (name, action) in actions(),
        bound in -3i64..4,
    ) {
        let filter = vec![Pred::Cmp { col: col("i"), op: CmpOp::Lt, value: Scalar::Int(bound) }];
        let u = update(&filter, name, action.clone());
        let c = col(name) as usize;
        for (scalars, bytes) in rows.iter().zip(encode(&rows)) {
            let got = u.apply(&bytes).expect("every generated row takes a small change");
            let passes = reference::truth(&filter, scalars) == Some(true);
            let want = if passes { model(&scalars[c], &action) } else { None };
            match (got, want) {
                (None, None) => {}
                (Some(new), Some(v)) => {
                    let new = decode(&new);
                    for (i, (a, b)) in new.iter().zip(scalars).enumerate() {
                        let expect = if i == c { &v } else { b };
                        prop_assert!(same(a, expect), "column {i}: {a:?} != {expect:?}");
                    }
                }
                (got, want) => prop_assert!(false, "got {got:?}, want {want:?}"),
            }
        }
    }
}

#[test]
fn adds_out_of_the_columns_range_are_refused_for_the_row() {
    let mut r: Vec<Scalar> = vec![Scalar::Null; schema().columns.len()];
    r[0] = Scalar::Int(1);
    r[col("i") as usize] = Scalar::Int(i32::MAX as i64);
    r[col("q") as usize] = Scalar::Int(i64::MIN);
    r[col("d") as usize] = Scalar::Decimal {
        value: 999_999_999,
        scale: 2,
    };
    r[col("f") as usize] = Scalar::Float(f64::MAX);
    let bytes = &encode(&[r])[0];
    let cases = [
        ("i", Scalar::Int(1), "out of int32's range"),
        ("q", Scalar::Int(-1), "out of int64's range"),
        (
            "d",
            Scalar::Decimal { value: 1, scale: 2 },
            "more than 9 digits",
        ),
        ("f", Scalar::Float(f64::MAX), "overflows float64"),
    ];
    for (name, delta, want) in cases {
        let e = update(&[], name, RowAction::Add(delta))
            .apply(bytes)
            .unwrap_err();
        assert!(e.contains(want), "{name}: {e}");
        assert!(e.contains(name), "names the column: {e}");
    }
}

#[test]
fn updates_that_cannot_run_are_refused_when_compiled() {
    for (name, action, want) in [
        ("id", RowAction::Set(Scalar::Int(1)), "primary key"),
        (
            "i",
            RowAction::Set(Scalar::Int(1 << 40)),
            "out of int32's range",
        ),
        (
            "d",
            RowAction::Set(Scalar::Decimal { value: 1, scale: 3 }),
            "more than 2 digits after the point",
        ),
        ("s", RowAction::Set(Scalar::Int(3)), "wrong kind of value"),
        ("s", RowAction::Add(Scalar::Int(3)), "not a number"),
        ("b", RowAction::Add(Scalar::Int(1)), "not a number"),
        (
            "q",
            RowAction::Add(Scalar::Float(0.5)),
            "only a whole number",
        ),
        ("q", RowAction::Add(Scalar::Null), "cannot add NULL"),
        (
            "f",
            RowAction::Add(Scalar::Float(f64::INFINITY)),
            "not finite",
        ),
        (
            "d",
            RowAction::Add(Scalar::Decimal { value: 1, scale: 5 }),
            "digits after the point",
        ),
    ] {
        let e = refusal(name, action);
        assert!(e.contains(want), "{name}: {e}");
    }
    let e = RowUpdate::compile(&schema(), &[], &[(99, RowAction::Set(Scalar::Null))])
        .err()
        .expect("refused");
    assert!(e.to_string().contains("has 10 columns"), "{e}");
    // NULL only in a nullable column: `id` is the key, so a NOT NULL
    // non-key column is needed.
    let mut s = schema();
    s.columns[1].nullable = false;
    let e = RowUpdate::compile(&s, &[], &[(1, RowAction::Set(Scalar::Null))])
        .err()
        .expect("refused");
    assert!(e.to_string().contains("NOT NULL"), "{e}");
}

#[test]
fn a_row_that_does_not_decode_is_an_error_not_a_panic() {
    let u = update(&[], "q", RowAction::Set(Scalar::Int(1)));
    for bytes in [&b""[..], b"\xA1", b"plain bytes of an untyped value"] {
        assert!(u.apply(bytes).is_err());
    }
}

#[test]
fn several_columns_change_together_each_named_once() {
    let mut r: Vec<Scalar> = vec![Scalar::Null; schema().columns.len()];
    r[0] = Scalar::Int(1);
    r[col("q") as usize] = Scalar::Int(5);
    let bytes = &encode(&[r.clone()])[0];
    let set = [
        (col("q"), RowAction::Add(Scalar::Int(2))),
        (col("s"), RowAction::Set(Scalar::Str("x".into()))),
        // NULL stays NULL.
        (col("i"), RowAction::Add(Scalar::Int(1))),
    ];
    let u = RowUpdate::compile(&schema(), &[], &set).expect("valid");
    let new = decode(&u.apply(bytes).unwrap().expect("written"));
    r[col("q") as usize] = Scalar::Int(7);
    r[col("s") as usize] = Scalar::Str("x".into());
    assert_eq!(new, r);
    // Only adds, all meeting NULLs: written unchanged (SQL counts the row).
    let u = RowUpdate::compile(
        &schema(),
        &[],
        &[(col("i"), RowAction::Add(Scalar::Int(1)))],
    )
    .expect("valid");
    assert_eq!(u.apply(bytes).unwrap().as_deref(), Some(&bytes[..]));
    let twice = [
        (col("q"), RowAction::Add(Scalar::Int(2))),
        (col("q"), RowAction::Set(Scalar::Int(2))),
    ];
    let e = RowUpdate::compile(&schema(), &[], &twice)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("twice"), "{e}");
    let e = RowUpdate::compile(&schema(), &[], &[])
        .err()
        .expect("refused");
    assert!(e.to_string().contains("at least one column"), "{e}");
}
