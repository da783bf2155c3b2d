//! Text forms: a value of a column parsed from text (`insitu put`, CSV
//! loading), a decimal's text, and the `--schema` / `--key` text of
//! `insitu table create`.

use insitu_protocol::query::Scalar;
use insitu_protocol::schema::{Column, ColumnType, Schema};

use crate::RowError;

/// `value / 10^scale` as text (`-12.05`).
pub fn decimal_text(value: i64, scale: u8) -> String {
    if scale == 0 {
        return value.to_string();
    }
    let p = crate::encode::pow10(scale).unsigned_abs();
    let a = value.unsigned_abs();
    let sign = if value < 0 { "-" } else { "" };
    format!("{sign}{}.{:0width$}", a / p, a % p, width = scale as usize)
}

/// Parse a decimal literal (`-12.5`, `3`, `.25`) exactly at `scale`, or None
/// if it is not a number or has more digits after the point than `scale`
/// (beyond trailing zeros).
pub fn parse_decimal(text: &str, scale: u8) -> Option<i64> {
    let t = text.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac = frac.trim_end_matches('0');
    if frac.len() > scale as usize {
        return None;
    }
    let mut v: i64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    v = v.checked_mul(crate::encode::pow10(scale))?;
    if !frac.is_empty() {
        let f: i64 = frac.parse().ok()?;
        v = v.checked_add(f * crate::encode::pow10(scale - frac.len() as u8))?;
    }
    Some(if neg { -v } else { v })
}

/// A value of `column` from its text; `None` text = NULL.
pub fn parse_value(text: Option<&str>, column: &Column) -> Result<Scalar, RowError> {
    let Some(text) = text else {
        return crate::encode::coerce(&Scalar::Null, column);
    };
    let bad = |what: &str| RowError::Type {
        column: column.name.clone(),
        message: format!("{text:?} is not {what}"),
    };
    let value = match column.ty {
        ColumnType::Int32 | ColumnType::Int64 => {
            Scalar::Int(text.trim().parse().map_err(|_| bad("an integer"))?)
        }
        ColumnType::Float64 => Scalar::Float(text.trim().parse().map_err(|_| bad("a number"))?),
        ColumnType::Decimal { scale, .. } => Scalar::Decimal {
            value: parse_decimal(text, scale).ok_or_else(|| {
                bad(&format!(
                    "a decimal with at most {scale} digits after the point"
                ))
            })?,
            scale,
        },
        ColumnType::Date32 => {
            Scalar::Date(crate::date::parse_date(text).ok_or_else(|| bad("a date (YYYY-MM-DD)"))?)
        }
        ColumnType::Utf8 => Scalar::Str(text.to_string()),
        ColumnType::Bool => Scalar::Bool(match text.trim().to_ascii_lowercase().as_str() {
            "true" | "t" | "1" | "yes" => true,
            "false" | "f" | "0" | "no" => false,
            _ => return Err(bad("a boolean (true/false)")),
        }),
    };
    crate::encode::coerce(&value, column)
}

/// A column type from its name: `int32`, `int64`, `float64`, `decimal(P,S)`,
/// `date32`, `utf8`, `bool` (and the SQL spellings `int`/`integer`,
/// `bigint`, `double`, `date`, `text`/`varchar`/`string`, `boolean`).
pub fn parse_type(text: &str) -> Result<ColumnType, String> {
    let t = text.trim().to_ascii_lowercase();
    Ok(match t.as_str() {
        "int32" | "int" | "integer" => ColumnType::Int32,
        "int64" | "bigint" => ColumnType::Int64,
        "float64" | "double" | "float" => ColumnType::Float64,
        "date32" | "date" => ColumnType::Date32,
        "utf8" | "text" | "varchar" | "string" => ColumnType::Utf8,
        "bool" | "boolean" => ColumnType::Bool,
        _ => {
            let inner = t
                .strip_prefix("decimal(")
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| {
                    format!(
                        "unknown type {text:?} (types: int32, int64, float64, decimal(P,S), date32, utf8, bool)"
                    )
                })?;
            let (p, s) = inner
                .split_once(',')
                .ok_or_else(|| format!("{text:?}: write decimal(PRECISION,SCALE)"))?;
            let precision = p
                .trim()
                .parse()
                .map_err(|_| format!("{text:?}: bad precision"))?;
            let scale = s
                .trim()
                .parse()
                .map_err(|_| format!("{text:?}: bad scale"))?;
            ColumnType::Decimal { precision, scale }
        }
    })
}

