//! Tests of the crate: the rich schema and row/value generators they share.

mod agg_props;
mod filter_props;
mod hostile_plans;
mod like_cases;
mod mangled_rows;
mod merge_cases;
mod parse_cases;
mod refusals;
mod sinks;

use insitu_protocol::query::{Pred, QueryOutput, QueryPlan, Scalar};
use insitu_protocol::schema::{Column, ColumnType, Schema};
use insitu_rows::{RowLayout, encode_row};
use proptest::prelude::*;

/// Every column type, most nullable, two text columns for column-to-column
/// comparisons, two decimals of different scales.
pub fn schema() -> Schema {
    let col = Column::new;
    Schema {
        columns: vec![
            col("id", ColumnType::Int64, false),
            col("i", ColumnType::Int32, true),
            col("q", ColumnType::Int64, true),
            col(
                "d",
                ColumnType::Decimal {
                    precision: 9,
                    scale: 2,
                },
                true,
            ),
            col(
                "e",
                ColumnType::Decimal {
                    precision: 12,
                    scale: 4,
                },
                true,
            ),
            col("f", ColumnType::Float64, true),
            col("dt", ColumnType::Date32, true),
            col("s", ColumnType::Utf8, true),
            col("t", ColumnType::Utf8, true),
            col("b", ColumnType::Bool, true),
        ],
        key: vec![0],
    }
}

/// A plan of column 0 of the rows that pass `filter`: the plan a filter is
/// compiled in when only the filter matters.
pub fn rows_plan(filter: Vec<Pred>) -> QueryPlan {
    QueryPlan {
        filter,
        output: QueryOutput::Rows {
            columns: vec![0],
            order_by: vec![],
            limit: None,
        },
    }
}

/// Characters of generated text: LIKE's metacharacters, regex
/// metacharacters, case pairs, a non-ASCII pair, a newline.
pub const ALPHABET: &[char] = &['a', 'A', 'b', 'é', 'É', '.', '%', '_', '\n', '*'];

pub fn text() -> BoxedStrategy<String> {
    proptest::collection::vec(proptest::sample::select(ALPHABET), 0..5)
        .prop_map(|v| v.into_iter().collect())
        .boxed()
}

pub fn float() -> BoxedStrategy<f64> {
    proptest::sample::select(vec![-1.5, -0.0, 0.0, 0.25, 1.0, 2.0, 3.5, f64::NAN, 1e300]).boxed()
}

/// A non-NULL value of a column of type `ty`, from small ranges so that
/// equal values and ties are common.
pub fn value(ty: ColumnType) -> BoxedStrategy<Scalar> {
    match ty {
        ColumnType::Int32 | ColumnType::Int64 => (-4i64..5).prop_map(Scalar::Int).boxed(),
        ColumnType::Decimal { scale, .. } => (-600i64..600)
            .prop_map(move |value| Scalar::Decimal { value, scale })
            .boxed(),
        ColumnType::Float64 => float().prop_map(Scalar::Float).boxed(),
        ColumnType::Date32 => (-3i32..4).prop_map(Scalar::Date).boxed(),
        ColumnType::Utf8 => text().prop_map(Scalar::Str).boxed(),
        ColumnType::Bool => any::<bool>().prop_map(Scalar::Bool).boxed(),
    }
}

/// A row of `schema()`: NULL in a nullable column one time in four.
pub fn row() -> BoxedStrategy<Vec<Scalar>> {
    let s = schema();
    let cols: Vec<BoxedStrategy<Scalar>> = s
        .columns
        .iter()
        .map(|c| {
            if c.nullable {
                prop_oneof![1 => Just(Scalar::Null), 3 => value(c.ty)].boxed()
            } else {
                value(c.ty)
            }
        })
        .collect();
    cols.boxed()
}

pub fn rows(max: usize) -> BoxedStrategy<Vec<Vec<Scalar>>> {
    proptest::collection::vec(row(), 0..max).boxed()
}

pub fn encode(rows: &[Vec<Scalar>]) -> Vec<Vec<u8>> {
    let s = schema();
    let layout = RowLayout::new(&s);
    rows.iter()
        .map(|r| encode_row(&s, &layout, r).expect("generated rows fit the schema"))
        .collect()
}
