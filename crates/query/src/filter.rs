//! The compiled filter: per step, the column's slot and how to compare its
//! raw bytes, evaluated on a small fixed stack of truth values
//! (`FALSE`/`TRUE`/`UNKNOWN`, SQL's Kleene logic). No allocation per row.

use std::cmp::Ordering;

use hashbrown::HashSet;
use insitu_protocol::plan::CmpOp;
use insitu_rows::{RowLayout, RowRef, Slot};

use crate::value::{exact_to_f64, float_cmp};

pub const FALSE: u8 = 0;
pub const TRUE: u8 = 1;
pub const UNKNOWN: u8 = 2;
/// Kleene AND, OR, NOT indexed by truth values.
const AND: [[u8; 3]; 3] = [[0, 0, 0], [0, 1, 2], [0, 2, 2]];
const OR: [[u8; 3]; 3] = [[0, 1, 2], [1, 1, 1], [2, 1, 2]];
const NOT: [u8; 3] = [1, 0, 2];

/// Deepest stack a compiled filter may need: a program of MAX_PRED_OPS steps
/// pushes at most that many values, and `Between` needs one more slot.
pub const STACK_CAP: usize = insitu_protocol::plan::MAX_PRED_OPS + 1;
/// The stack of most programs: a cheaper array to clear per row.
const SMALL_STACK: usize = 16;

pub fn kleene_and(a: u8, b: u8) -> u8 {
    AND[a as usize][b as usize]
}
pub fn kleene_or(a: u8, b: u8) -> u8 {
    OR[a as usize][b as usize]
}
pub fn kleene_not(a: u8) -> u8 {
    NOT[a as usize]
}

/// How a fixed column's bytes become an exact integer.
#[derive(Clone, Copy, Debug)]
pub enum ExactRead {
    /// int32, date32
    I32,
    /// int64, decimal (unscaled)
    I64,
    /// bool as 0/1
    Bool,
}

/// The byte offset of fixed-width column `col` (the plan was checked, so
/// the column exists and is fixed-width).
pub fn fixed_offset(layout: &RowLayout, col: usize) -> usize {
    match layout.slots[col] {
        Slot::Fixed { offset, .. } => offset,
        Slot::Var { .. } => unreachable!("compile reads only fixed-width columns as numbers"),
    }
}

/// `N` bytes at `offset`: in bounds, as `RowRef::new` checked that every
/// row holds the whole fixed region.
#[inline]
fn fixed<const N: usize>(row: &RowRef<'_>, offset: usize) -> [u8; N] {
    row.bytes()[offset..offset + N]
        .try_into()
        .expect("a slice of N bytes")
}

#[inline]
fn read_at(row: &RowRef<'_>, offset: usize, read: ExactRead) -> i128 {
    match read {
        ExactRead::I32 => i128::from(i32::from_le_bytes(fixed::<4>(row, offset))),
        ExactRead::I64 => i128::from(i64::from_le_bytes(fixed::<8>(row, offset))),
        ExactRead::Bool => i128::from(fixed::<1>(row, offset)[0] != 0),
    }
}

/// A column read as an exact number at a comparison's common scale.
#[derive(Clone, Copy, Debug)]
pub struct ExactCol {
    /// For the null bit.
    pub col: usize,
    /// The column's byte offset in every row (from the layout, once).
    pub offset: usize,
    /// Width and kind of the stored value.
    pub read: ExactRead,
    /// 10^(common scale - column scale); at most 10^18, so `value * mul`
    /// of an i64 fits i128.
    pub mul: i128,
}

impl ExactCol {
    #[inline]
    pub fn get(&self, row: &RowRef<'_>) -> i128 {
        read_at(row, self.offset, self.read) * self.mul
    }
}

/// A numeric column read as f64.
#[derive(Clone, Copy, Debug)]
pub struct FloatCol {
    /// For the null bit.
    pub col: usize,
    /// The column's byte offset in every row.
    pub offset: usize,
    /// None: a float64 column; Some: an exact column and its scale.
    pub exact: Option<(ExactRead, u32)>,
}

impl FloatCol {
    #[inline]
    pub fn get(&self, row: &RowRef<'_>) -> f64 {
        match self.exact {
            None => f64::from_le_bytes(fixed::<8>(row, self.offset)),
            Some((read, scale)) => exact_to_f64(read_at(row, self.offset, read), scale),
        }
    }
}

/// One side of a column-to-column comparison.
#[derive(Clone, Copy, Debug)]
pub enum Operand {
    Exact(ExactCol),
    Float(FloatCol),
    Text(usize),
}

impl Operand {
    fn col(&self) -> usize {
        match self {
            Operand::Exact(c) => c.col,
            Operand::Float(c) => c.col,
            Operand::Text(c) => *c,
        }
    }
}

/// The values of an `IN` list, by how they compare with the column.
#[derive(Debug)]
pub struct InList {
    /// The column tested (for its null bit and its text).
    pub col: usize,
    /// The exact literals at the common scale of the column and all of them.
    pub exact: Option<(ExactCol, HashSet<i128>)>,
    /// Float literals (compared as f64), with the column read as f64.
    pub floats: Option<(FloatCol, Vec<f64>)>,
    pub text: HashSet<Box<[u8]>>,
    /// A NULL in the list: a value found nowhere else is unknown, not false.
    pub has_null: bool,
}

