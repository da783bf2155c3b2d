//! Writes the 8 TPC-H tables as CSV files (`<table>.csv`, header row first)
//! into a directory: `cargo run -p insitu-tpch --example dump_csv -- DIR [SF]`
//! (SF defaults to 0.01). Decimals keep their two digits, dates are
//! YYYY-MM-DD, fields with a comma, quote or line break are quoted.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use insitu_tpch::generate::render;
use insitu_tpch::{TABLES, rows, schema};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: dump_csv DIR [SF]")?);
    let sf: f64 = match args.next() {
        Some(s) => s.parse().map_err(|e| format!("scale factor {s:?}: {e}"))?,
        None => 0.01,
    };
    std::fs::create_dir_all(&dir)?;
    for table in TABLES {
        let schema = schema(table).ok_or("a listed table has a schema")?;
        let path = dir.join(format!("{table}.csv"));
        let mut out = BufWriter::new(std::fs::File::create(&path)?);
        let header: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
        writeln!(out, "{}", header.join(","))?;
        let mut count = 0u64;
        for row in rows(table, sf, 0, 1)? {
            let fields: Vec<String> = row.iter().map(|v| csv_field(&render(v))).collect();
            writeln!(out, "{}", fields.join(","))?;
            count += 1;
        }
        out.flush()?;
        println!("{table}: {count} rows -> {}", path.display());
    }
    Ok(())
}

/// `s` as one CSV field: quoted (quotes doubled) when it holds a comma, a
/// quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}
