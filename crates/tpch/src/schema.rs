//! The 8 TPC-H tables as typed-table schemas, columns in the specification's
//! order (clause 1.4) and named as there.
//!
//! Type choices:
//! - identifiers (`*key`) are int64: SF 1000 has 6e9 orders keys;
//! - `l_linenumber` (1..=7), `p_size` (1..=50), `ps_availqty` (1..=9999) and
//!   `o_shippriority` (0) are int32: small integers by the specification;
//! - money, quantities, discount and tax are decimal(15,2) as in the
//!   specification, exact (an i64 of hundredths) so sums match other engines;
//! - dates are date32; fixed and variable text (`char(n)`, `varchar(n)`) are
//!   utf8 (lengths are not enforced);
//! - every column is NOT NULL (the specification has no NULLs).

use insitu_protocol::schema::{Column, ColumnType, Schema};

/// The table names, lower case, in the specification's order.
pub const TABLES: [&str; 8] = [
    "part", "supplier", "partsupp", "customer", "orders", "lineitem", "nation", "region",
];

/// Short type tags for the column tables below.
#[derive(Clone, Copy)]
enum T {
    I32,
    I64,
    /// decimal(15,2).
    Money,
    Date,
    Text,
}

impl T {
    fn column_type(self) -> ColumnType {
        match self {
            T::I32 => ColumnType::Int32,
            T::I64 => ColumnType::Int64,
            T::Money => ColumnType::Decimal {
                precision: 15,
                scale: 2,
            },
            T::Date => ColumnType::Date32,
            T::Text => ColumnType::Utf8,
        }
    }
}

use T::*;

const PART: &[(&str, T)] = &[
    ("p_partkey", I64),
    ("p_name", Text),
    ("p_mfgr", Text),
    ("p_brand", Text),
    ("p_type", Text),
    ("p_size", I32),
    ("p_container", Text),
    ("p_retailprice", Money),
    ("p_comment", Text),
];
const SUPPLIER: &[(&str, T)] = &[
    ("s_suppkey", I64),
    ("s_name", Text),
    ("s_address", Text),
    ("s_nationkey", I64),
    ("s_phone", Text),
    ("s_acctbal", Money),
    ("s_comment", Text),
];
const PARTSUPP: &[(&str, T)] = &[
    ("ps_partkey", I64),
    ("ps_suppkey", I64),
    ("ps_availqty", I32),
    ("ps_supplycost", Money),
    ("ps_comment", Text),
];
const CUSTOMER: &[(&str, T)] = &[
    ("c_custkey", I64),
    ("c_name", Text),
    ("c_address", Text),
    ("c_nationkey", I64),
    ("c_phone", Text),
    ("c_acctbal", Money),
    ("c_mktsegment", Text),
    ("c_comment", Text),
];
const ORDERS: &[(&str, T)] = &[
    ("o_orderkey", I64),
    ("o_custkey", I64),
    ("o_orderstatus", Text),
    ("o_totalprice", Money),
    ("o_orderdate", Date),
    ("o_orderpriority", Text),
    ("o_clerk", Text),
    ("o_shippriority", I32),
    ("o_comment", Text),
];
const LINEITEM: &[(&str, T)] = &[
    ("l_orderkey", I64),
    ("l_partkey", I64),
    ("l_suppkey", I64),
    ("l_linenumber", I32),
    ("l_quantity", Money),
    ("l_extendedprice", Money),
    ("l_discount", Money),
    ("l_tax", Money),
    ("l_returnflag", Text),
    ("l_linestatus", Text),
    ("l_shipdate", Date),
    ("l_commitdate", Date),
    ("l_receiptdate", Date),
    ("l_shipinstruct", Text),
    ("l_shipmode", Text),
    ("l_comment", Text),
];
const NATION: &[(&str, T)] = &[
    ("n_nationkey", I64),
    ("n_name", Text),
    ("n_regionkey", I64),
    ("n_comment", Text),
];
const REGION: &[(&str, T)] = &[("r_regionkey", I64), ("r_name", Text), ("r_comment", Text)];

/// A table's columns (name, type) in order.
type Columns = &'static [(&'static str, T)];
/// A table's primary-key column names, in key order.
type KeyNames = &'static [&'static str];

/// A table's columns and primary-key column names.
fn definition(name: &str) -> Option<(Columns, KeyNames)> {
    Some(match name {
        "part" => (PART, &["p_partkey"]),
        "supplier" => (SUPPLIER, &["s_suppkey"]),
        "partsupp" => (PARTSUPP, &["ps_partkey", "ps_suppkey"]),
        "customer" => (CUSTOMER, &["c_custkey"]),
        "orders" => (ORDERS, &["o_orderkey"]),
        "lineitem" => (LINEITEM, &["l_orderkey", "l_linenumber"]),
        "nation" => (NATION, &["n_nationkey"]),
        "region" => (REGION, &["r_regionkey"]),
        _ => return None,
    })
}

/// The schema of the TPC-H table `name` (lower case), or None for another name.
pub fn schema(name: &str) -> Option<Schema> {
    let (columns, key) = definition(name)?;
    let columns: Vec<Column> = columns
        .iter()
        .map(|&(name, t)| Column::new(name, t.column_type(), false))
        .collect();
    let key = key
        .iter()
        .map(|k| {
            let i = columns.iter().position(|c| c.name == *k);
            // The tables above are constants; a key naming no column is a typo here.
            let i = i.unwrap_or_else(|| panic!("TPC-H table {name}: key column {k} is missing"));
            i as u16
        })
        .collect();
    Some(Schema { columns, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_is_well_formed() {
        for name in TABLES {
            let s = schema(name).expect("a schema for each listed table");
            s.check().unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(s.columns.iter().all(|c| !c.nullable), "{name}");
        }
        assert!(schema("nope").is_none());
        assert!(schema("LINEITEM").is_none(), "names are lower case");
    }

    #[test]
    fn keys_and_column_counts_follow_the_specification() {
        let counts = [9, 7, 5, 8, 9, 16, 4, 3];
        for (name, n) in TABLES.iter().zip(counts) {
            assert_eq!(schema(name).unwrap().columns.len(), n, "{name}");
        }
        let l = schema("lineitem").unwrap();
        let key: Vec<&str> = l
            .key
            .iter()
            .map(|&k| l.columns[k as usize].name.as_str())
            .collect();
        assert_eq!(key, ["l_orderkey", "l_linenumber"]);
        assert_eq!(l.columns[3].ty, ColumnType::Int32);
        assert_eq!(
            l.columns[4].ty,
            ColumnType::Decimal {
                precision: 15,
                scale: 2
            }
        );
        assert_eq!(l.columns[10].ty, ColumnType::Date32);
        let ps = schema("partsupp").unwrap();
        assert_eq!(ps.key, [0, 1]);
    }
}
