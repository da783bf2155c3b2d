//! Compares a query's result with a stored answer (CSV, header row first).
//!
//! Cells are compared as text, or as numbers when both sides are plain
//! decimal numbers: engines render the same value differently ("12.5" vs
//! "12.50", a float average vs an exact decimal), so numbers are equal within
//! max(ABS_TOLERANCE, REL_TOLERANCE * magnitude). An empty answer cell is SQL
//! NULL and also matches a result rendered as "NULL".

/// Absolute tolerance: half a cent is below the data's money resolution, and
/// TPC-H's own validation accepts a cent of rounding difference.
pub const ABS_TOLERANCE: f64 = 0.01;
/// Relative tolerance for large sums computed in floating point.
pub const REL_TOLERANCE: f64 = 1e-9;

/// Checks `got` (rows of values rendered as text, no header) against
/// `answer_csv` (header row first): same number of rows in the same order,
/// same number of columns, every cell equal (see the module notes). The
/// error names the row (1-based, header excluded) and column of the first
/// difference.
pub fn compare(answer_csv: &str, got: &[Vec<String>]) -> Result<(), String> {
    let mut records = parse_csv(answer_csv)?;
    if records.is_empty() {
        return Err("the answer has no header row".into());
    }
    let header = records.remove(0);
    for (i, row) in records.iter().enumerate() {
        if row.len() != header.len() {
            return Err(format!(
                "answer row {}: {} fields under a header of {}",
                i + 1,
                row.len(),
                header.len()
            ));
        }
    }
    for (i, (want, have)) in records.iter().zip(got).enumerate() {
        if have.len() != want.len() {
            return Err(format!(
                "row {}: {} columns, expected {} ({})",
                i + 1,
                have.len(),
                want.len(),
                header.join(", ")
            ));
        }
        for (j, (w, h)) in want.iter().zip(have).enumerate() {
            if !cells_equal(w, h) {
                return Err(format!(
                    "row {}, column {} ({}): got {h:?}, expected {w:?}",
                    i + 1,
                    j + 1,
                    header[j]
                ));
            }
        }
    }
    if records.len() != got.len() {
        return Err(format!(
            "{} rows, expected {} (the first {} agree)",
            got.len(),
            records.len(),
            records.len().min(got.len())
        ));
    }
    Ok(())
}

/// `compare` against the stored SF 0.01 answer of query `n`, the error
/// prefixed with the query's name.
pub fn compare_sf0_01(n: u32, got: &[Vec<String>]) -> Result<(), String> {
    let answer = crate::answer_sf0_01(n).ok_or_else(|| format!("q{n}: no such TPC-H query"))?;
    compare(answer, got).map_err(|e| format!("q{n:02}: {e}"))
}

fn cells_equal(want: &str, got: &str) -> bool {
    if want == got {
        return true;
    }
    if want.is_empty() && got.eq_ignore_ascii_case("null") {
        return true;
    }
    match (number(want), number(got)) {
        (Some(a), Some(b)) => {
            let tolerance = ABS_TOLERANCE.max(REL_TOLERANCE * a.abs().max(b.abs()));
            (a - b).abs() <= tolerance
        }
        _ => false,
    }
}

/// `s` as a number when it is a plain decimal number: optional sign, digits
/// with an optional fraction, optional exponent. Not "inf" or "NaN" (those
/// are text to this checker), not dates, not phone numbers.
fn number(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'-' | b'+')) {
        i += 1;
    }
    let start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let mut digits = i - start;
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let frac = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        digits += i - frac;
    }
    if digits == 0 {
        return None;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if matches!(b.get(i), Some(b'-' | b'+')) {
            i += 1;
        }
        let exp = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == exp {
            return None;
        }
    }
    if i != b.len() {
        return None;
    }
    s.parse().ok()
}

