//! A typed update (`Op::UpdateRows`): columns of every row a filter
//! passes, each set to a value or changed by adding a number. Checked against the
//! schema once (by the client before sending and by each shard before it
//! reads a row), then applied row by row.
//!
//! Never a wrapped, truncated or silently converted value: a `Set` value is
//! converted to the column's type exactly or refused ([`insitu_rows::coerce`]:
//! range, digits after the point, NULL in a NOT NULL column) when the update
//! is compiled; an `Add` whose result leaves the column's type is refused for
//! that row with the column, the row's value and the sum named, so the shard
//! can refuse the whole update before it writes anything.
//!
//! A row is re-encoded whole (`encode_row`): the same bytes a client would
//! write for the new row, so a changed text column moves the variable region
//! correctly and the null bitmap stays exact.

use insitu_protocol::plan::RowAction;
use insitu_protocol::query::{Pred, QueryOutput, QueryPlan, Scalar};
use insitu_protocol::schema::{ColumnType, Schema};
use insitu_rows::{RowRef, coerce, encode_row};

use crate::{Compiled, QueryError, compile};

/// A checked typed update.
pub struct RowUpdate {
    /// The filter, compiled against the schema (the output part is unused).
    compiled: Compiled,
    /// For re-encoding a changed row.
    schema: Schema,
    /// (column, change): each column checked in range, not a key column,
    /// named once.
    set: Vec<(usize, Change)>,
}

/// The action, converted to what the column's type needs.
enum Change {
    /// The new value, already of the column's type (or NULL).
    Set(Scalar),
    /// Add to an integer or date column (days).
    AddInt(i64),
    /// Add to a decimal column: the unscaled delta at the column's scale.
    AddDecimal(i64),
    /// Add to a float column (a finite number).
    AddFloat(f64),
}

fn refuse(m: String) -> QueryError {
    QueryError::Plan(m)
}

/// A filter alone, checked against `schema` and compiled (regexes once):
/// what a typed update or removal decides its rows with.
pub fn compile_filter(schema: &Schema, filter: &[Pred]) -> Result<Compiled, QueryError> {
    let plan = QueryPlan {
        filter: filter.to_vec(),
        output: QueryOutput::Rows {
            columns: Vec::new(),
            order_by: Vec::new(),
            limit: None,
        },
    };
    compile(schema, &plan)
}

impl RowUpdate {
    /// Check the update against `schema` (compiling the filter and its
    /// regexes once), or say why it cannot run.
    pub fn compile(
        schema: &Schema,
        filter: &[Pred],
        set: &[(u16, RowAction)],
    ) -> Result<RowUpdate, QueryError> {
        let compiled = compile_filter(schema, filter)?;
        if set.is_empty() {
            return Err(refuse("an update must change at least one column".into()));
        }
        let mut changes = Vec::with_capacity(set.len());
        for (i, (col, action)) in set.iter().enumerate() {
            if set[..i].iter().any(|(c, _)| c == col) {
                return Err(refuse(format!("update names column #{col} twice")));
            }
            changes.push((*col as usize, Self::change(schema, *col, action)?));
        }
        Ok(RowUpdate {
            compiled,
            schema: schema.clone(),
            set: changes,
        })
    }

    /// One column's action, checked and converted for its type.
    fn change(schema: &Schema, col: u16, action: &RowAction) -> Result<Change, QueryError> {
        let column = schema.columns.get(col as usize).ok_or_else(|| {
            refuse(format!(
                "update of column #{col}: the table has {} columns",
                schema.columns.len()
            ))
        })?;
        if schema.key.contains(&col) {
            return Err(refuse(format!(
                "{} is part of the primary key: an update cannot change a row's key (delete the row and insert it again)",
                column.name
            )));
        }
        let name = &column.name;
        let change = match (action, column.ty) {
            (RowAction::Set(v), _) => {
                Change::Set(coerce(v, column).map_err(|e| refuse(format!("--set: {e}")))?)
            }
            (RowAction::Add(Scalar::Null), _) => {
                return Err(refuse(format!(
                    "cannot add NULL to {name} (every row would become NULL: use --set NULL)"
                )));
            }
            (
                RowAction::Add(Scalar::Int(d)),
                ColumnType::Int32 | ColumnType::Int64 | ColumnType::Date32,
            ) => Change::AddInt(*d),
            (RowAction::Add(d), ColumnType::Decimal { .. }) => match coerce(d, column) {
                Ok(Scalar::Decimal { value, .. }) => Change::AddDecimal(value),
                Ok(other) => unreachable!("coerce gives a decimal column a decimal, not {other:?}"),
                Err(e) => return Err(refuse(format!("--add: {e}"))),
            },
            (RowAction::Add(d), ColumnType::Float64) => match coerce(d, column) {
                Ok(Scalar::Float(f)) if f.is_finite() => Change::AddFloat(f),
                Ok(_) => {
                    return Err(refuse(format!(
                        "cannot add a number that is not finite to {name}"
                    )));
                }
                Err(e) => return Err(refuse(format!("--add: {e}"))),
            },
            (RowAction::Add(d), ColumnType::Int32 | ColumnType::Int64 | ColumnType::Date32) => {
                return Err(refuse(format!(
                    "cannot add {d:?} to {name} of type {}: only a whole number",
                    column.ty
                )));
            }
            (RowAction::Add(_), ty @ (ColumnType::Utf8 | ColumnType::Bool)) => {
                return Err(refuse(format!(
                    "cannot add to {name}: it is {ty}, not a number (use --set)"
                )));
            }
        };
        Ok(change)
    }

