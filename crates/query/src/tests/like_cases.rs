//! LIKE and ILIKE edge cases, through the compiled filter and the
//! reference alike.

use insitu_protocol::query::{Pred, Scalar};
use insitu_rows::RowRef;

use super::{rows_plan, schema};
use crate::reference;

/// Whether `text LIKE pattern` (ILIKE when `ci`), by the compiled filter;
/// checked to agree with the reference.
fn like(pattern: &str, text: &str, ci: bool) -> bool {
    let s = schema();
    let pred = Pred::Like {
        col: 7,
        pattern: pattern.into(),
        case_insensitive: ci,
    };
    let plan = rows_plan(vec![pred.clone()]);
    let compiled = crate::compile(&s, &plan).expect("valid pattern");
    let mut row = vec![Scalar::Null; 10];
    row[0] = Scalar::Int(1);
    row[7] = Scalar::Str(text.into());
    let bytes = super::encode(std::slice::from_ref(&row)).remove(0);
    let got = compiled.filter(&RowRef::new(compiled.layout(), &bytes).unwrap());
    assert_eq!(
        reference::truth(&[pred], &row),
        Some(got),
        "{text:?} LIKE {pattern:?}"
    );
    got
}

#[test]
fn percent_and_underscore() {
    assert!(like("%", "", false));
    assert!(like("%", "anything\nat all", false));
    assert!(like("a%", "abc", false));
    assert!(!like("a%", "bac", false));
    assert!(like("%c", "abc", false));
    assert!(like("%b%", "abc", false));
    assert!(!like("_", "", false));
    assert!(like("_", "é", false), "_ is one character, not one byte");
    assert!(!like("__", "é", false));
    assert!(like("a_c", "a\nc", false), "_ matches a newline");
    assert!(like("", "", false));
    assert!(!like("", "a", false));
    assert!(!like("abc", "abcd", false), "anchored at the end");
    assert!(!like("bcd", "abcd", false), "anchored at the start");
    // Leading and trailing runs of % drop an anchor (like.rs).
    assert!(like("%%", "", false));
    assert!(like("%%b%%", "abc", false));
    assert!(!like("%%b%%", "ac", false));
    assert!(like("%_%", "x", false));
    assert!(!like("%_%", "", false));
    assert!(like("%b", "ab", false));
    assert!(!like("%b", "ba", false), "anchored at the end");
    assert!(like("b%", "ba", false));
    assert!(!like("b%", "ab", false), "anchored at the start");
    assert!(like("%a%c", "xaybc", false));
    assert!(!like("%a%c", "xaycb", false));
}

#[test]
fn escapes_make_metacharacters_literal() {
    assert!(like("100\\%", "100%", false));
    // A trailing % that is escaped is no wildcard: the end stays anchored.
    assert!(!like("%100\\%", "100%x", false));
    assert!(like("%100\\%", "x100%", false));
    assert!(like("\\%%", "%x", false));
    assert!(!like("\\%%", "x%", false));
    assert!(!like("100\\%", "1000", false));
    assert!(like("a\\_b", "a_b", false));
    assert!(!like("a\\_b", "axb", false));
    assert!(like("a\\\\b", "a\\b", false));
    assert!(
        like("\\a", "a", false),
        "an escaped ordinary character is itself"
    );
}

#[test]
fn regex_metacharacters_in_a_pattern_are_literal() {
    assert!(like("a.c", "a.c", false));
    assert!(!like("a.c", "abc", false));
    assert!(like("(a|b)*", "(a|b)*", false));
    assert!(!like("(a|b)*", "ab", false));
    assert!(like("[x]+?^$", "[x]+?^$", false));
    assert!(like("%{2}", "a{2}", false));
}

#[test]
fn ilike_ignores_case_like_ignores_none() {
    assert!(like("ABC%", "abcdef", true));
    assert!(!like("ABC%", "abcdef", false));
    assert!(like("é_", "Éx", true));
    assert!(!like("é_", "Éx", false));
}

#[test]
fn like_on_null_is_unknown() {
    let pred = Pred::Like {
        col: 7,
        pattern: "%".into(),
        case_insensitive: false,
    };
    let mut row = vec![Scalar::Null; 10];
    row[0] = Scalar::Int(1);
    assert_eq!(reference::truth(std::slice::from_ref(&pred), &row), None);
    let plan = rows_plan(vec![pred, Pred::Not]);
    let compiled = crate::compile(&schema(), &plan).unwrap();
    let bytes = super::encode(&[row]).remove(0);
    let r = RowRef::new(compiled.layout(), &bytes).unwrap();
    assert_eq!(compiled.truth(&r), crate::filter::UNKNOWN);
    assert!(!compiled.filter(&r), "NOT unknown is unknown: rejected");
}
