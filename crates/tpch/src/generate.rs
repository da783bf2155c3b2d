//! Rows of the TPC-H tables from `tpchgen` (output identical to the
//! specification's dbgen), as `Scalar`s in the column order of `schema`.
//!
//! A table may be generated in `parts` disjoint slices (for parallel loading):
//! slice `part` (0-based) of `parts`; the union of all slices is the table.

use insitu_protocol::query::Scalar;
use tpchgen::dates::TPCHDate;
use tpchgen::decimal::TPCHDecimal;
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator,
    PartSuppGenerator, RegionGenerator, SupplierGenerator,
};

/// Largest scale factor accepted: the specification's largest (100 TB).
/// Why a limit: tpchgen computes row counts as `base * sf` in i64 and slices
/// with i32 part numbers; far larger values would overflow silently.
pub const MAX_SCALE_FACTOR: f64 = 100_000.0;

/// One generated row, values in schema column order.
pub type Row = Vec<Scalar>;

/// Why rows could not be generated.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerateError {
    /// Not one of the 8 TPC-H tables (names are lower case).
    UnknownTable(String),
    /// Not finite, not positive, or above MAX_SCALE_FACTOR.
    BadScaleFactor(f64),
    /// `parts` is 0 or above i32::MAX, or `part >= parts`.
    BadPart { part: u32, parts: u32 },
}

impl std::fmt::Display for GenerateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GenerateError::UnknownTable(t) => write!(
                f,
                "{t:?} is not a TPC-H table (one of {})",
                crate::TABLES.join(", ")
            ),
            GenerateError::BadScaleFactor(sf) => {
                write!(f, "scale factor {sf} is not in (0, {MAX_SCALE_FACTOR}]")
            }
            GenerateError::BadPart { part, parts } => write!(
                f,
                "part {part} of {parts}: need 1 <= parts <= {} and part < parts (parts are 0-based)",
                i32::MAX
            ),
        }
    }
}

impl std::error::Error for GenerateError {}

/// Rows of table `name` at scale factor `sf`, slice `part` (0-based) of
/// `parts` (use 0 of 1 for the whole table). Nation and region are tiny and
/// fixed: all their rows are in slice 0 and the other slices are empty.
pub fn rows(
    name: &str,
    sf: f64,
    part: u32,
    parts: u32,
) -> Result<Box<dyn Iterator<Item = Row> + Send>, GenerateError> {
    if !(sf.is_finite() && sf > 0.0 && sf <= MAX_SCALE_FACTOR) {
        return Err(GenerateError::BadScaleFactor(sf));
    }
    if parts == 0 || parts > i32::MAX as u32 || part >= parts {
        return Err(GenerateError::BadPart { part, parts });
    }
    // tpchgen numbers parts from 1.
    let (p, n) = (part as i32 + 1, parts as i32);
    // tpchgen's nation and region generators ignore the slice and always
    // yield the whole table, which would load it `parts` times.
    let whole = part == 0;
    let it: Box<dyn Iterator<Item = Row> + Send> = match name {
        "part" => Box::new(PartGenerator::new(sf, p, n).iter().map(|r| {
            vec![
                Scalar::Int(r.p_partkey),
                Scalar::Str(r.p_name.to_string()),
                Scalar::Str(r.p_mfgr.to_string()),
                Scalar::Str(r.p_brand.to_string()),
                text(r.p_type),
                Scalar::Int(r.p_size.into()),
                text(r.p_container),
                money(r.p_retailprice),
                text(r.p_comment),
            ]
        })),
        "supplier" => Box::new(SupplierGenerator::new(sf, p, n).iter().map(|r| {
            vec![
                Scalar::Int(r.s_suppkey),
                Scalar::Str(r.s_name.to_string()),
                Scalar::Str(r.s_address.to_string()),
                Scalar::Int(r.s_nationkey),
                Scalar::Str(r.s_phone.to_string()),
                money(r.s_acctbal),
                Scalar::Str(r.s_comment),
            ]
        })),
        "partsupp" => Box::new(PartSuppGenerator::new(sf, p, n).iter().map(|r| {
            vec![
                Scalar::Int(r.ps_partkey),
                Scalar::Int(r.ps_suppkey),
                Scalar::Int(r.ps_availqty.into()),
                money(r.ps_supplycost),
                text(r.ps_comment),
            ]
        })),
        "customer" => Box::new(CustomerGenerator::new(sf, p, n).iter().map(|r| {
            vec![
                Scalar::Int(r.c_custkey),
                Scalar::Str(r.c_name.to_string()),
                Scalar::Str(r.c_address.to_string()),
                Scalar::Int(r.c_nationkey),
                Scalar::Str(r.c_phone.to_string()),
                money(r.c_acctbal),
                text(r.c_mktsegment),
                text(r.c_comment),
            ]
        })),
        "orders" => Box::new(OrderGenerator::new(sf, p, n).iter().map(|r| {
            vec![
                Scalar::Int(r.o_orderkey),
                Scalar::Int(r.o_custkey),
                text(r.o_orderstatus.as_str()),
                money(r.o_totalprice),
                date(r.o_orderdate),
                text(r.o_orderpriority),
                Scalar::Str(r.o_clerk.to_string()),
                Scalar::Int(r.o_shippriority.into()),
                text(r.o_comment),
            ]
        })),
        "lineitem" => Box::new(LineItemGenerator::new(sf, p, n).iter().map(|r| {
            vec![
                Scalar::Int(r.l_orderkey),
                Scalar::Int(r.l_partkey),
                Scalar::Int(r.l_suppkey),
                Scalar::Int(r.l_linenumber.into()),
                // tpchgen keeps the quantity as a whole number; the column is
                // decimal(15,2).
                money(TPCHDecimal(r.l_quantity * 100)),
                money(r.l_extendedprice),
                money(r.l_discount),
                money(r.l_tax),
                text(r.l_returnflag),
                text(r.l_linestatus),
                date(r.l_shipdate),
                date(r.l_commitdate),
                date(r.l_receiptdate),
                text(r.l_shipinstruct),
                text(r.l_shipmode),
                text(r.l_comment),
            ]
        })),
        "nation" => Box::new(
            NationGenerator::new(sf, p, n)
                .iter()
                .take(if whole { usize::MAX } else { 0 })
                .map(|r| {
                    vec![
                        Scalar::Int(r.n_nationkey),
                        text(r.n_name),
                        Scalar::Int(r.n_regionkey),
                        text(r.n_comment),
                    ]
                }),
        ),
        "region" => Box::new(
            RegionGenerator::new(sf, p, n)
                .iter()
                .take(if whole { usize::MAX } else { 0 })
                .map(|r| {
                    vec![
                        Scalar::Int(r.r_regionkey),
                        text(r.r_name),
                        text(r.r_comment),
                    ]
                }),
        ),
        other => return Err(GenerateError::UnknownTable(other.to_string())),
    };
    Ok(it)
}

