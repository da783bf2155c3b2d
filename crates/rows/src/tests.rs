//! Round trips of the row format against the values written.

use insitu_protocol::query::Scalar;
use insitu_protocol::schema::{Column, ColumnType, Schema};
use proptest::prelude::*;

use crate::arrow::{BatchBuilder, batch_row, from_ipc, to_ipc};
use crate::{RowError, RowLayout, RowRef, encode_key, encode_row};

fn schema() -> Schema {
    let col = Column::new;
    Schema {
        columns: vec![
            col("id", ColumnType::Int64, false),
            col("name", ColumnType::Utf8, true),
            col("qty", ColumnType::Int32, true),
            col(
                "price",
                ColumnType::Decimal {
                    precision: 15,
                    scale: 2,
                },
                true,
            ),
            col("when", ColumnType::Date32, true),
            col("ok", ColumnType::Bool, true),
            col("note", ColumnType::Utf8, true),
            col("x", ColumnType::Float64, true),
        ],
        key: vec![0],
    }
}

fn value(ty: ColumnType) -> BoxedStrategy<Scalar> {
    match ty {
        ColumnType::Int64 => any::<i64>().prop_map(Scalar::Int).boxed(),
        ColumnType::Int32 => any::<i32>().prop_map(|i| Scalar::Int(i64::from(i))).boxed(),
        ColumnType::Utf8 => ".{0,12}".prop_map(Scalar::Str).boxed(),
        ColumnType::Decimal { .. } => (-999_999_999_999_999i64..=999_999_999_999_999)
            .prop_map(|value| Scalar::Decimal { value, scale: 2 })
            .boxed(),
        ColumnType::Date32 => (-100_000i32..100_000).prop_map(Scalar::Date).boxed(),
        ColumnType::Bool => any::<bool>().prop_map(Scalar::Bool).boxed(),
        ColumnType::Float64 => any::<f64>()
            .prop_filter("NaN never equals itself", |f| !f.is_nan())
            .prop_map(Scalar::Float)
            .boxed(),
    }
}

fn row_strategy() -> impl Strategy<Value = Vec<Scalar>> {
    let s = schema();
    s.columns
        .iter()
        .map(|c| {
            if c.nullable {
                prop_oneof![1 => Just(Scalar::Null), 4 => value(c.ty)].boxed()
            } else {
                value(c.ty)
            }
        })
        .collect::<Vec<_>>()
}

proptest! {
    #[test]
    fn every_column_reads_back_what_was_written(row in row_strategy()) {
        let s = schema();
        let layout = RowLayout::new(&s);
        let bytes = encode_row(&s, &layout, &row).unwrap();
        let r = RowRef::new(&layout, &bytes).unwrap();
        for (c, v) in row.iter().enumerate() {
            prop_assert_eq!(&r.scalar(c).unwrap(), v);
            prop_assert_eq!(r.is_null(c), matches!(v, Scalar::Null));
        }
        // Through Arrow and back: the same values.
        let mut b = BatchBuilder::new(&s, &(0..8).collect::<Vec<u16>>());
        b.append(&r).unwrap();
        let batch = b.finish().unwrap();
        let back = from_ipc(&to_ipc(&batch.schema(), &[batch]).unwrap()).unwrap();
        prop_assert_eq!(batch_row(&back[0], 0).unwrap(), row);
    }

    #[test]
    fn a_truncated_or_corrupted_row_is_refused_or_read_in_bounds(
        row in row_strategy(), cut in 0usize..64, flip in 0usize..64, bits in 1u8..=255,
    ) {
        let s = schema();
        let layout = RowLayout::new(&s);
        let mut bytes = encode_row(&s, &layout, &row).unwrap();
        let i = flip % bytes.len();
        bytes[i] ^= bits;
        bytes.truncate(bytes.len().saturating_sub(cut));
        // Either refused, or every accessor stays inside the row.
        if let Ok(r) = RowRef::new(&layout, &bytes) {
            for c in 0..s.columns.len() {
                let _ = r.scalar(c);
            }
        }
        // `new_fixed` accepts at least what `new` does, no accessor panics
        // on a row it accepted, and `check_vars` finishes `new`'s check.
        match RowRef::new_fixed(&layout, &bytes) {
            Ok(r) => {
                for c in 0..s.columns.len() {
                    let _ = r.scalar(c);
                }
                prop_assert_eq!(r.check_vars().is_ok(), RowRef::new(&layout, &bytes).is_ok());
            }
            Err(_) => prop_assert!(RowRef::new(&layout, &bytes).is_err()),
        }
    }

    #[test]
    fn keys_sort_like_their_values(a in any::<i64>(), b in any::<i64>()) {
        let s = schema();
        let row = |id| vec![Scalar::Int(id), Scalar::Null, Scalar::Null, Scalar::Null,
                            Scalar::Null, Scalar::Null, Scalar::Null, Scalar::Null];
        let (ka, kb) = (encode_key(&s, &row(a)).unwrap(), encode_key(&s, &row(b)).unwrap());
        prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
    }
}

