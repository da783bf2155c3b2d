//! Reading one row: a checked view (`RowRef`) whose accessors cannot fail.

use insitu_protocol::query::Scalar;
use insitu_protocol::schema::ColumnType;

use crate::RowError;
use crate::layout::{ROW_TAG, RowLayout, Slot};

/// A row checked against its layout: the tag, the length of the fixed part,
/// every offset of the offset table (non-decreasing, inside the row) and
/// no NOT NULL column marked NULL.
/// After `new` succeeds no accessor can read out of bounds.
///
/// `new_fixed` checks only the tag and the length (the fixed region and the
/// offset table are inside the row), for a filter that reads fixed-width
/// columns only: most rows of a selective scan are rejected without
/// reading their offset table, and `check_vars` finishes the check for the
/// rows that pass. No accessor can panic on a row `new_fixed` accepted
/// either: `var` reads a bad offset table as an empty value.
#[derive(Clone, Copy, Debug)]
pub struct RowRef<'a> {
    bytes: &'a [u8],
    layout: &'a RowLayout,
}

impl<'a> RowRef<'a> {
    #[inline]
    pub fn new(layout: &'a RowLayout, bytes: &'a [u8]) -> Result<RowRef<'a>, RowError> {
        let row = RowRef::new_fixed(layout, bytes)?;
        row.check_vars()?;
        Ok(row)
    }

    /// The tag and the length checked, not the offset table (see above).
    #[inline]
    pub fn new_fixed(layout: &'a RowLayout, bytes: &'a [u8]) -> Result<RowRef<'a>, RowError> {
        if bytes.first() != Some(&ROW_TAG) || bytes.len() < layout.var_start() {
            return Err(bad_header(layout, bytes));
        }
        Ok(RowRef { bytes, layout })
    }

    /// The rest of `new`'s check: every offset table entry non-decreasing
    /// and inside the row's variable region, and no NOT NULL column marked
    /// NULL.
    #[inline]
    pub fn check_vars(&self) -> Result<(), RowError> {
        // In bounds: new_fixed checked bytes.len() >= var_start > bitmap.
        let bitmap = &self.bytes[1..1 + self.layout.bitmap_bytes];
        let mut null_in_not_null = false;
        for (b, m) in bitmap.iter().zip(&self.layout.not_null_bits) {
            null_in_not_null |= b & m != 0;
        }
        if null_in_not_null {
            return Err(bad_nulls(self.layout, self.bytes));
        }
        let var_start = self.layout.var_start();
        // In bounds: new_fixed checked bytes.len() >= var_start.
        let table = &self.bytes[self.layout.fixed_end..var_start];
        let var_len = self.bytes.len() - var_start;
        let mut prev = 0usize;
        // Every entry checked without an early exit: a handful of loads
        // and compares, no branch per entry on the hot path.
        let mut bad = false;
        for entry in table.chunks_exact(4) {
            let end = u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]) as usize;
            bad |= end < prev || end > var_len;
            prev = end;
        }
        if bad {
            return Err(bad_table(self.layout, self.bytes));
        }
        Ok(())
    }

    pub fn layout(&self) -> &'a RowLayout {
        self.layout
    }

    /// The row's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    #[inline]
    pub fn is_null(&self, col: usize) -> bool {
        self.bytes[1 + col / 8] & (1 << (col % 8)) != 0
    }

    #[inline]
    fn fixed<const N: usize>(&self, col: usize) -> [u8; N] {
        match self.layout.slots[col] {
            Slot::Fixed { offset, width } => {
                debug_assert_eq!(width, N);
                self.bytes[offset..offset + N]
                    .try_into()
                    .expect("checked width")
            }
            Slot::Var { .. } => panic!("column {col} is not fixed-width"),
        }
    }

    /// An int32 or date32 column (0 when NULL).
    #[inline]
    pub fn i32(&self, col: usize) -> i32 {
        i32::from_le_bytes(self.fixed::<4>(col))
    }

    /// An int64 or decimal (unscaled) column (0 when NULL).
    #[inline]
    pub fn i64(&self, col: usize) -> i64 {
        i64::from_le_bytes(self.fixed::<8>(col))
    }

    #[inline]
    pub fn f64(&self, col: usize) -> f64 {
        f64::from_le_bytes(self.fixed::<8>(col))
    }

    #[inline]
    pub fn bool(&self, col: usize) -> bool {
        self.fixed::<1>(col)[0] != 0
    }

    /// The bytes of a variable-width column (empty when NULL). Always
    /// inlined: a grouped scan calls it per row per text column, and as a
    /// call it was a twelfth of TPC-H Q1's time.
    #[inline(always)]
    pub fn var(&self, col: usize) -> &'a [u8] {
        let (start, end) = self.var_bounds(col);
        let base = self.layout.var_start();
        // Empty for a bad offset table: only a row from `new_fixed` whose
        // `check_vars` was not called can have one.
        self.bytes.get(base + start..base + end).unwrap_or_default()
    }

    /// Where a variable-width column's bytes are in the variable region
    /// (as the offset table says: unchecked unless the row was).
    #[inline(always)]
    fn var_bounds(&self, col: usize) -> (usize, usize) {
        let Slot::Var { index } = self.layout.slots[col] else {
            panic!("column {col} is not variable-width");
        };
        let table = self.layout.fixed_end;
        let end_of = |i: usize| {
            let at = table + 4 * i;
            u32::from_le_bytes(self.bytes[at..at + 4].try_into().expect("4 bytes")) as usize
        };
        let start = if index == 0 { 0 } else { end_of(index - 1) };
        (start, end_of(index))
    }

    /// The whole variable region as text, when it is valid UTF-8 (every
    /// variable-width column is text): one validation for all of a row's
    /// text, then `str_in` per column. Why: a page of rows validated each
    /// text column twice (a check, then the copy), a seventh of a
    /// text-heavy scan's time.
    pub fn var_text(&self) -> Option<&'a str> {
        std::str::from_utf8(&self.bytes[self.layout.var_start()..]).ok()
    }

    /// Column `col`'s text within `all` (this row's `var_text`): None when
    /// its offsets are not character boundaries there (then its bytes are
    /// not valid UTF-8 on their own) or lie outside.
    #[inline]
    pub fn str_in(&self, col: usize, all: &'a str) -> Option<&'a str> {
        let (start, end) = self.var_bounds(col);
        all.get(start..end)
    }

    /// A text column as `&str`, or an error if its bytes are not UTF-8.
    pub fn str(&self, col: usize) -> Result<&'a str, RowError> {
        std::str::from_utf8(self.var(col))
            .map_err(|_| RowError::Malformed(format!("column {col} is not valid UTF-8")))
    }

    /// Column `col` as a `Scalar` (allocates for text; for results and
    /// reference checks, not the hot path).
    pub fn scalar(&self, col: usize) -> Result<Scalar, RowError> {
        if self.is_null(col) {
            return Ok(Scalar::Null);
        }
        Ok(match self.layout.types[col] {
            ColumnType::Int32 => Scalar::Int(i64::from(self.i32(col))),
            ColumnType::Int64 => Scalar::Int(self.i64(col)),
            ColumnType::Float64 => Scalar::Float(self.f64(col)),
            ColumnType::Decimal { scale, .. } => Scalar::Decimal {
                value: self.i64(col),
                scale,
            },
            ColumnType::Date32 => Scalar::Date(self.i32(col)),
            ColumnType::Bool => Scalar::Bool(self.bool(col)),
            ColumnType::Utf8 => Scalar::Str(self.str(col)?.to_string()),
        })
    }
}

