//! Rows <-> Apache Arrow: the Arrow schema of a table, a builder that turns
//! checked rows into a record batch of some of their columns, the IPC stream
//! bytes a server replies with, and rows of `Scalar`s out of a batch (to load
//! Arrow or Parquet data).

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder,
};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array,
    Int64Array, LargeStringArray, RecordBatch, StringArray, StringViewArray,
};
use arrow_schema::{DataType, Field, SchemaRef};
use insitu_protocol::query::Scalar;
use insitu_protocol::schema::{ColumnType, Schema};

use crate::RowError;
use crate::read::RowRef;

/// The Arrow type of a column type.
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

/// The Arrow schema of a table.
pub fn arrow_schema(schema: &Schema) -> SchemaRef {
    projected_schema(
        schema,
        &(0..schema.columns.len() as u16).collect::<Vec<_>>(),
    )
}

/// The Arrow schema of some columns of a table, in the order given.
pub fn projected_schema(schema: &Schema, columns: &[u16]) -> SchemaRef {
    Arc::new(arrow_schema::Schema::new(
        columns
            .iter()
            .map(|&c| {
                let col = &schema.columns[c as usize];
                Field::new(&col.name, arrow_type(col.ty), col.nullable)
            })
            .collect::<Vec<_>>(),
    ))
}

enum ColBuilder {
    I32(Int32Builder),
    I64(Int64Builder),
    F64(Float64Builder),
    Dec(Decimal128Builder),
    Date(Date32Builder),
    Str(StringBuilder),
    Bool(BooleanBuilder),
}

/// Builds a record batch of some columns from rows, one row at a time.
pub struct BatchBuilder {
    schema: SchemaRef,
    /// Source column per output column.
    columns: Vec<usize>,
    builders: Vec<ColBuilder>,
    rows: usize,
    /// Bytes appended so far (fixed widths + text bytes): the page-size estimate.
    bytes: usize,
    /// Output columns that are text (none: no row's text is validated).
    text_columns: usize,
}

impl BatchBuilder {
    pub fn new(schema: &Schema, columns: &[u16]) -> BatchBuilder {
        let builders: Vec<ColBuilder> = columns
            .iter()
            .map(|&c| match schema.columns[c as usize].ty {
                ColumnType::Int32 => ColBuilder::I32(Int32Builder::new()),
                ColumnType::Int64 => ColBuilder::I64(Int64Builder::new()),
                ColumnType::Float64 => ColBuilder::F64(Float64Builder::new()),
                ColumnType::Decimal { precision, scale } => ColBuilder::Dec(
                    Decimal128Builder::new()
                        .with_precision_and_scale(precision, scale as i8)
                        .expect("Schema::check bounds precision and scale"),
                ),
                ColumnType::Date32 => ColBuilder::Date(Date32Builder::new()),
                ColumnType::Utf8 => ColBuilder::Str(StringBuilder::new()),
                ColumnType::Bool => ColBuilder::Bool(BooleanBuilder::new()),
            })
            .collect();
        let text_columns = builders
            .iter()
            .filter(|b| matches!(b, ColBuilder::Str(_)))
            .count();
        BatchBuilder {
            text_columns,
            schema: projected_schema(schema, columns),
            columns: columns.iter().map(|&c| c as usize).collect(),
            builders,
            rows: 0,
            bytes: 0,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Approximate bytes of the batch built so far.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Append the projected columns of `row`. Fails only for text that is
    /// not UTF-8 (then nothing of the row is appended).
    pub fn append(&mut self, row: &RowRef<'_>) -> Result<(), RowError> {
        // Check text first, so a failure leaves every builder the same length:
        // the row's text validated once (`var_text`), a column on its own only
        // if that fails (another column may be the bad one).
        let all = if self.text_columns > 0 {
            row.var_text()
        } else {
            None
        };
        let text = |c: usize| match all.and_then(|t| row.str_in(c, t)) {
            Some(s) => Ok(s),
            None => row.str(c),
        };
        for (b, &c) in self.builders.iter().zip(&self.columns) {
            if matches!(b, ColBuilder::Str(_)) && !row.is_null(c) {
                text(c)?;
            }
        }
        for (b, &c) in self.builders.iter_mut().zip(&self.columns) {
            let null = row.is_null(c);
            match b {
                ColBuilder::I32(b) => b.append_option((!null).then(|| row.i32(c))),
                ColBuilder::I64(b) => b.append_option((!null).then(|| row.i64(c))),
                ColBuilder::F64(b) => b.append_option((!null).then(|| row.f64(c))),
                ColBuilder::Dec(b) => b.append_option((!null).then(|| i128::from(row.i64(c)))),
                ColBuilder::Date(b) => b.append_option((!null).then(|| row.i32(c))),
                ColBuilder::Bool(b) => b.append_option((!null).then(|| row.bool(c))),
                ColBuilder::Str(b) => {
                    if null {
                        b.append_null()
                    } else {
                        let s = text(c).expect("checked above");
                        self.bytes += s.len();
                        b.append_value(s)
                    }
                }
            }
            self.bytes += 8;
        }
        self.rows += 1;
        Ok(())
    }

    /// The batch of every row appended since the last `finish`. An error,
    /// not a panic, if the rows do not fit the projected schema (a NULL in
    /// a non-nullable column): `RowRef::new` refuses such rows first, so
    /// this is a second line against a reader that did not check.
    pub fn finish(&mut self) -> Result<RecordBatch, RowError> {
        let arrays: Vec<ArrayRef> = self
            .builders
            .iter_mut()
            .map(|b| -> ArrayRef {
                match b {
                    ColBuilder::I32(b) => Arc::new(b.finish()),
                    ColBuilder::I64(b) => Arc::new(b.finish()),
                    ColBuilder::F64(b) => Arc::new(b.finish()),
                    ColBuilder::Dec(b) => Arc::new(b.finish()),
                    ColBuilder::Date(b) => Arc::new(b.finish()),
                    ColBuilder::Str(b) => Arc::new(b.finish()),
                    ColBuilder::Bool(b) => Arc::new(b.finish()),
                }
            })
            .collect();
        let rows = self.rows;
        self.rows = 0;
        self.bytes = 0;
        let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows));
        RecordBatch::try_new_with_options(self.schema.clone(), arrays, &options)
            .map_err(|e| RowError::Arrow(e.to_string()))
    }
}

