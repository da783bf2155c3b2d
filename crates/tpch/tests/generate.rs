//! The generator against the specification's row counts and dbgen's output.

use insitu_protocol::query::Scalar;
use insitu_protocol::schema::ColumnType;
use insitu_tpch::generate::{GenerateError, render, render_date, render_decimal};
use insitu_tpch::{TABLES, row_count, rows, schema};

/// Rows per table at SF 0.01 (lineitem's count is what dbgen produces).
const SF_0_01: [(&str, usize); 8] = [
    ("part", 2_000),
    ("supplier", 100),
    ("partsupp", 8_000),
    ("customer", 1_500),
    ("orders", 15_000),
    ("lineitem", 60_175),
    ("nation", 25),
    ("region", 5),
];

#[test]
fn row_counts_at_sf_0_01_match_the_specification() {
    for (table, want) in SF_0_01 {
        let schema = schema(table).unwrap();
        let mut n = 0;
        for row in rows(table, 0.01, 0, 1).unwrap() {
            assert_eq!(row.len(), schema.columns.len(), "{table}");
            n += 1;
        }
        assert_eq!(n, want, "{table}");
        let estimate = row_count(table, 0.01) as usize;
        if table == "lineitem" {
            assert!(estimate.abs_diff(want) * 100 < want, "{estimate}");
        } else {
            assert_eq!(estimate, want, "{table}");
        }
    }
}

#[test]
fn values_have_their_columns_types() {
    for table in TABLES {
        let schema = schema(table).unwrap();
        for row in rows(table, 0.01, 0, 1).unwrap().take(50) {
            for (v, c) in row.iter().zip(&schema.columns) {
                let ok = match (c.ty, v) {
                    (ColumnType::Int32, Scalar::Int(i)) => i32::try_from(*i).is_ok(),
                    (ColumnType::Int64, Scalar::Int(_)) => true,
                    (ColumnType::Decimal { scale, .. }, Scalar::Decimal { scale: s, .. }) => {
                        scale == *s
                    }
                    (ColumnType::Date32, Scalar::Date(_)) => true,
                    (ColumnType::Utf8, Scalar::Str(_)) => true,
                    _ => false,
                };
                assert!(ok, "{table}.{}: {v:?} is not a {}", c.name, c.ty);
            }
        }
    }
}

#[test]
fn first_lineitem_row_at_sf_1_is_dbgens() {
    let first = rows("lineitem", 1.0, 0, 1).unwrap().next().unwrap();
    let text: Vec<String> = first.iter().map(render).collect();
    assert_eq!(
        text.join("|"),
        "1|155190|7706|1|17.00|21168.23|0.04|0.02|N|O|1996-03-13|1996-02-12|1996-03-22\
         |DELIVER IN PERSON|TRUCK|egular courts above the"
    );
    // 1996-03-13 is day 9568 of the Unix epoch.
    assert_eq!(first[10], Scalar::Date(9568));
    assert_eq!(
        first[4],
        Scalar::Decimal {
            value: 1700,
            scale: 2
        }
    );
}

#[test]
fn parts_partition_the_table() {
    for table in ["orders", "partsupp", "nation", "region", "supplier"] {
        let whole: Vec<_> = rows(table, 0.01, 0, 1).unwrap().collect();
        let mut joined = Vec::new();
        for part in 0..3 {
            joined.extend(rows(table, 0.01, part, 3).unwrap());
        }
        assert_eq!(joined.len(), whole.len(), "{table}");
        assert!(
            joined == whole,
            "{table}: the parts in order are the whole table"
        );
    }
    // Only lineitem of two orders' slices: keys follow on from slice to slice.
    let a: Vec<_> = rows("lineitem", 0.01, 0, 2).unwrap().collect();
    let b: Vec<_> = rows("lineitem", 0.01, 1, 2).unwrap().collect();
    assert_eq!(a.len() + b.len(), 60_175);
    assert!(
        a.last().unwrap()[0] != b[0][0],
        "an order is not split across slices"
    );
}

#[test]
fn bad_arguments_are_refused() {
    assert!(matches!(
        rows("lineitems", 1.0, 0, 1),
        Err(GenerateError::UnknownTable(_))
    ));
    for sf in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e9] {
        assert!(matches!(
            rows("orders", sf, 0, 1),
            Err(GenerateError::BadScaleFactor(_))
        ));
        assert_eq!(row_count("orders", sf), 0);
    }
    assert!(matches!(
        rows("orders", 1.0, 0, 0),
        Err(GenerateError::BadPart { .. })
    ));
    assert!(matches!(
        rows("orders", 1.0, 3, 3),
        Err(GenerateError::BadPart { .. })
    ));
    assert!(matches!(
        rows("orders", 1.0, 0, u32::MAX),
        Err(GenerateError::BadPart { .. })
    ));
    assert_eq!(row_count("nope", 1.0), 0);
    let e = rows("x", 1.0, 0, 1).err().unwrap().to_string();
    assert!(e.contains("lineitem"), "{e}");
}

#[test]
fn rendering() {
    assert_eq!(render_date(0), "1970-01-01");
    assert_eq!(render_date(8035), "1992-01-01");
    assert_eq!(render_date(10_591), "1998-12-31");
    assert_eq!(render_date(-1), "1969-12-31");
    assert_eq!(render_date(11_016), "2000-02-29");
    assert_eq!(render_decimal(5, 2), "0.05");
    assert_eq!(render_decimal(-5, 2), "-0.05");
    assert_eq!(render_decimal(-123_456, 2), "-1234.56");
    assert_eq!(render_decimal(42, 0), "42");
    assert_eq!(render_decimal(i64::MIN, 2), "-92233720368547758.08");
}
