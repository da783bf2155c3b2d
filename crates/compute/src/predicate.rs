//! The predicate interpreter.
//!
//! A predicate is a postfix program (`Vec<PredOp>`) instead of a tree, so
//! decoding hostile input never recurses and evaluation uses a fixed stack;
//! [`validate_predicate`] checks it before use.
//!
//! Truth values follow Kleene's three-valued logic, as the typed filter's
//! (SQL's): a comparison of a JSON path that holds no value of the
//! literal's kind is unknown, `not unknown` is unknown, `unknown and false`
//! is false, `unknown or true` is true, and an object passes only when the
//! whole program is true. So `not $.age > 30` passes no object without a
//! number at `$.age`. Comparisons of raw fields are never unknown.

use insitu_protocol::plan::{CmpOp, Field, KeyRange, MAX_PRED_OPS, PredOp};

use crate::field::{compare, read_field};
use crate::json::{check_cmp, compare_json};
use crate::json_doc::JsonDoc;

/// Kleene's truth values ordered false < unknown < true, so that `and` is
/// the minimum, `or` the maximum and `not` the mirror image (`TRUE - x`).
const FALSE: u8 = 0;
const UNKNOWN: u8 = 1;
const TRUE: u8 = 2;

#[inline(always)]
fn truth(b: bool) -> u8 {
    if b { TRUE } else { FALSE }
}

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
            // A JSON value needs no length: a value without it is unknown.
            PredOp::JsonCmp { path, op, value } => {
                check_cmp(path, *op, value)?;
                depth += 1;
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
    JsonDoc::for_plan(program, None)?; // at most MAX_JSON_PATHS distinct paths
    Ok(need)
}

/// Evaluate a validated predicate on a value. `Err(field)` if the value is
/// too short for a field the predicate reads. An empty program is true.
/// JSON paths the program reads are read out of `value` here (one pass for
/// all of them); a scan reads them once per object for the whole plan
/// instead and calls [`eval_with`].
pub fn eval(program: &[PredOp], value: &[u8]) -> Result<bool, Field> {
    if program
        .iter()
        .any(|op| matches!(op, PredOp::JsonCmp { .. }))
    {
        // Validated: at most MAX_JSON_PATHS paths (else none is read, and
        // every JSON comparison is unknown).
        let mut json = JsonDoc::for_plan(program, None).unwrap_or_default();
        json.read(value);
        return eval_with(program, value, &json);
    }
    eval_with(program, value, &JsonDoc::default())
}

/// [`eval`] with the JSON values already read out of `value` into `json`
/// (built by `JsonDoc::for_plan` from this program).
#[inline]
pub fn eval_with(program: &[PredOp], value: &[u8], json: &JsonDoc) -> Result<bool, Field> {
    let mut stack = [FALSE; MAX_PRED_DEPTH];
    let mut sp = 0usize;
    for (i, op) in program.iter().enumerate() {
        match op {
            &PredOp::Cmp {
                field,
                op,
                value: c,
            } => {
                let v = read_field(field, value).ok_or(field)?;
                stack[sp] = truth(compare(v, op, c));
                sp += 1;
            }
            &PredOp::Between { field, lo, hi } => {
                let v = read_field(field, value).ok_or(field)?;
                stack[sp] = truth(compare(v, CmpOp::Ge, lo) && compare(v, CmpOp::Le, hi));
                sp += 1;
            }
            PredOp::JsonCmp { op, value: lit, .. } => {
                stack[sp] = compare_json(json.for_op(i), *op, lit).map_or(UNKNOWN, truth);
                sp += 1;
            }
            PredOp::And => {
                sp -= 1;
                stack[sp - 1] = stack[sp - 1].min(stack[sp]);
            }
            PredOp::Or => {
                sp -= 1;
                stack[sp - 1] = stack[sp - 1].max(stack[sp]);
            }
            PredOp::Not => stack[sp - 1] = TRUE - stack[sp - 1],
        }
    }
    Ok(sp == 0 || stack[0] == TRUE)
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
    fn json_comparisons_follow_three_valued_logic() {
        use PredOp::*;
        use insitu_protocol::plan::{JsonLit, JsonPath, JsonStep};
        let cmp = |key: &str, op, value| JsonCmp {
            path: JsonPath {
                steps: vec![JsonStep::Key(key.into())],
            },
            op,
            value,
        };
        let age_gt_30 = cmp("age", CmpOp::Gt, JsonLit::Num(Number::I64(30)));
        let is_bob = cmp("name", CmpOp::Eq, JsonLit::Str("bob".into()));
        let run = |p: &[PredOp], doc: &str| {
            assert!(validate_predicate(p).is_ok(), "{p:?}");
            eval(p, doc.as_bytes()).unwrap()
        };
        let (old, young, no_age) = (
            r#"{"age": 31, "name": "al"}"#,
            r#"{"age": 3, "name": "bob"}"#,
            r#"{"name": "bob"}"#,
        );
        let gt = [age_gt_30.clone()];
        assert_eq!(validate_predicate(&gt), Ok(0), "no length");
        let not_gt = [age_gt_30.clone(), Not];
        assert!(run(&gt, old) && !run(&not_gt, old));
        assert!(!run(&gt, young) && run(&not_gt, young));
        // Unknown: neither the comparison nor its negation passes.
        for doc in [
            no_age,
            r#"{"age": "31"}"#,
            r#"{"age": null}"#,
            "not json",
            "",
        ] {
            assert!(!run(&gt, doc) && !run(&not_gt, doc), "{doc}");
            assert!(!run(&[age_gt_30.clone(), Not, Not], doc), "{doc}");
        }
        // unknown or true = true; unknown and false = false, so its
        // negation passes; unknown and true = unknown.
        let or = [age_gt_30.clone(), is_bob.clone(), Or];
        assert!(run(&or, no_age));
        let and = [age_gt_30.clone(), is_bob.clone(), And];
        let not_and = [age_gt_30.clone(), is_bob.clone(), And, Not];
        assert!(!run(&and, r#"{"name": "al"}"#) && run(&not_and, r#"{"name": "al"}"#));
        assert!(!run(&and, no_age) && !run(&not_and, no_age));
        // A raw field and a JSON path in one program: a raw field reads the
        // first bytes of the same value.
        let raw = Cmp {
            field: Field::U8(0),
            op: CmpOp::Eq,
            value: Number::I64(b'{' as i64),
        };
        let mixed = [raw, age_gt_30.clone(), And];
        assert_eq!(validate_predicate(&mixed), Ok(1));
        assert!(run(&mixed, old));
        let bad = [cmp("ok", CmpOp::Lt, JsonLit::Bool(true))];
        assert!(
            validate_predicate(&bad)
                .unwrap_err()
                .contains("= or <> only")
        );
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