/// Batches as one Arrow IPC stream (schema message, then the batches).
pub fn to_ipc(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>, RowError> {
    let mut out = Vec::new();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut out, schema)
        .map_err(|e| RowError::Arrow(e.to_string()))?;
    for b in batches {
        w.write(b).map_err(|e| RowError::Arrow(e.to_string()))?;
    }
    w.finish().map_err(|e| RowError::Arrow(e.to_string()))?;
    drop(w);
    Ok(out)
}

/// The batches of an Arrow IPC stream (from an untrusted peer: errors, no
/// panics, no allocation the bytes do not back).
///
/// Why `StreamDecoder` over the bytes, not `StreamReader`: the reader
/// allocates each message body at the length the message claims before
/// reading it, so a damaged length asked for 200 TB and aborted the process
/// (found by the damaged-stream proptest in `tests.rs`); the decoder takes
/// body slices of the bytes it was given and reports a stream that ends
/// early. Why `guarded`: both panic on some damaged streams (a buffer slice
/// past its end, an unknown type).
pub fn from_ipc(bytes: &[u8]) -> Result<Vec<RecordBatch>, RowError> {
    crate::guard::guarded("damaged Arrow IPC stream", || {
        let mut decoder = arrow_ipc::reader::StreamDecoder::new();
        let mut buffer = arrow_buffer::Buffer::from(bytes.to_vec());
        let mut batches = Vec::new();
        while !buffer.is_empty() {
            match decoder.decode(&mut buffer).map_err(|e| e.to_string())? {
                Some(batch) => batches.push(batch),
                None => break,
            }
        }
        decoder.finish().map_err(|e| e.to_string())?;
        Ok(batches)
    })
    .map_err(RowError::Arrow)
}

/// Row `i` of `batch` as `Scalar`s, reading the batch's column `j` for the
/// table column `j` (the batch's columns in schema order), converting Arrow
/// types to the nearest `Scalar` (`coerce` then checks them against the
/// column). Used to load Arrow/Parquet data.
pub fn batch_row(batch: &RecordBatch, i: usize) -> Result<Vec<Scalar>, RowError> {
    batch
        .columns()
        .iter()
        .map(|a| array_value(a.as_ref(), i))
        .collect()
}

fn array_value(a: &dyn Array, i: usize) -> Result<Scalar, RowError> {
    if a.is_null(i) {
        return Ok(Scalar::Null);
    }
    let any = a.as_any();
    macro_rules! get {
        ($t:ty) => {
            any.downcast_ref::<$t>().map(|x| x.value(i))
        };
    }
    Ok(match a.data_type() {
        DataType::Int8 => Scalar::Int(i64::from(get!(arrow_array::Int8Array).expect("type"))),
        DataType::Int16 => Scalar::Int(i64::from(get!(arrow_array::Int16Array).expect("type"))),
        DataType::Int32 => Scalar::Int(i64::from(get!(Int32Array).expect("type"))),
        DataType::Int64 => Scalar::Int(get!(Int64Array).expect("type")),
        DataType::UInt8 => Scalar::Int(i64::from(get!(arrow_array::UInt8Array).expect("type"))),
        DataType::UInt16 => Scalar::Int(i64::from(get!(arrow_array::UInt16Array).expect("type"))),
        DataType::UInt32 => Scalar::Int(i64::from(get!(arrow_array::UInt32Array).expect("type"))),
        DataType::UInt64 => Scalar::Int(
            i64::try_from(get!(arrow_array::UInt64Array).expect("type"))
                .map_err(|_| RowError::Arrow("a uint64 above int64's range".into()))?,
        ),
        DataType::Float32 => {
            Scalar::Float(f64::from(get!(arrow_array::Float32Array).expect("type")))
        }
        DataType::Float64 => Scalar::Float(get!(Float64Array).expect("type")),
        DataType::Decimal128(_, scale) => {
            let v = get!(Decimal128Array).expect("type");
            if *scale < 0 {
                return Err(RowError::Arrow("decimals with a negative scale".into()));
            }
            Scalar::Decimal {
                value: i64::try_from(v)
                    .map_err(|_| RowError::Arrow("a decimal of more than 18 digits".into()))?,
                scale: *scale as u8,
            }
        }
        DataType::Date32 => Scalar::Date(get!(Date32Array).expect("type")),
        DataType::Boolean => Scalar::Bool(get!(BooleanArray).expect("type")),
        DataType::Utf8 => Scalar::Str(get!(StringArray).expect("type").to_string()),
        DataType::LargeUtf8 => Scalar::Str(get!(LargeStringArray).expect("type").to_string()),
        DataType::Utf8View => Scalar::Str(get!(StringViewArray).expect("type").to_string()),
        other => {
            return Err(RowError::Arrow(format!(
                "Arrow type {other} cannot be loaded"
            )));
        }
    })
}
