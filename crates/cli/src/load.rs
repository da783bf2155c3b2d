//! `insitu load` of an untyped table: CSV `key,value` lines or JSON lines
//! `{"key": .., "value": ..}`, written in batches of multiWrites with a
//! progress bar (typed tables load through `typed.rs`).

use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use insitu_client::Client;

/// Parse one input line into (key, value). CSV `key,value` (value may hold
/// further commas, and may be quoted) or a JSON object with "key" and "value".
fn parse_line(line: &str, json: bool) -> anyhow::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.trim().is_empty() {
        return Ok(None);
    }
    if json {
        let v: serde_json::Value = serde_json::from_str(line).context("not valid JSON")?;
        let field = |name: &str| -> anyhow::Result<Vec<u8>> {
            match v.get(name) {
                Some(serde_json::Value::String(s)) => Ok(s.as_bytes().to_vec()),
                Some(serde_json::Value::Null) | None => bail!("missing \"{name}\""),
                Some(other) => Ok(other.to_string().into_bytes()),
            }
        };
        return Ok(Some((field("key")?, field("value")?)));
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(line.as_bytes());
    let record = match reader.byte_records().next() {
        Some(r) => r.context("not valid CSV")?,
        None => return Ok(None),
    };
    if record.len() < 2 {
        bail!("expected `key,value`, found {} field(s)", record.len());
    }
    let key = record[0].to_vec();
    // Everything after the first field is the value, commas included.
    let value = if record.len() == 2 {
        record[1].to_vec()
    } else {
        record.iter().skip(1).collect::<Vec<_>>().join(&b","[..])
    };
    Ok(Some((key, value)))
}

/// What one batch of `load` achieved.
struct BatchOutcome {
    /// Objects of the batch the servers stored.
    written: u64,
    /// Why the batch (or part of it) failed: the first failing key's error,
    /// or the whole request's.
    failed: Option<String>,
}

async fn write_batch(client: &Client, table: u64, batch: &[(Vec<u8>, Vec<u8>)]) -> BatchOutcome {
    let results = match client.multi_write(table, batch).await {
        Ok(r) => r,
        Err(e) => {
            return BatchOutcome {
                written: 0,
                failed: Some(format!("the whole batch failed: {e}")),
            };
        }
    };
    let mut outcome = BatchOutcome {
        written: 0,
        failed: None,
    };
    let mut failures = 0u64;
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(_) => outcome.written += 1,
            Err(e) => {
                failures += 1;
                if outcome.failed.is_none() {
                    outcome.failed = Some(format!(
                        "writing key {:?}: {e}",
                        String::from_utf8_lossy(&batch[i].0)
                    ));
                }
            }
        }
    }
    if failures > 1
        && let Some(why) = &mut outcome.failed
    {
        why.push_str(&format!(
            " (and {} more keys of the batch failed)",
            failures - 1
        ));
    }
    outcome
}

pub(crate) async fn load(
    client: &Client,
    table: u64,
    path: &Path,
    batch: usize,
) -> anyhow::Result<()> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let total_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    let json = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("json" | "jsonl" | "ndjson")
    );
    let bar = ProgressBar::new(total_bytes);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut reader = std::io::BufReader::new(file);
    let mut line = String::new();
    let mut pending: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(batch);
    // Objects written, input lines read, batches sent: for the progress
    // bar and for saying how far a failed load got.
    let (mut loaded, mut line_no, mut batches) = (0u64, 0u64, 0u64);
    // The input line of the current batch's first object: where a load
    // interrupted by a bad line left off.
    let mut batch_first_line = 1u64;
    let started = Instant::now();
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .with_context(|| format!("reading {} line {}", path.display(), line_no + 1))?;
        if n > 0 {
            line_no += 1;
            bar.inc(n as u64);
            match parse_line(&line, json) {
                Ok(Some(kv)) => {
                    if pending.is_empty() {
                        batch_first_line = line_no;
                    }
                    pending.push(kv);
                }
                Ok(None) => {}
                Err(e) => {
                    bar.finish_and_clear();
                    let written = match loaded {
                        0 => "nothing was written".to_string(),
                        n if batches == 1 => format!("{n} objects were written (batch 1)"),
                        n => format!("{n} objects were written (batches 1 to {batches})"),
                    };
                    bail!(
                        "{} line {line_no}: {e:#}; load stopped there: {written}, \
                         nothing from line {} on",
                        path.display(),
                        if pending.is_empty() {
                            line_no
                        } else {
                            batch_first_line
                        }
                    );
                }
            }
        }
        if pending.len() >= batch || (n == 0 && !pending.is_empty()) {
            batches += 1;
            let written = write_batch(client, table, &pending).await;
            loaded += written.written;
            if let Some(why) = written.failed {
                bar.finish_and_clear();
                bail!(
                    "load stopped at batch {batches} ({} objects, ending at {} line {line_no}): {why}; \
                     {loaded} objects were written ({} of them from this batch), lines after {line_no} were not read",
                    pending.len(),
                    path.display(),
                    written.written,
                );
            }
            pending.clear();
            bar.set_message(format!("{loaded} objects"));
        }
        if n == 0 {
            break;
        }
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    crate::outln!(
        "loaded {loaded} objects in {secs:.2} s ({:.0} objects/s)",
        loaded as f64 / secs.max(1e-9)
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_line;

    #[test]
    fn csv_lines_keep_commas_in_values() {
        assert_eq!(
            parse_line("k,v\n", false).unwrap(),
            Some((b"k".to_vec(), b"v".to_vec()))
        );
        assert_eq!(
            parse_line("k,a,b", false).unwrap(),
            Some((b"k".to_vec(), b"a,b".to_vec()))
        );
        assert_eq!(
            parse_line("\"k,1\",\"x y\"", false).unwrap(),
            Some((b"k,1".to_vec(), b"x y".to_vec()))
        );
        assert_eq!(parse_line("   \n", false).unwrap(), None);
        assert!(parse_line("onlykey", false).is_err());
    }

    #[test]
    fn json_lines_need_key_and_value() {
        assert_eq!(
            parse_line(r#"{"key":"a","value":"b"}"#, true).unwrap(),
            Some((b"a".to_vec(), b"b".to_vec()))
        );
        assert_eq!(
            parse_line(r#"{"key":"a","value":7}"#, true).unwrap(),
            Some((b"a".to_vec(), b"7".to_vec()))
        );
        assert!(parse_line(r#"{"key":"a"}"#, true).is_err());
        assert!(parse_line("{not json", true).is_err());
    }
}
