//! The interactive SQL shell: statements end with `;` (and may span
//! lines), `\d` lists the tables, `\d TABLE` describes one, `\q`, `quit`,
//! `exit` or Ctrl-D leave. An error is printed and the shell goes on. The
//! history is kept in `~/.insitu_sql_history`.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use std::io::Write;
use std::path::PathBuf;

use datafusion::prelude::SessionContext;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use crate::format::{Format, write_batches};
use crate::provider::InsituTable;

/// Where the history lives: `$HOME/.insitu_sql_history`, or nowhere when
/// there is no home directory.
fn history_path() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".insitu_sql_history"))
}

/// What one complete input asks for.
#[derive(Debug, PartialEq)]
pub enum Command {
    Quit,
    /// `\d`: list the tables.
    ListTables,
    /// `\d NAME`: describe one table.
    Describe(String),
    /// A SQL statement (without its final `;`).
    Sql(String),
}

/// Accumulates input lines into commands: backslash commands and `quit`
/// stand alone on a line; SQL runs once a line ends with `;`.
#[derive(Default, Debug)]
pub struct LineBuffer {
    /// SQL lines read so far of an unfinished statement.
    pending: String,
}

impl LineBuffer {
    /// Whether a statement is under way (the prompt shows it).
    pub fn is_continuing(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Feed one line; a command when the input is complete.
    pub fn push(&mut self, line: &str) -> Option<Command> {
        let t = line.trim();
        if self.pending.is_empty() {
            match t {
                "" => return None,
                "\\q" | "quit" | "exit" | "quit;" | "exit;" => return Some(Command::Quit),
                "\\d" => return Some(Command::ListTables),
                _ => {}
            }
            if let Some(name) = t.strip_prefix("\\d ") {
                return Some(Command::Describe(
                    name.trim().trim_end_matches(';').to_string(),
                ));
            }
        }
        if !self.pending.is_empty() {
            self.pending.push('\n');
        }
        self.pending.push_str(line);
        if t.ends_with(';') {
            let sql = std::mem::take(&mut self.pending);
            let sql = sql.trim().trim_end_matches(';').trim().to_string();
            if sql.is_empty() {
                return None;
            }
            return Some(Command::Sql(sql));
        }
        None
    }
}

/// A statement's result schema and batches, or why it failed.
pub type Answer = Result<(SchemaRef, Vec<RecordBatch>), String>;

/// Run the shell on the terminal until the user leaves. Blocks the calling
/// thread: call it from outside the tokio runtime (`handle` runs the table
/// descriptions), e.g. from `main` with a runtime built by hand. `ctx`
/// lists and describes the tables; `run` runs each statement (the caller
/// chooses the instant each one reads).
pub fn run_shell(
    ctx: &SessionContext,
    format: Format,
    handle: &tokio::runtime::Handle,
    run: &mut dyn FnMut(&str) -> Answer,
) -> Result<(), String> {
    let mut rl = DefaultEditor::new().map_err(|e| format!("cannot start the shell: {e}"))?;
    let history = history_path();
    if let Some(h) = &history {
        // No history yet is normal.
        let _ = rl.load_history(h);
    }
    let mut buf = LineBuffer::default();
    loop {
        let prompt = if buf.is_continuing() {
            "     -> "
        } else {
            "insitu> "
        };
        let line = match rl.readline(prompt) {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => {
                // Ctrl-C drops the statement being typed, like psql.
                buf = LineBuffer::default();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(format!("reading input: {e}")),
        };
        let Some(cmd) = buf.push(&line) else { continue };
        let entry = match &cmd {
            Command::Sql(s) => format!("{s};"),
            _ => line.trim().to_string(),
        };
        let _ = rl.add_history_entry(entry);
        let mut out = std::io::stdout().lock();
        let result = match cmd {
            Command::Quit => break,
            Command::ListTables => list_tables(ctx, &mut out),
            Command::Describe(name) => handle.block_on(describe(ctx, &name, &mut out)),
            Command::Sql(sql) => run(&sql)
                .and_then(|(schema, batches)| write_batches(&schema, &batches, format, &mut out)),
        };
        if let Err(e) = result {
            let _ = writeln!(std::io::stderr(), "error: {e}");
        }
    }
    if let Some(h) = &history {
        let _ = rl.save_history(h);
    }
    Ok(())
}

/// The registered tables' names, sorted.
pub fn table_names(ctx: &SessionContext) -> Vec<String> {
    let mut names = Vec::new();
    for cat in ctx.catalog_names() {
        let Some(c) = ctx.catalog(&cat) else { continue };
        for s in c.schema_names() {
            if s == "information_schema" {
                continue;
            }
            if let Some(schema) = c.schema(&s) {
                names.extend(schema.table_names());
            }
        }
    }
    names.sort();
    names
}

fn list_tables(ctx: &SessionContext, out: &mut dyn Write) -> Result<(), String> {
    for n in table_names(ctx) {
        writeln!(out, "{n}").map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `\d NAME`: one line per column (name, type, NULL or NOT NULL, KEY).
pub async fn describe(ctx: &SessionContext, name: &str, out: &mut dyn Write) -> Result<(), String> {
    let provider = ctx
        .table_provider(name)
        .await
        .map_err(|_| format!("no table named {name:?}"))?;
    let key: Vec<String> = match provider.downcast_ref::<InsituTable>() {
        Some(t) => {
            let s = t.source().schema();
            s.key
                .iter()
                .filter_map(|&k| s.columns.get(k as usize).map(|c| c.name.clone()))
                .collect()
        }
        None => vec![],
    };
    let w = |e: std::io::Error| e.to_string();
    for f in provider.schema().fields() {
        let null = if f.is_nullable() { "NULL" } else { "NOT NULL" };
        let k = if key.contains(f.name()) { " KEY" } else { "" };
        writeln!(
            out,
            "{:<24} {:<20} {null}{k}",
            f.name(),
            f.data_type().to_string()
        )
        .map_err(w)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_span_lines_and_end_with_semicolon() {
        let mut b = LineBuffer::default();
        assert_eq!(b.push("select 1,"), None);
        assert!(b.is_continuing());
        assert_eq!(b.push("  2;"), Some(Command::Sql("select 1,\n  2".into())));
        assert!(!b.is_continuing());
        assert_eq!(b.push("\\d"), Some(Command::ListTables));
        assert_eq!(
            b.push("\\d lineitem"),
            Some(Command::Describe("lineitem".into()))
        );
        assert_eq!(b.push("\\q"), Some(Command::Quit));
        assert_eq!(b.push("quit"), Some(Command::Quit));
        assert_eq!(b.push(";"), None);
        assert_eq!(b.push(""), None);
    }
}