/// Rows of table `name` at scale factor `sf`: exact for every table but
/// lineitem, whose count depends on each order's random line count and is
/// estimated as 4 lines per order (the mean; within 0.3% at SF 0.01 and
/// closer at larger scale). For progress bars. 0 for an unknown table or a
/// bad scale factor.
pub fn row_count(name: &str, sf: f64) -> u64 {
    if !(sf.is_finite() && sf > 0.0 && sf <= MAX_SCALE_FACTOR) {
        return 0;
    }
    let n = match name {
        "part" => PartGenerator::calculate_row_count(sf, 1, 1),
        "supplier" => SupplierGenerator::calculate_row_count(sf, 1, 1),
        // tpchgen's count for partsupp is its part count: 4 suppliers each.
        "partsupp" => 4 * PartSuppGenerator::calculate_row_count(sf, 1, 1),
        "customer" => CustomerGenerator::calculate_row_count(sf, 1, 1),
        "orders" => OrderGenerator::calculate_row_count(sf, 1, 1),
        "lineitem" => 4 * OrderGenerator::calculate_row_count(sf, 1, 1),
        "nation" => 25,
        "region" => 5,
        _ => 0,
    };
    u64::try_from(n).unwrap_or(0)
}

fn text(s: &str) -> Scalar {
    Scalar::Str(s.to_string())
}

fn money(d: TPCHDecimal) -> Scalar {
    Scalar::Decimal {
        value: d.into_inner(),
        scale: 2,
    }
}

fn date(d: TPCHDate) -> Scalar {
    Scalar::Date(d.to_unix_epoch())
}

/// Renders a value as text the way the specification's data files and the
/// stored answers do: decimals with all their scale digits, dates as
/// YYYY-MM-DD.
pub fn render(v: &Scalar) -> String {
    match v {
        Scalar::Null => String::new(),
        Scalar::Bool(b) => b.to_string(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Float(f) => f.to_string(),
        Scalar::Decimal { value, scale } => render_decimal(*value, *scale),
        Scalar::Date(d) => render_date(*d),
        Scalar::Str(s) => s.clone(),
    }
}

/// `value / 10^scale` with exactly `scale` digits after the point.
pub fn render_decimal(value: i64, scale: u8) -> String {
    let digits = value.unsigned_abs().to_string();
    let sign = if value < 0 { "-" } else { "" };
    let scale = scale as usize;
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// Days since 1970-01-01 as YYYY-MM-DD (proleptic Gregorian calendar).
pub fn render_date(days: i32) -> String {
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