/// Why `new_fixed` refused a row (cold: built only for a bad row).
#[cold]
fn bad_header(layout: &RowLayout, bytes: &[u8]) -> RowError {
    if bytes.first() != Some(&ROW_TAG) {
        return RowError::Malformed(
            "not a typed row (first byte is not the row tag): was it written without the schema?"
                .into(),
        );
    }
    RowError::Malformed(format!(
        "{} bytes, shorter than the {} bytes every row of this schema has",
        bytes.len(),
        layout.var_start()
    ))
}

/// Which NOT NULL column `check_vars` found marked NULL (cold).
#[cold]
fn bad_nulls(layout: &RowLayout, bytes: &[u8]) -> RowError {
    let column = (0..layout.types.len())
        .find(|&c| bytes[1 + c / 8] & layout.not_null_bits[c / 8] & (1 << (c % 8)) != 0)
        .unwrap_or(0);
    RowError::Malformed(format!(
        "column {column} is declared NOT NULL but the row marks it NULL"
    ))
}

/// Which offset table entry `check_vars` refused (cold).
#[cold]
fn bad_table(layout: &RowLayout, bytes: &[u8]) -> RowError {
    let var_len = bytes.len() - layout.var_start();
    let mut prev = 0usize;
    for i in 0..layout.var_count {
        let at = layout.fixed_end + 4 * i;
        let end = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        if end < prev || end > var_len {
            return RowError::Malformed(format!(
                "offset table entry {i} ({end}) is outside the row's {var_len} variable bytes"
            ));
        }
        prev = end;
    }
    RowError::Malformed("bad offset table".into())
}
