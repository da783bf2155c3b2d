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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
pub(crate) fn read_at(row: &RowRef<'_>, offset: usize, read: ExactRead) -> i128 {
    i128::from(read_i64(row, offset, read))
}

/// A fixed column's exact value (every stored one fits i64).
#[inline]
pub(crate) fn read_i64(row: &RowRef<'_>, offset: usize, read: ExactRead) -> i64 {
    match read {
        ExactRead::I32 => i64::from(i32::from_le_bytes(fixed::<4>(row, offset))),
        ExactRead::I64 => i64::from_le_bytes(fixed::<8>(row, offset)),
        ExactRead::Bool => i64::from(fixed::<1>(row, offset)[0] != 0),
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

/// A fixed exact column read as i64 at its own scale: what `Op::Exact64`
/// and the merged range checks share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exact64Col {
    /// For the null bit.
    pub col: usize,
    /// The column's byte offset in every row.
    pub offset: usize,
    /// Width and kind of the stored value.
    pub read: ExactRead,
}

impl Exact64Col {
    /// The value in `row` (the caller checks the null bit first).
    #[inline(always)]
    pub fn get(&self, row: &RowRef<'_>) -> i64 {
        read_i64(row, self.offset, self.read)
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
    /// `column OP literal`, exact, when the column needs no rescaling and
    /// the literal fits i64: compared in i64.
    Exact64 {
        c: Exact64Col,
        op: CmpOp,
        lit: i64,
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
    /// `ops` split at its top-level ANDs: (start, end) ranges, each a whole
    /// sub-program leaving one value, in program order. Why: a WHERE keeps
    /// a row only when every conjunct is TRUE, so `matches` stops at the
    /// first that is not (a selective filter rejects most rows at its first
    /// conjunct), and a one-leaf conjunct runs without the stack loop.
    conjuncts: Vec<(usize, usize)>,
    /// The conjuncts that bound one exact column (`Exact64` leaves other
    /// than `<>`), merged per column into `lo <= value <= hi`: checked
    /// first, without the stack or a call per leaf (Q6's five conjuncts
    /// are three of these). Not in `conjuncts`.
    ranges: Vec<RangeCheck>,
    /// Two bounds of one column that no value meets (`x < 3 AND x > 5`):
    /// no row matches.
    empty: bool,
    /// Some step reads a variable-width (text) column: rows need their
    /// offset table checked before the filter runs (`Compiled::keep`).
    pub reads_var: bool,
}

/// `lo <= column <= hi` on a fixed exact column, NULL rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RangeCheck {
    c: Exact64Col,
    lo: i64,
    hi: i64,
}

impl RangeCheck {
    /// The bounds `column OP lit` sets; None for `<>` (two ranges) and
    /// for a bound no value meets (`< i64::MIN`), which `Filter::new`
    /// reports as an empty range.
    fn bounds(op: CmpOp, lit: i64) -> Option<(i64, i64)> {
        Some(match op {
            CmpOp::Eq => (lit, lit),
            CmpOp::Lt => (i64::MIN, lit.checked_sub(1)?),
            CmpOp::Le => (i64::MIN, lit),
            CmpOp::Gt => (lit.checked_add(1)?, i64::MAX),
            CmpOp::Ge => (lit, i64::MAX),
            CmpOp::Ne => return None,
        })
    }

    #[inline(always)]
    fn holds(&self, row: &RowRef<'_>) -> bool {
        if row.is_null(self.c.col) {
            return false;
        }
        // lo <= v <= hi in one unsigned compare (lo <= hi: `Filter::new`).
        let v = self.c.get(row);
        (v.wrapping_sub(self.lo) as u64) <= (self.hi.wrapping_sub(self.lo) as u64)
    }
}

/// Whether a leaf reads a variable-width column's bytes.
fn reads_var(op: &Op) -> bool {
    match op {
        Op::Text { .. } | Op::Match { .. } => true,
        Op::Cols { l, r, .. } => matches!(l, Operand::Text(_)) || matches!(r, Operand::Text(_)),
        Op::In(list) => !list.text.is_empty(),
        _ => false,
    }
}

impl Filter {
    /// A filter of a program `compile` checked.
    pub fn new(ops: Vec<Op>, max_depth: usize) -> Filter {
        let mut conjuncts = conjuncts(&ops);
        let mut ranges: Vec<RangeCheck> = Vec::new();
        let mut empty = false;
        conjuncts.retain(|&(start, end)| {
            let [Op::Exact64 { c, op, lit }] = &ops[start..end] else {
                return true;
            };
            if *op == CmpOp::Ne {
                return true;
            }
            let Some((lo, hi)) = RangeCheck::bounds(*op, *lit) else {
                empty = true;
                return false;
            };
            match ranges.iter_mut().find(|r| r.c.col == c.col) {
                Some(r) => {
                    r.lo = r.lo.max(lo);
                    r.hi = r.hi.min(hi);
                    empty |= r.lo > r.hi;
                }
                None => ranges.push(RangeCheck { c: *c, lo, hi }),
            }
            false
        });
        let reads_var = ops.iter().any(reads_var);
        Filter {
            ops,
            max_depth,
            conjuncts,
            ranges,
            empty,
            reads_var,
        }
    }

    /// The program's truth value for `row`: TRUE, FALSE or UNKNOWN.
    pub fn truth(&self, row: &RowRef<'_>) -> u8 {
        if self.ops.is_empty() {
            return TRUE;
        }
        self.eval(&self.ops, row)
    }

    /// Whether the program is TRUE for `row` (FALSE and UNKNOWN reject it):
    /// `truth(row) == TRUE`, conjunct by conjunct, stopping at the first
    /// that is not TRUE (Kleene AND is TRUE only when both sides are).
    #[inline]
    pub fn matches(&self, row: &RowRef<'_>) -> bool {
        !self.ranges_reject(row) && self.rest_holds(row)
    }

    /// The second part of `matches`: every conjunct that is not a range
    /// check is TRUE. Alone, only for a row `ranges_reject` let through.
    #[inline(always)]
    pub fn rest_holds(&self, row: &RowRef<'_>) -> bool {
        // A plain loop, as in `ranges_reject`: `Iter::all` was a call per
        // row even over no conjuncts (TPC-H Q1's case).
        for &(start, end) in &self.conjuncts {
            if self.eval(&self.ops[start..end], row) != TRUE {
                return false;
            }
        }
        true
    }

    /// The first, cheap part of `matches`: the filter is empty, or one of
    /// its range checks fails. True means `matches` is false; false says
    /// nothing (the other conjuncts are not looked at). Why apart: a
    /// selective scan rejects most rows here, and this part is small
    /// enough to inline into the log walk (`Compiled::rejects`).
    #[inline(always)]
    pub fn ranges_reject(&self, row: &RowRef<'_>) -> bool {
        // A plain loop: `Iter::all` was left out of line (a call per row).
        for r in &self.ranges {
            if !r.holds(row) {
                return true;
            }
        }
        self.empty
    }

    /// A well-formed program (or sub-program) over `row`.
    #[inline]
    fn eval(&self, ops: &[Op], row: &RowRef<'_>) -> u8 {
        if let [op] = ops {
            return leaf(op, row);
        }
        if self.max_depth <= SMALL_STACK {
            run::<SMALL_STACK>(ops, row)
        } else {
            run::<STACK_CAP>(ops, row)
        }
    }
}

/// The postfix loop on a stack of `N` >= the program's depth.
#[inline]
fn run<const N: usize>(ops: &[Op], row: &RowRef<'_>) -> u8 {
    let mut stack = [0u8; N];
    let mut sp = 0usize;
    for op in ops {
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

/// The top-level conjuncts of a well-formed postfix program, as ranges of
/// `ops` in program order (none for the empty program, which is TRUE).
fn conjuncts(ops: &[Op]) -> Vec<(usize, usize)> {
    // Where the sub-program ending at each step starts: a leaf starts at
    // itself, AND/OR where their left operand starts, NOT where its operand
    // does.
    let mut start_of = vec![0usize; ops.len()];
    let mut open: Vec<usize> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        start_of[i] = match op {
            Op::And | Op::Or => {
                open.pop();
                *open
                    .last()
                    .expect("compile checks every AND/OR has two operands")
            }
            Op::Not => *open
                .last()
                .expect("compile checks every NOT has an operand"),
            _ => {
                open.push(i);
                i
            }
        };
    }
    // Split ranges whose last step is an AND into its two operands.
    let mut out = Vec::new();
    let mut todo = if ops.is_empty() {
        Vec::new()
    } else {
        vec![(0, ops.len())]
    };
    while let Some((start, end)) = todo.pop() {
        if matches!(ops[end - 1], Op::And) {
            let right_start = start_of[end - 2];
            // Popped last-in first-out: push the right operand first so the
            // left one comes out first and `out` keeps program order.
            todo.push((right_start, end - 1));
            todo.push((start, right_start));
        } else {
            out.push((start, end));
        }
    }
    out
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
        Op::Exact64 { c, op, lit } => {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Leaf `i`: a constant, so each leaf is told apart by its value.
    fn l(i: u8) -> Op {
        Op::Const(i)
    }

    #[test]
    fn conjuncts_split_only_top_level_ands_in_program_order() {
        // a b c AND AND -> a, b, c
        let ops = vec![l(0), l(1), l(2), Op::And, Op::And];
        assert_eq!(conjuncts(&ops), vec![(0, 1), (1, 2), (2, 3)]);
        // (a AND b) OR c, AND d -> [a b AND c OR], [d]
        let ops = vec![l(0), l(1), Op::And, l(2), Op::Or, l(0), Op::And];
        assert_eq!(conjuncts(&ops), vec![(0, 5), (5, 6)]);
        // NOT (a AND b) is one conjunct; so is a lone leaf.
        let ops = vec![l(0), l(1), Op::And, Op::Not];
        assert_eq!(conjuncts(&ops), vec![(0, 4)]);
        assert_eq!(conjuncts(&[l(1)]), vec![(0, 1)]);
        assert!(conjuncts(&[]).is_empty());
    }
}
