//! The shared SQL fixture: `items` (40 rows with NULLs in every nullable
//! column, every column type) and `owners`, each both as an insitu table
//! (over `MemSource`) and as DataFusion's own `MemTable` holding the same
//! rows; and the comparison of their answers.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use insitu_protocol::query::Scalar;
use insitu_protocol::schema::{Column, ColumnType, Schema};
use insitu_sql::{TableSource, run_sql};

use super::MemSource;

pub fn col(name: &str, ty: ColumnType, nullable: bool) -> Column {
    Column::new(name, ty, nullable)
}

pub const DEC: ColumnType = ColumnType::Decimal {
    precision: 15,
    scale: 2,
};

/// `items`: 40 rows with NULLs in every nullable column.
pub fn items() -> Arc<MemSource> {
    let schema = Schema {
        columns: vec![
            col("id", ColumnType::Int64, false),
            col("qty", ColumnType::Int32, true),
            col("price", DEC, true),
            col("disc", DEC, false),
            col("ship", ColumnType::Date32, true),
            col("name", ColumnType::Utf8, true),
            col("flag", ColumnType::Bool, true),
            col("score", ColumnType::Float64, true),
            col("owner", ColumnType::Int64, true),
        ],
        key: vec![0],
    };
    let names = [
        "alpha", "Beta", "gamma_1", "b42", "x%y", "delta", "BETA", "ab",
    ];
    let rows = (0..40i64)
        .map(|i| {
            let null = |k: i64| i % k == k - 1;
            vec![
                Scalar::Int(i),
                if null(7) {
                    Scalar::Null
                } else {
                    Scalar::Int((i * 7) % 11 - 2)
                },
                if null(5) {
                    Scalar::Null
                } else {
                    Scalar::Decimal {
                        value: (i * 137) % 3000 + 5,
                        scale: 2,
                    }
                },
                Scalar::Decimal {
                    value: i % 11,
                    scale: 2,
                },
                if null(6) {
                    Scalar::Null
                } else {
                    Scalar::Date(18262 + (i as i32 * 3) % 40)
                },
                if null(9) {
                    Scalar::Null
                } else {
                    Scalar::Str(names[(i % 8) as usize].into())
                },
                if null(4) {
                    Scalar::Null
                } else {
                    Scalar::Bool(i % 3 == 0)
                },
                if null(8) {
                    Scalar::Null
                } else {
                    Scalar::Float((i as f64) * 0.25 - 3.0)
                },
                if null(10) {
                    Scalar::Null
                } else {
                    Scalar::Int(i % 4)
                },
            ]
        })
        .collect();
    MemSource::new("items", schema, rows)
}

pub fn owners() -> Arc<MemSource> {
    let schema = Schema {
        columns: vec![
            col("owner_id", ColumnType::Int64, false),
            col("oname", ColumnType::Utf8, false),
        ],
        key: vec![0],
    };
    let rows = (0..3i64)
        .map(|i| vec![Scalar::Int(i), Scalar::Str(format!("owner{i}"))])
        .collect();
    MemSource::new("owners", schema, rows)
}

pub struct Fixture {
    pub insitu: SessionContext,
    pub reference: SessionContext,
    pub items: Arc<MemSource>,
}

pub async fn fixture() -> Fixture {
    let (items, owners) = (items(), owners());
    let insitu = insitu_sql::context(vec![
        items.clone() as Arc<dyn TableSource>,
        owners.clone() as Arc<dyn TableSource>,
    ])
    .await
    .unwrap();
    let mut config = SessionConfig::new();
    config.options_mut().sql_parser.parse_float_as_decimal = true;
    let reference = SessionContext::new_with_config(config);
    for s in [&items, &owners] {
        let b = s.batch();
        let t = MemTable::try_new(b.schema(), vec![vec![b]]).unwrap();
        reference
            .register_table(s.name.as_str(), Arc::new(t))
            .unwrap();
    }
    Fixture {
        insitu,
        reference,
        items,
    }
}

/// Rows as text lines (sorted unless the query orders them) and the types.
pub fn render(batches: &[RecordBatch], sort: bool) -> (Vec<String>, Vec<String>) {
    let mut lines = vec![];
    let mut types = vec![];
    let opts = FormatOptions::default().with_null("NULL");
    for b in batches {
        types = b
            .schema()
            .fields()
            .iter()
            .map(|f| format!("{}:{}", f.name(), f.data_type()))
            .collect();
        let fmts: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts).unwrap())
            .collect();
        for r in 0..b.num_rows() {
            let cells: Vec<String> = fmts.iter().map(|f| f.value(r).to_string()).collect();
            lines.push(cells.join(" | "));
        }
    }
    if sort {
        lines.sort();
    }
    (lines, types)
}

pub async fn same(f: &Fixture, sql: &str) -> usize {
    let got = run_sql(&f.insitu, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let want = run_sql(&f.reference, sql).await.unwrap();
    let sort = !sql.to_lowercase().contains("order by");
    let (g, gt) = render(&got, sort);
    let (w, wt) = render(&want, sort);
    assert_eq!(g, w, "rows differ for {sql}");
    if !w.is_empty() {
        assert_eq!(gt, wt, "types differ for {sql}");
    }
    w.len()
}