#[test]
fn values_that_do_not_fit_are_refused_with_the_column_named() {
    let s = schema();
    let layout = RowLayout::new(&s);
    let mut row = vec![Scalar::Null; 8];
    row[0] = Scalar::Int(1);
    row[2] = Scalar::Int(1 << 40);
    let e = encode_row(&s, &layout, &row).unwrap_err();
    assert!(
        matches!(&e, RowError::Type { column, .. } if column == "qty"),
        "{e}"
    );
    row[2] = Scalar::Null;
    row[3] = Scalar::Decimal {
        value: 12345,
        scale: 3,
    };
    let e = encode_row(&s, &layout, &row).unwrap_err().to_string();
    assert!(
        e.contains("price") && e.contains("digits after the point"),
        "{e}"
    );
    row[3] = Scalar::Str("cheap".into());
    assert!(encode_row(&s, &layout, &row).is_err());
    row[3] = Scalar::Null;
    row[0] = Scalar::Null;
    let e = encode_row(&s, &layout, &row).unwrap_err().to_string();
    assert!(e.contains("NOT NULL"), "{e}");
    assert!(matches!(
        encode_row(&s, &layout, &row[..3]),
        Err(RowError::Arity {
            expected: 8,
            got: 3
        })
    ));
}

#[test]
fn opaque_bytes_are_not_taken_for_a_row() {
    let layout = RowLayout::new(&schema());
    let e = RowRef::new(&layout, b"{\"age\": 31}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a typed row"), "{e}");
}

#[test]
fn a_decimal_of_a_hostile_scale_is_refused_not_a_panic() {
    let s = schema();
    let layout = RowLayout::new(&s);
    let mut row = vec![Scalar::Null; 8];
    row[0] = Scalar::Int(1);
    row[3] = Scalar::Decimal {
        value: 1,
        scale: 200,
    };
    let e = encode_row(&s, &layout, &row).unwrap_err().to_string();
    assert!(e.contains("scale above 18"), "{e}");
}

/// A row of `schema()` with both text columns set and NULLs after: the
/// row the tests of malformed rows start from.
fn sample_row() -> Vec<Scalar> {
    vec![
        Scalar::Int(1),
        Scalar::Str("abc".into()),
        Scalar::Int(2),
        Scalar::Null,
        Scalar::Null,
        Scalar::Null,
        Scalar::Str("de".into()),
        Scalar::Null,
    ]
}

#[test]
fn a_bad_offset_table_is_refused_by_new_and_read_as_empty_after_new_fixed() {
    let s = schema();
    let layout = RowLayout::new(&s);
    let mut bytes = encode_row(&s, &layout, &sample_row()).unwrap();
    // The first text column ends far beyond the row.
    bytes[layout.fixed_end..layout.fixed_end + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = RowRef::new(&layout, &bytes).unwrap_err();
    assert!(e.to_string().contains("offset table entry 0"), "{e}");
    let r = RowRef::new_fixed(&layout, &bytes).unwrap();
    assert_eq!(r.i64(0), 1);
    assert_eq!(r.i32(2), 2);
    assert_eq!(r.var(1), b"");
    assert_eq!(r.check_vars().unwrap_err(), e);
}

/// A row that marks a NOT NULL column NULL (a client wrote it without the
/// encoder) is refused by `new` and `check_vars`, naming the column; one
/// that marks a nullable column NULL is not.
#[test]
fn a_null_in_a_not_null_column_is_refused() {
    let s = schema();
    let layout = RowLayout::new(&s);
    let (not_null, nullable) = (0, 1);
    assert!(!s.columns[not_null].nullable && s.columns[nullable].nullable);
    let good = encode_row(&s, &layout, &sample_row()).unwrap();
    let mut bytes = good.clone();
    bytes[1 + nullable / 8] |= 1 << (nullable % 8);
    assert!(RowRef::new(&layout, &bytes).is_ok());
    let mut bytes = good;
    bytes[1 + not_null / 8] |= 1 << (not_null % 8);
    let e = RowRef::new(&layout, &bytes).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("column {not_null} is declared NOT NULL")),
        "{e}"
    );
    let r = RowRef::new_fixed(&layout, &bytes).unwrap();
    assert_eq!(r.check_vars().unwrap_err(), e);
    // A reader that skipped the check gets an error from the Arrow builder,
    // whose `id` column is non-nullable, not a panic.
    let mut b = BatchBuilder::new(&s, &[0]);
    b.append(&r).unwrap();
    let e = b.finish().unwrap_err();
    assert!(e.to_string().contains("non-nullable"), "{e}");
}