    /// The compiled filter and the row layout (to read rows with).
    pub fn compiled(&self) -> &Compiled {
        &self.compiled
    }

    /// Whether the filter is true for the row.
    pub fn matches(&self, row: &RowRef<'_>) -> bool {
        self.compiled.filter(row)
    }

    /// The new bytes of `bytes`: `Ok(None)` when the row does not match;
    /// `Err` when the row does not decode with the schema or cannot take the
    /// change. Every matching row is written, as SQL's UPDATE counts every
    /// row its WHERE passes: one whose only changes are `Add`s meeting NULLs
    /// (which stay NULL) is written unchanged.
    pub fn apply(&self, bytes: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let row = RowRef::new(self.compiled.layout(), bytes).map_err(|e| e.to_string())?;
        if !self.matches(&row) {
            return Ok(None);
        }
        let mut values = Vec::with_capacity(self.schema.columns.len());
        for c in 0..self.schema.columns.len() {
            values.push(row.scalar(c).map_err(|e| e.to_string())?);
        }
        for (col, change) in &self.set {
            if let Some(new) = self.new_value(*col, change, &values[*col])? {
                values[*col] = new;
            }
        }
        encode_row(&self.schema, self.compiled.layout(), &values)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    /// Column `col`'s new value from `current`; `None` when an `Add` meets a
    /// NULL (it stays NULL).
    fn new_value(
        &self,
        col: usize,
        change: &Change,
        current: &Scalar,
    ) -> Result<Option<Scalar>, String> {
        let column = &self.schema.columns[col];
        let name = &column.name;
        Ok(Some(match (change, current) {
            (Change::Set(v), _) => v.clone(),
            (_, Scalar::Null) => return Ok(None),
            (Change::AddInt(d), Scalar::Int(a)) => {
                let sum = a.checked_add(*d).filter(|s| match column.ty {
                    ColumnType::Int32 => i32::try_from(*s).is_ok(),
                    _ => true,
                });
                let sum = sum.ok_or_else(|| {
                    format!(
                        "{name} = {a} plus {d} is {}, out of {}'s range",
                        i128::from(*a) + i128::from(*d),
                        column.ty
                    )
                })?;
                Scalar::Int(sum)
            }
            (Change::AddInt(d), Scalar::Date(a)) => {
                let sum = i64::from(*a)
                    .checked_add(*d)
                    .and_then(|s| i32::try_from(s).ok())
                    .ok_or_else(|| format!("{name} plus {d} days is out of date32's range"))?;
                Scalar::Date(sum)
            }
            (Change::AddDecimal(d), Scalar::Decimal { value, scale }) => {
                let sum = value
                    .checked_add(*d)
                    .ok_or_else(|| format!("{name} plus the delta overflows {}", column.ty))?;
                // Checks the column's precision (digits) on the sum.
                coerce(
                    &Scalar::Decimal {
                        value: sum,
                        scale: *scale,
                    },
                    column,
                )
                .map_err(|e| format!("{name} plus the delta: {e}"))?
            }
            (Change::AddFloat(d), Scalar::Float(a)) => {
                let sum = a + d;
                if a.is_finite() && !sum.is_finite() {
                    return Err(format!("{name} = {a} plus {d} overflows float64"));
                }
                Scalar::Float(sum)
            }
            (_, other) => {
                return Err(format!(
                    "{name} holds {other:?}, which does not fit its type {}",
                    column.ty
                ));
            }
        }))
    }
}

#[cfg(test)]
#[path = "update_tests.rs"]
mod tests;
