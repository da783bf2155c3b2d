//! The Arrow form of a typed table's schema. Kept apart from the SQL code so
//! it can move next to the row format later: the server's Arrow pages and the
//! SQL front end must agree on it exactly.

use std::sync::Arc;

use arrow_schema::{DataType, Field, SchemaRef};
use insitu_protocol::schema::{ColumnType, Schema};

/// The Arrow type a column of type `ty` is read as.
pub fn arrow_type(ty: ColumnType) -> DataType {
    match ty {
        ColumnType::Int32 => DataType::Int32,
        ColumnType::Int64 => DataType::Int64,
        ColumnType::Float64 => DataType::Float64,
        ColumnType::Decimal { precision, scale } => DataType::Decimal128(precision, scale as i8),
        ColumnType::Date32 => DataType::Date32,
        ColumnType::Utf8 => DataType::Utf8,
        ColumnType::Bool => DataType::Boolean,
    }
}

/// The Arrow schema of a table's rows: one field per column, in schema order,
/// nullable exactly when the column is.
pub fn arrow_schema(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .columns
        .iter()
        .map(|c| Field::new(&c.name, arrow_type(c.ty), c.nullable))
        .collect();
    Arc::new(arrow_schema::Schema::new(fields))
}