/// Parses CSV text (RFC 4180): records end at a line break (`\n` or `\r\n`)
/// outside quotes; a field in double quotes may hold commas, line breaks and
/// doubled quotes. A final line break is optional.
pub fn parse_csv(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut line = 1usize;
    // Whether the current field was quoted: it then must end at its closing quote.
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match c {
            '"' if field.is_empty() && !quoted => {
                quoted = true;
                let opened_at = line;
                loop {
                    match chars.next() {
                        None => {
                            return Err(format!(
                                "CSV line {opened_at}: a quoted field is never closed"
                            ));
                        }
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            field.push('"');
                        }
                        Some('"') => break,
                        Some(ch) => {
                            if ch == '\n' {
                                line += 1;
                            }
                            field.push(ch);
                        }
                    }
                }
                match chars.peek() {
                    None | Some(',' | '\n' | '\r') => {}
                    Some(other) => {
                        return Err(format!(
                            "CSV line {line}: {other:?} after a closing quote (expected a comma or line end)"
                        ));
                    }
                }
            }
            '"' => {
                return Err(format!("CSV line {line}: a quote inside an unquoted field"));
            }
            ',' => {
                record.push(std::mem::take(&mut field));
                quoted = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
                quoted = false;
                line += 1;
            }
            _ if quoted => {
                return Err(format!("CSV line {line}: text after a closing quote"));
            }
            _ => field.push(c),
        }
    }
    if !field.is_empty() || !record.is_empty() || quoted {
        record.push(field);
        records.push(record);
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(rows: &[&[&str]]) -> Vec<Vec<String>> {
        rows.iter()
            .map(|r| r.iter().map(|s| s.to_string()).collect())
            .collect()
    }

    #[test]
    fn csv_quotes_commas_and_line_breaks() {
        let text = "a,b,c\n1,\"x, y\",\"say \"\"hi\"\"\"\r\n2,\"two\nlines\",\n\"\"\n";
        let got = parse_csv(text).unwrap();
        assert_eq!(
            got,
            rows(&[
                &["a", "b", "c"],
                &["1", "x, y", "say \"hi\""],
                &["2", "two\nlines", ""],
                &[""],
            ])
        );
        assert_eq!(parse_csv("a,b").unwrap(), rows(&[&["a", "b"]]));
        assert!(parse_csv("a,\"b\n").unwrap_err().contains("never closed"));
        assert!(
            parse_csv("a,\"b\"c\n")
                .unwrap_err()
                .contains("after a closing quote")
        );
        assert!(parse_csv("a,b\"c\n").unwrap_err().contains("unquoted"));
    }

    #[test]
    fn numbers_match_across_renderings() {
        let answer = "name,v,avg,d\nx,12.50,25.575154611454693,1995-03-15\n";
        compare(answer, &rows(&[&["x", "12.5", "25.575155", "1995-03-15"]])).unwrap();
        compare(answer, &rows(&[&["x", "12.509", "25.58", "1995-03-15"]])).unwrap();
        // Large sums: relative tolerance.
        compare("s\n1029418531.523350\n", &rows(&[&["1029418531.5233521"]])).unwrap();
        compare("s\n1e3\n", &rows(&[&["1000.00"]])).unwrap();
        // NULL renders as an empty cell in answers.
        compare("avg_yearly\n\"\"\n", &rows(&[&["NULL"]])).unwrap();
        compare("avg_yearly\n\"\"\n", &rows(&[&[""]])).unwrap();
    }

    #[test]
    fn a_deliberate_mismatch_fails_naming_row_and_column() {
        let answer = "l_returnflag,sum_qty,note\nA,380456.00,\"a, b\"\nN,8971.00,c\n";
        let good = rows(&[&["A", "380456", "a, b"], &["N", "8971", "c"]]);
        compare(answer, &good).unwrap();

        let bad_number = rows(&[&["A", "380456", "a, b"], &["N", "8971.02", "c"]]);
        let e = compare(answer, &bad_number).unwrap_err();
        assert!(e.contains("row 2, column 2 (sum_qty)"), "{e}");

        let bad_text = rows(&[&["A", "380456", "a,b"], &["N", "8971", "c"]]);
        let e = compare(answer, &bad_text).unwrap_err();
        assert!(e.contains("row 1, column 3 (note)"), "{e}");

        let e = compare(answer, &good[..1]).unwrap_err();
        assert!(e.contains("1 rows, expected 2"), "{e}");
        let mut extra = good.clone();
        extra.push(good[0].clone());
        assert!(
            compare(answer, &extra)
                .unwrap_err()
                .contains("3 rows, expected 2")
        );

        let swapped = rows(&[&["N", "8971", "c"], &["A", "380456", "a, b"]]);
        assert!(
            compare(answer, &swapped)
                .unwrap_err()
                .contains("row 1, column 1")
        );

        let short = rows(&[&["A", "380456"], &["N", "8971", "c"]]);
        assert!(
            compare(answer, &short)
                .unwrap_err()
                .contains("2 columns, expected 3")
        );
    }

    #[test]
    fn text_that_looks_numeric_is_not_loosely_equal() {
        // Dates, phone numbers and "NaN" compare as text.
        assert!(compare("d\n1995-03-15\n", &rows(&[&["1995-03-16"]])).is_err());
        assert!(compare("p\n27-918-335-1736\n", &rows(&[&["27-918-335-1737"]])).is_err());
        assert!(compare("x\nNaN\n", &rows(&[&["nan"]])).is_err());
        assert!(compare("x\n\n", &rows(&[&["0"]])).is_err());
    }

    #[test]
    fn the_stored_answers_parse_and_match_themselves() {
        for n in 1..=crate::QUERY_COUNT {
            let answer = crate::answer_sf0_01(n).unwrap();
            let mut records = parse_csv(answer).unwrap();
            records.remove(0);
            compare_sf0_01(n, &records).unwrap();
        }
        let q1 = crate::answer_sf0_01(1).unwrap();
        let mut records = parse_csv(q1).unwrap();
        records.remove(0);
        records[3][9] = "14903".into();
        let e = compare_sf0_01(1, &records).unwrap_err();
        assert!(e.starts_with("q01: row 4, column 10 (count_order)"), "{e}");
    }
}
