//! Typed tables: a table's schema as the coordinator stores it and sends it
//! to clients. Plain data only: parsing `--schema` text, checking a schema,
//! and the row format it implies live in `insitu-rows`.
//!
//! A table created without a schema is *untyped*: its values are opaque bytes
//! (`Schema` absent from `TableInfo`), as before typed tables existed.

use serde::{Deserialize, Serialize};

/// Most columns a table may have. Why 1024: a row's null bitmap and offset
/// table stay small (128 + 4 KiB at worst) and a plan's column indices fit u16.
pub const MAX_COLUMNS: usize = 1024;
/// Longest column name, in bytes.
pub const MAX_COLUMN_NAME_BYTES: usize = 128;
/// Largest decimal precision: a decimal is stored as an i64 of its unscaled
/// value, and 18 digits always fit one.
pub const MAX_DECIMAL_PRECISION: u8 = 18;

/// The type of a column's values.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColumnType {
    Int32,
    Int64,
    Float64,
    /// A fixed-point number: `precision` digits of which `scale` after the
    /// point; stored as the i64 `value * 10^scale`.
    Decimal {
        precision: u8,
        scale: u8,
    },
    /// Days since 1970-01-01 (Arrow's date32).
    Date32,
    /// UTF-8 text of any length (up to the engine's value limit).
    Utf8,
    Bool,
}

impl ColumnType {
    /// Bytes the value takes in the fixed-width region of a row, or None for a
    /// variable-width type (behind the row's offset table).
    pub fn fixed_width(self) -> Option<usize> {
        match self {
            ColumnType::Int32 | ColumnType::Date32 => Some(4),
            ColumnType::Int64 | ColumnType::Float64 | ColumnType::Decimal { .. } => Some(8),
            ColumnType::Bool => Some(1),
            ColumnType::Utf8 => None,
        }
    }
}

impl std::fmt::Display for ColumnType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ColumnType::Int32 => write!(f, "int32"),
            ColumnType::Int64 => write!(f, "int64"),
            ColumnType::Float64 => write!(f, "float64"),
            ColumnType::Decimal { precision, scale } => write!(f, "decimal({precision},{scale})"),
            ColumnType::Date32 => write!(f, "date32"),
            ColumnType::Utf8 => write!(f, "utf8"),
            ColumnType::Bool => write!(f, "bool"),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub ty: ColumnType,
    /// Whether the column may hold NULL (key columns never do).
    pub nullable: bool,
}

impl Column {
    /// Column `name` of type `ty`, NULL allowed when `nullable`. Why a
    /// constructor: schemas written in code (the TPC-H tables, the `--schema`
    /// parser, tests) name three things per column, nothing to derive.
    pub fn new(name: impl Into<String>, ty: ColumnType, nullable: bool) -> Column {
        Column {
            name: name.into(),
            ty,
            nullable,
        }
    }
}

/// A typed table's columns and primary key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    #[serde(deserialize_with = "crate::limits::columns")]
    pub columns: Vec<Column>,
    /// Indices into `columns` of the primary key, in key order. The key's
    /// encoding (`insitu-rows`) is the object key, so a row is found by its
    /// key with one hash, like any object.
    #[serde(deserialize_with = "crate::limits::columns")]
    pub key: Vec<u16>,
}

impl Schema {
    /// The index of the column named `name`.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// Whether the schema is well formed: 1..=MAX_COLUMNS columns with
    /// distinct, non-empty names of at most MAX_COLUMN_NAME_BYTES; a key of at
    /// least one distinct, non-nullable column; decimals of precision
    /// 1..=18 with scale <= precision. Checked by the coordinator before a
    /// typed table is created and by every reader of a schema.
    pub fn check(&self) -> Result<(), String> {
        if self.columns.is_empty() {
            return Err("a schema needs at least one column".into());
        }
        if self.columns.len() > MAX_COLUMNS {
            return Err(format!(
                "{} columns: more than the limit of {MAX_COLUMNS}",
                self.columns.len()
            ));
        }
        for (i, c) in self.columns.iter().enumerate() {
            if c.name.is_empty() || c.name.len() > MAX_COLUMN_NAME_BYTES {
                return Err(format!(
                    "column {i}: a name needs 1 to {MAX_COLUMN_NAME_BYTES} bytes"
                ));
            }
            if self.columns[..i].iter().any(|o| o.name == c.name) {
                return Err(format!("two columns are named {:?}", c.name));
            }
            if let ColumnType::Decimal { precision, scale } = c.ty
                && (precision == 0 || precision > MAX_DECIMAL_PRECISION || scale > precision)
            {
                return Err(format!(
                    "column {:?}: decimal({precision},{scale}) is not supported \
                     (precision 1 to {MAX_DECIMAL_PRECISION}, scale at most the precision)",
                    c.name
                ));
            }
        }
        if self.key.is_empty() {
            return Err("a schema needs a primary key of at least one column".into());
        }
        for (i, &k) in self.key.iter().enumerate() {
            let Some(c) = self.columns.get(k as usize) else {
                return Err(format!("key column {k} does not exist"));
            };
            if self.key[..i].contains(&k) {
                return Err(format!("column {:?} appears twice in the key", c.name));
            }
            if c.nullable {
                return Err(format!(
                    "key column {:?} is nullable: key columns must be NOT NULL",
                    c.name
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Schema {
    /// The `--schema` text form: `name type [null], ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, c) in self.columns.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{} {}", c.name, c.ty)?;
            if c.nullable {
                write!(f, " null")?;
            }
        }
        Ok(())
    }
}