/// A schema from `--schema 'name type [null|not null], ...'` and `--key
/// a,b`. Columns are NOT NULL unless marked `null`. Checked
/// (`Schema::check`).
pub fn parse_schema(columns: &str, key: &str) -> Result<Schema, String> {
    let mut out = Vec::new();
    // Split on commas outside parentheses (decimal(15,2) holds one).
    let mut depth = 0;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, ch) in columns.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&columns[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&columns[start..]);
    for part in parts {
        // `decimal(15, 2)`: drop blanks inside parentheses so the type is one word.
        let mut depth = 0;
        let part: String = part
            .chars()
            .filter(|&ch| {
                match ch {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                !(depth > 0 && ch.is_whitespace())
            })
            .collect();
        let words: Vec<&str> = part.split_whitespace().collect();
        if words.is_empty() {
            return Err("an empty column in --schema (two commas in a row?)".into());
        }
        if words.len() < 2 {
            return Err(format!(
                "column {:?}: write `NAME TYPE [null]`",
                part.trim()
            ));
        }
        let ty = parse_type(words[1])?;
        let rest: Vec<String> = words[2..].iter().map(|w| w.to_ascii_lowercase()).collect();
        let nullable = match rest
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            [] | ["not", "null"] => false,
            ["null"] => true,
            other => {
                return Err(format!(
                    "column {:?}: unexpected {:?} (expected `null` or `not null`)",
                    words[0],
                    other.join(" ")
                ));
            }
        };
        out.push(Column::new(words[0], ty, nullable));
    }
    let key: Vec<&str> = key.split(',').map(str::trim).collect();
    schema_with_key(out, &key)
}

/// A schema of `columns` whose primary key is the columns named `key`, in
/// that order. Checked (`Schema::check`).
pub fn schema_with_key(columns: Vec<Column>, key: &[&str]) -> Result<Schema, String> {
    let mut schema = Schema {
        columns,
        key: Vec::new(),
    };
    for name in key {
        let index = schema
            .column_index(name)
            .ok_or_else(|| format!("key column {name:?} is not in the schema"))?;
        schema.key.push(index as u16);
    }
    schema.check()?;
    Ok(schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_parse_exactly_or_not_at_all() {
        assert_eq!(parse_decimal("12.5", 2), Some(1250));
        assert_eq!(parse_decimal("-0.05", 2), Some(-5));
        assert_eq!(parse_decimal(".25", 2), Some(25));
        assert_eq!(parse_decimal("7", 2), Some(700));
        assert_eq!(parse_decimal("1.230", 2), Some(123));
        assert_eq!(parse_decimal("1.234", 2), None);
        assert_eq!(parse_decimal("1e5", 2), None);
        assert_eq!(parse_decimal("", 2), None);
        assert_eq!(parse_decimal("99999999999999999999", 2), None);
        assert_eq!(decimal_text(-5, 2), "-0.05");
        assert_eq!(decimal_text(123456, 2), "1234.56");
    }

    #[test]
    fn schema_text() {
        let s = parse_schema(
            "l_orderkey int64, l_linenumber int32, l_price decimal(15, 2), l_comment utf8 null",
            "l_orderkey, l_linenumber",
        )
        .unwrap();
        assert_eq!(s.columns.len(), 4);
        assert_eq!(s.key, vec![0, 1]);
        assert_eq!(
            s.columns[2].ty,
            ColumnType::Decimal {
                precision: 15,
                scale: 2
            }
        );
        assert!(s.columns[3].nullable);
        assert!(
            parse_schema("a int64", "b")
                .unwrap_err()
                .contains("not in the schema")
        );
        assert!(
            parse_schema("a int65", "a")
                .unwrap_err()
                .contains("unknown type")
        );
        assert!(
            parse_schema("a int64 null", "a")
                .unwrap_err()
                .contains("nullable")
        );
        assert!(
            parse_schema("a int64, a utf8", "a")
                .unwrap_err()
                .contains("two columns")
        );
        assert!(
            parse_schema("a decimal(40,2)", "a")
                .unwrap_err()
                .contains("not supported")
        );
    }
}