/// One compiled step. Leaves push a truth value, connectives combine them.
#[derive(Debug)]
pub enum Op {
    /// A constant truth value (a comparison with a NULL literal).
    Const(u8),
    /// `column IS NULL`.
    IsNull(usize),
    /// `column OP literal`, exact: the literal already at the common scale.
    Exact {
        c: ExactCol,
        op: CmpOp,
        lit: i128,
    },
    /// `column OP literal` as f64 (a float column or a float literal).
    Float {
        c: FloatCol,
        op: CmpOp,
        lit: f64,
    },
    /// `column OP 'text'`, by bytes.
    Text {
        col: usize,
        op: CmpOp,
        lit: Box<[u8]>,
    },
    /// `column OP column`, both sides of the same operand kind.
    Cols {
        l: Operand,
        r: Operand,
        op: CmpOp,
    },
    /// `column IN (..)` (boxed: the largest step, and rare).
    In(Box<InList>),
    /// LIKE (anchored) or regex (anywhere) on a text column's bytes.
    Match {
        col: usize,
        re: Box<regex::bytes::Regex>,
    },
    And,
    Or,
    Not,
}

#[inline]
pub fn holds(op: CmpOp, o: Ordering) -> bool {
    match op {
        CmpOp::Eq => o == Ordering::Equal,
        CmpOp::Ne => o != Ordering::Equal,
        CmpOp::Lt => o == Ordering::Less,
        CmpOp::Le => o != Ordering::Greater,
        CmpOp::Gt => o == Ordering::Greater,
        CmpOp::Ge => o != Ordering::Less,
    }
}

#[inline]
fn truth(b: bool) -> u8 {
    if b { TRUE } else { FALSE }
}

/// A checked, compiled filter program.
#[derive(Debug, Default)]
pub struct Filter {
    /// Postfix steps; well formed (checked by `compile`): the stack never
    /// underflows, never exceeds STACK_CAP, and ends with one value.
    pub ops: Vec<Op>,
    /// The deepest the stack gets (checked <= STACK_CAP by `compile`).
    pub max_depth: usize,
}

impl Filter {
    /// The program's truth value for `row`: TRUE, FALSE or UNKNOWN.
    pub fn truth(&self, row: &RowRef<'_>) -> u8 {
        if self.ops.is_empty() {
            return TRUE;
        }
        if let [op] = self.ops.as_slice() {
            return leaf(op, row);
        }
        if self.max_depth <= SMALL_STACK {
            self.run::<SMALL_STACK>(row)
        } else {
            self.run::<STACK_CAP>(row)
        }
    }

    /// The postfix loop on a stack of `N` >= max_depth values.
    #[inline]
    fn run<const N: usize>(&self, row: &RowRef<'_>) -> u8 {
        let mut stack = [0u8; N];
        let mut sp = 0usize;
        for op in &self.ops {
            match op {
                Op::And => {
                    sp -= 1;
                    stack[sp - 1] = kleene_and(stack[sp - 1], stack[sp]);
                }
                Op::Or => {
                    sp -= 1;
                    stack[sp - 1] = kleene_or(stack[sp - 1], stack[sp]);
                }
                Op::Not => stack[sp - 1] = kleene_not(stack[sp - 1]),
                leaf_op => {
                    stack[sp] = leaf(leaf_op, row);
                    sp += 1;
                }
            }
        }
        debug_assert_eq!(sp, 1, "compile checks the program leaves one value");
        stack[0]
    }
}

#[inline]
fn leaf(op: &Op, row: &RowRef<'_>) -> u8 {
    match op {
        Op::Const(t) => *t,
        Op::IsNull(col) => truth(row.is_null(*col)),
        Op::Exact { c, op, lit } => {
            if row.is_null(c.col) {
                return UNKNOWN;
            }
            truth(holds(*op, c.get(row).cmp(lit)))
        }
        Op::Float { c, op, lit } => {
            if row.is_null(c.col) {
                return UNKNOWN;
            }
            truth(holds(*op, float_cmp(c.get(row), *lit)))
        }
        Op::Text { col, op, lit } => {
            if row.is_null(*col) {
                return UNKNOWN;
            }
            truth(holds(*op, row.var(*col).cmp(lit)))
        }
        Op::Cols { l, r, op } => {
            if row.is_null(l.col()) || row.is_null(r.col()) {
                return UNKNOWN;
            }
            let o = match (l, r) {
                (Operand::Exact(a), Operand::Exact(b)) => a.get(row).cmp(&b.get(row)),
                (Operand::Float(a), Operand::Float(b)) => float_cmp(a.get(row), b.get(row)),
                (Operand::Text(a), Operand::Text(b)) => row.var(*a).cmp(row.var(*b)),
                _ => unreachable!("compile gives both sides the same operand kind"),
            };
            truth(holds(*op, o))
        }
        Op::In(list) => {
            if row.is_null(list.col) {
                return UNKNOWN;
            }
            let found = list
                .exact
                .as_ref()
                .is_some_and(|(c, set)| set.contains(&c.get(row)))
                || list.floats.as_ref().is_some_and(|(c, fs)| {
                    let v = c.get(row);
                    fs.iter().any(|f| float_cmp(v, *f) == Ordering::Equal)
                })
                || (!list.text.is_empty() && list.text.contains(row.var(list.col)));
            if found {
                TRUE
            } else if list.has_null {
                UNKNOWN
            } else {
                FALSE
            }
        }
        Op::Match { col, re } => {
            if row.is_null(*col) {
                return UNKNOWN;
            }
            truth(re.is_match(row.var(*col)))
        }
        Op::And | Op::Or | Op::Not => unreachable!("connectives are not leaves"),
    }
}
