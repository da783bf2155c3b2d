//! Printing query results: `table` (aligned text), `csv` (with a header
//! line), `json` (newline-delimited: one JSON object per row, so a consumer
//! can stream it) and `arrow` (an Arrow IPC stream: schema, then batches).

use std::io::Write;
use std::str::FromStr;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

/// An output format of `insitu sql`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Table,
    Csv,
    /// One JSON object per line.
    Json,
    /// Arrow IPC stream bytes.
    Arrow,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "table" => Ok(Format::Table),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            "arrow" => Ok(Format::Arrow),
            other => Err(format!(
                "unknown format {other:?} (table, csv, json or arrow)"
            )),
        }
    }
}

/// Write `batches` (all of `schema`) to `out` in `format`.
pub fn write_batches(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    format: Format,
    out: &mut dyn Write,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("writing the result: {e}");
    match format {
        Format::Table => {
            let t = arrow_cast::pretty::pretty_format_batches_with_schema(schema.clone(), batches)
                .map_err(|e| err(&e))?;
            writeln!(out, "{t}").map_err(|e| err(&e))?;
        }
        Format::Csv => {
            let mut w = arrow_csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut *out);
            if batches.is_empty() {
                // Still print the header line.
                w.write(&RecordBatch::new_empty(schema.clone()))
                    .map_err(|e| err(&e))?;
            }
            for b in batches {
                w.write(b).map_err(|e| err(&e))?;
            }
        }
        Format::Json => {
            let mut w = arrow_json::LineDelimitedWriter::new(&mut *out);
            for b in batches {
                w.write(b).map_err(|e| err(&e))?;
            }
            w.finish().map_err(|e| err(&e))?;
        }
        Format::Arrow => {
            let mut w =
                arrow_ipc::writer::StreamWriter::try_new(&mut *out, schema).map_err(|e| err(&e))?;
            for b in batches {
                w.write(b).map_err(|e| err(&e))?;
            }
            w.finish().map_err(|e| err(&e))?;
        }
    }
    out.flush().map_err(|e| err(&e))
}
