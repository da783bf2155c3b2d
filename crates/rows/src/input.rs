//! Input columns matched to a table's columns by name: what `insitu load`
//! (CSV with a header line, Parquet) and the Python client's `insert_arrow`
//! share, so the same input is accepted or refused the same way by both.

use arrow_array::RecordBatch;
use insitu_protocol::query::Scalar;
use insitu_protocol::schema::Schema;

use crate::RowError;
use crate::arrow::batch_row;

/// For each column of the table, where the input holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnMap {
    /// Per table column (schema order): its index among the input's
    /// columns, or None when the input lacks it (it is then NULL, which only
    /// a nullable column accepts: checked in `new`).
    from: Vec<Option<usize>>,
}

impl ColumnMap {
    /// Match the input's column `names` to `schema`'s. Refused: a name the
    /// table lacks (a typo would otherwise drop data silently) and a NOT
    /// NULL column the input lacks.
    pub fn new(schema: &Schema, names: &[String]) -> Result<ColumnMap, RowError> {
        for n in names {
            if schema.column_index(n).is_none() {
                return Err(RowError::Input(format!(
                    "the input has a column {n:?} that the table does not (columns: {schema})"
                )));
            }
        }
        let from = schema
            .columns
            .iter()
            .map(|c| {
                let at = names.iter().position(|n| *n == c.name);
                if at.is_none() && !c.nullable {
                    return Err(RowError::Input(format!(
                        "the input has no column {:?}, which is NOT NULL",
                        c.name
                    )));
                }
                Ok(at)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ColumnMap { from })
    }

    /// The map of Arrow data's columns (by their field names).
    pub fn of_arrow(schema: &Schema, input: &arrow_schema::Schema) -> Result<ColumnMap, RowError> {
        let names: Vec<String> = input.fields().iter().map(|f| f.name().clone()).collect();
        ColumnMap::new(schema, &names)
    }

    /// The map of a batch's columns.
    pub fn of_batch(schema: &Schema, batch: &RecordBatch) -> Result<ColumnMap, RowError> {
        ColumnMap::of_arrow(schema, &batch.schema())
    }

    /// Where the input holds each table column (None: absent, NULL).
    pub fn sources(&self) -> &[Option<usize>] {
        &self.from
    }

    /// A table row (schema order) from one input row of values.
    pub fn row(&self, input: &[Scalar]) -> Vec<Scalar> {
        self.from
            .iter()
            .map(|at| {
                at.and_then(|j| input.get(j).cloned())
                    .unwrap_or(Scalar::Null)
            })
            .collect()
    }

    /// Every row of `batch` (whose columns this map was made for) as table
    /// rows, the batch's first row being input row number `first` (a value
    /// Arrow cannot hand over is refused naming its row). The values are
    /// checked against their columns when encoded.
    pub fn batch_rows(
        &self,
        batch: &RecordBatch,
        first: u64,
    ) -> Result<Vec<Vec<Scalar>>, RowError> {
        (0..batch.num_rows())
            .zip(first..)
            .map(|(i, n)| {
                batch_row(batch, i)
                    .map(|all| self.row(&all))
                    .map_err(|e| RowError::Input(format!("row {n}: {e}")))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, StringArray, UInt64Array};
    use insitu_protocol::query::Scalar;

    use super::*;
    use crate::text::parse_schema;

    fn schema() -> Schema {
        parse_schema("id int64, name utf8, note utf8 null", "id").unwrap()
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn columns_are_matched_by_name_and_a_missing_nullable_one_is_null() {
        let map = ColumnMap::new(&schema(), &names(&["name", "id"])).unwrap();
        assert_eq!(map.sources(), &[Some(1), Some(0), None]);
        let row = map.row(&[Scalar::Str("a".into()), Scalar::Int(7)]);
        assert_eq!(
            row,
            vec![Scalar::Int(7), Scalar::Str("a".into()), Scalar::Null]
        );
    }

    #[test]
    fn an_unknown_column_and_a_missing_not_null_one_are_refused_by_name() {
        let e = ColumnMap::new(&schema(), &names(&["id", "name", "nmae"])).unwrap_err();
        assert!(e.to_string().contains("\"nmae\""), "{e}");
        let e = ColumnMap::new(&schema(), &names(&["id", "note"])).unwrap_err();
        assert!(e.to_string().contains("\"name\", which is NOT NULL"), "{e}");
    }

    #[test]
    fn a_batch_value_arrow_cannot_hand_over_names_its_input_row() {
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("id", Arc::new(UInt64Array::from(vec![1, u64::MAX]))),
            ("name", Arc::new(StringArray::from(vec!["a", "b"]))),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let map = ColumnMap::of_batch(&schema(), &batch).unwrap();
        let e = map.batch_rows(&batch, 41).unwrap_err();
        assert!(e.to_string().starts_with("row 42: "), "{e}");

        let columns: Vec<(&str, ArrayRef)> = vec![
            ("name", Arc::new(StringArray::from(vec!["a", "b"]))),
            ("id", Arc::new(Int64Array::from(vec![1, 2]))),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let map = ColumnMap::of_batch(&schema(), &batch).unwrap();
        assert_eq!(
            map.batch_rows(&batch, 1).unwrap()[1],
            vec![Scalar::Int(2), Scalar::Str("b".into()), Scalar::Null]
        );
    }
}
