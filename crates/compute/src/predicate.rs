//! The predicate interpreter.
//!
//! A predicate is a postfix program (`Vec<PredOp>`) instead of a tree, so
//! decoding hostile input never recurses and evaluation uses a fixed stack;
//! [`validate_predicate`] checks it before use.

use insitu_protocol::plan::{CmpOp, Field, KeyRange, MAX_PRED_OPS, PredOp};

use crate::field::{compare, read_field};

/// Deepest evaluation stack a predicate may need.
pub const MAX_PRED_DEPTH: usize = 32;

/// `start <= key < end` (bytewise); no `end` = no upper bound.
#[inline]
pub fn key_in_range(range: &KeyRange, key: &[u8]) -> bool {
    key >= &range.start[..] && range.end.as_deref().is_none_or(|e| key < e)
}

/// Check a predicate program: stack discipline, bounded size and depth.
/// Returns the largest value end offset it reads (0 if none).
pub fn validate_predicate(program: &[PredOp]) -> Result<usize, String> {
    if program.len() > MAX_PRED_OPS {
        return Err(format!(
            "predicate has {} operations, more than {MAX_PRED_OPS}",
            program.len()
        ));
    }
    let mut depth = 0usize;
    let mut need = 0usize;
    for (i, op) in program.iter().enumerate() {
        match op {
            PredOp::Cmp { field, .. } | PredOp::Between { field, .. } => {
                depth += 1;
                need = need.max(field.end());
                if depth > MAX_PRED_DEPTH {
                    return Err(format!("predicate nests deeper than {MAX_PRED_DEPTH}"));
                }
            }
            PredOp::And | PredOp::Or => {
                if depth < 2 {
                    return Err(format!("predicate op {i} needs two operands"));
                }
                depth -= 1;
            }
            PredOp::Not => {
                if depth < 1 {
                    return Err(format!("predicate op {i} needs an operand"));
                }
            }
        }
    }
    if !program.is_empty() && depth != 1 {
        return Err(format!("predicate leaves {depth} values, not one"));
    }
    Ok(need)
}

/// Evaluate a validated predicate on a value. `Err(field)` if the value is
/// too short for a field the predicate reads. An empty program is true.
#[inline]
pub fn eval(program: &[PredOp], value: &[u8]) -> Result<bool, Field> {
    let mut stack = [false; MAX_PRED_DEPTH];
    let mut sp = 0usize;
    for op in program {
        match *op {
            PredOp::Cmp {
                field,
                op,
                value: c,
            } => {
                let v = read_field(field, value).ok_or(field)?;
                stack[sp] = compare(v, op, c);
                sp += 1;
            }
            PredOp::Between { field, lo, hi } => {
                let v = read_field(field, value).ok_or(field)?;
                stack[sp] = compare(v, CmpOp::Ge, lo) && compare(v, CmpOp::Le, hi);
                sp += 1;
            }
            PredOp::And => {
                sp -= 1;
                stack[sp - 1] = stack[sp - 1] && stack[sp];
            }
            PredOp::Or => {
                sp -= 1;
                stack[sp - 1] = stack[sp - 1] || stack[sp];
            }
            PredOp::Not => stack[sp - 1] = !stack[sp - 1],
        }
    }
    Ok(sp == 0 || stack[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::tests::value;
    use insitu_protocol::Number;

    #[test]
    fn predicate_programs_evaluate() {
        use PredOp::*;
        let v = value(10, 1.75, 3);
        let gt5 = Cmp {
            field: Field::I64(0),
            op: CmpOp::Gt,
            value: Number::I64(5),
        };
        let btw = Between {
            field: Field::F64(8),
            lo: Number::F64(1.5),
            hi: Number::I64(2),
        };
        let eq3 = Cmp {
            field: Field::I32(16),
            op: CmpOp::Eq,
            value: Number::I64(3),
        };
        // i64@0 > 5 and (f64@8 between 1.5 and 2 or not i32@16 = 3)
        let p = vec![gt5.clone(), btw.clone(), eq3.clone(), Not, Or, And];
        assert_eq!(validate_predicate(&p), Ok(20));
        assert_eq!(eval(&p, &v), Ok(true));
        assert_eq!(eval(&p, &value(10, 3.0, 3)), Ok(false));
        assert_eq!(eval(&p, &value(10, 3.0, 4)), Ok(true));
        assert_eq!(eval(&p, &value(5, 1.75, 3)), Ok(false));
        assert_eq!(eval(&[], &v), Ok(true));
        assert_eq!(eval(&p, &v[..12]), Err(Field::F64(8)));
        for bad in [
            vec![And],
            vec![gt5.clone(), Or],
            vec![gt5.clone(), eq3.clone()],
            vec![Not],
        ] {
            assert!(validate_predicate(&bad).is_err(), "{bad:?}");
        }
        let deep = vec![gt5; MAX_PRED_DEPTH + 1];
        assert!(validate_predicate(&deep).is_err());
    }

    #[test]
    fn key_ranges_are_half_open() {
        let r = KeyRange {
            start: b"b".to_vec(),
            end: Some(b"d".to_vec()),
        };
        assert!(!key_in_range(&r, b"a"));
        assert!(key_in_range(&r, b"b"));
        assert!(key_in_range(&r, b"cz"));
        assert!(!key_in_range(&r, b"d"));
        let open = KeyRange {
            start: Vec::new(),
            end: None,
        };
        assert!(key_in_range(&open, b"\xff\xff"));
    }
}