/// Text is validated once per row (`RowRef::var_text`), and still each
/// projected column on its own: two columns whose bytes are valid only
/// together (an "é" split across them) are refused, and a bad column that
/// is not projected does not refuse the row.
#[test]
fn text_split_across_columns_or_bad_elsewhere_is_judged_per_column() {
    let s = schema();
    let layout = RowLayout::new(&s);
    let row = vec![
        Scalar::Int(1),
        Scalar::Str("a".into()),
        Scalar::Null,
        Scalar::Null,
        Scalar::Null,
        Scalar::Null,
        Scalar::Str("b".into()),
        Scalar::Null,
    ];
    let good = encode_row(&s, &layout, &row).unwrap();
    // The variable region is "ab": make it the two bytes of "é".
    let mut split = good.clone();
    let n = split.len();
    split[n - 2..].copy_from_slice("é".as_bytes());
    let r = RowRef::new(&layout, &split).unwrap();
    assert_eq!(r.var_text(), Some("é"), "valid as a whole");
    for col in [1u16, 6] {
        let mut b = BatchBuilder::new(&s, &[0, col]);
        let e = b.append(&r).unwrap_err();
        assert!(e.to_string().contains("not valid UTF-8"), "{e}");
        assert_eq!(b.rows(), 0, "nothing of the row appended");
    }
    // Only the second column bad: projecting the first alone is fine.
    let mut bad_note = good.clone();
    bad_note[n - 1] = 0xff;
    let r = RowRef::new(&layout, &bad_note).unwrap();
    assert_eq!(r.var_text(), None);
    let mut b = BatchBuilder::new(&s, &[0, 1]);
    b.append(&r).unwrap();
    let batch = b.finish().unwrap();
    assert_eq!(batch_row(&batch, 0).unwrap()[1], Scalar::Str("a".into()));
    let mut b = BatchBuilder::new(&s, &[6]);
    assert!(b.append(&r).is_err());
    // The good row reads back through the one validation.
    let r = RowRef::new(&layout, &good).unwrap();
    let mut b = BatchBuilder::new(&s, &[1, 6]);
    b.append(&r).unwrap();
    let batch = b.finish().unwrap();
    let got = batch_row(&batch, 0).unwrap();
    assert_eq!(got, vec![Scalar::Str("a".into()), Scalar::Str("b".into())]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    /// An Arrow IPC stream of a server's answer, damaged (bytes changed, cut
    /// short): `from_ipc` refuses it or reads batches, never panics. The
    /// client reads every typed answer with it.
    #[test]
    fn a_damaged_ipc_stream_is_refused_not_a_panic(
        rows in proptest::collection::vec(row_strategy(), 1..4),
        changes in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let s = schema();
        let layout = RowLayout::new(&s);
        let mut b = BatchBuilder::new(&s, &(0..8).collect::<Vec<u16>>());
        let encoded: Vec<Vec<u8>> = rows.iter().map(|r| encode_row(&s, &layout, r).unwrap()).collect();
        for bytes in &encoded {
            b.append(&RowRef::new(&layout, bytes).unwrap()).unwrap();
        }
        let batch = b.finish().unwrap();
        let mut ipc = to_ipc(&batch.schema(), &[batch]).unwrap();
        for (at, byte) in changes {
            let at = at.index(ipc.len());
            ipc[at] = byte;
        }
        if do_cut {
            ipc.truncate(cut.index(ipc.len()));
        }
        let _ = from_ipc(&ipc);
    }
}
