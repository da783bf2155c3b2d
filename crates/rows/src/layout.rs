//! The row format of a typed table: where each column's bytes are.
//!
//! # Byte layout of one row (the object's value)
//!
//! ```text
//! offset 0          : u8  format tag, ROW_TAG (0xA1)
//! 1 .. 1+B          : null bitmap, B = ceil(columns / 8); bit c (byte c/8,
//!                     bit c%8) set = column c is NULL
//! 1+B .. F          : the fixed-width columns in schema order, each at the
//!                     fixed offset `Slot::Fixed { offset }`, little-endian:
//!                     int32/date32 4 bytes, int64/float64/decimal 8 bytes
//!                     (decimal: the unscaled i64), bool 1 byte (0 or 1);
//!                     a NULL fixed column holds zeros
//! F .. F+4V         : offset table, one u32 LE per variable-width column
//!                     (utf8) in schema order: the END of its bytes, relative
//!                     to the start of the variable region; a column starts
//!                     where the previous one ends (the first at 0)
//! F+4V ..           : the variable region (the utf8 bytes back to back)
//! ```
//!
//! Why this shape: a predicate on a fixed column reads 1 bitmap byte and the
//! column's bytes at an offset known when the plan is compiled, without
//! touching the rest of the row; a text column costs two offset reads. The
//! key columns are stored in the row too (the object key is their encoding,
//! see `key.rs`), so a plan never needs to decode the key.
//!
//! Rows come from clients and are not checked by the server when written
//! (the shard's write path knows no schema), so a reader checks the header,
//! the offset table and that no NOT NULL column is marked NULL in each row
//! before reading it (`RowRef::new`) and
//! reports a row that does not fit the schema, naming its key; it never
//! panics on one.

use insitu_protocol::schema::{ColumnType, Schema};

/// The first byte of every row: tells a row of this format from opaque bytes
/// written to a typed table by other means.
pub const ROW_TAG: u8 = 0xA1;

/// Where one column lives in a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// At this byte offset of the row, `width` bytes.
    Fixed { offset: usize, width: usize },
    /// The `index`-th variable-width column (its entry in the offset table).
    Var { index: usize },
}

/// The compiled layout of a schema's rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowLayout {
    /// Per column, in schema order.
    pub slots: Vec<Slot>,
    /// Per column, its type (copied so readers need no schema).
    pub types: Vec<ColumnType>,
    /// Bytes of the null bitmap.
    pub bitmap_bytes: usize,
    /// End of the fixed region = start of the offset table.
    pub fixed_end: usize,
    /// Number of variable-width columns.
    pub var_count: usize,
    /// The null bitmap's bits of the columns declared NOT NULL (one byte per
    /// bitmap byte): a row with one of them set is malformed. Why checked:
    /// rows come from clients unchecked, and a reader (an Arrow column
    /// declared non-nullable, a key column) must not meet a NULL there.
    pub not_null_bits: Vec<u8>,
}

impl RowLayout {
    pub fn new(schema: &Schema) -> RowLayout {
        let n = schema.columns.len();
        let bitmap_bytes = n.div_ceil(8);
        let mut offset = 1 + bitmap_bytes;
        let mut var_count = 0;
        let mut slots = Vec::with_capacity(n);
        for c in &schema.columns {
            match c.ty.fixed_width() {
                Some(width) => {
                    slots.push(Slot::Fixed { offset, width });
                    offset += width;
                }
                None => {
                    slots.push(Slot::Var { index: var_count });
                    var_count += 1;
                }
            }
        }
        let mut not_null_bits = vec![0u8; bitmap_bytes];
        for (i, _) in schema
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.nullable)
        {
            not_null_bits[i / 8] |= 1 << (i % 8);
        }
        RowLayout {
            slots,
            types: schema.columns.iter().map(|c| c.ty).collect(),
            bitmap_bytes,
            fixed_end: offset,
            var_count,
            not_null_bits,
        }
    }

    /// Start of the variable region.
    pub fn var_start(&self) -> usize {
        self.fixed_end + 4 * self.var_count
    }

    /// Bytes of a row with every variable column empty: the smallest row.
    pub fn min_row_bytes(&self) -> usize {
        self.var_start()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_protocol::schema::Column;

    #[test]
    fn fixed_columns_get_consecutive_offsets_after_the_bitmap() {
        let col = |name: &str, ty| Column::new(name, ty, false);
        let schema = Schema {
            columns: vec![
                col("a", ColumnType::Int64),
                col("s", ColumnType::Utf8),
                col("b", ColumnType::Bool),
                col("d", ColumnType::Date32),
                col("t", ColumnType::Utf8),
            ],
            key: vec![0],
        };
        let l = RowLayout::new(&schema);
        assert_eq!(l.bitmap_bytes, 1);
        assert_eq!(
            l.slots,
            vec![
                Slot::Fixed {
                    offset: 2,
                    width: 8
                },
                Slot::Var { index: 0 },
                Slot::Fixed {
                    offset: 10,
                    width: 1
                },
                Slot::Fixed {
                    offset: 11,
                    width: 4
                },
                Slot::Var { index: 1 },
            ]
        );
        assert_eq!(l.fixed_end, 15);
        assert_eq!(l.var_start(), 23);
    }
}
