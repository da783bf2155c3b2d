//! Reading paths out of tricky documents: nesting, arrays, escapes,
//! numbers beyond i64, floats, repeated members, bytes that are not JSON,
//! deep nesting and truncation.

use super::*;
use crate::json::parse_path;
use insitu_protocol::plan::{CmpOp, JsonLit};
use proptest::prelude::*;

/// What a path found, owned (a `JsonValue` borrows its doc).
#[derive(Clone, Debug, PartialEq)]
enum V {
    Missing,
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Container,
}

fn owned(v: JsonValue<'_>) -> V {
    match v {
        JsonValue::Missing => V::Missing,
        JsonValue::Null => V::Null,
        JsonValue::Bool(b) => V::Bool(b),
        JsonValue::Num(Number::I64(i)) => V::Int(i),
        JsonValue::Num(Number::F64(f)) => V::Float(f),
        JsonValue::Str(s) => V::Str(s.into()),
        JsonValue::Container => V::Container,
    }
}

/// A filter that compares each of `paths`, in this order.
fn path_filter(paths: &[&str]) -> Vec<PredOp> {
    paths
        .iter()
        .map(|p| PredOp::JsonCmp {
            path: parse_path(p).unwrap(),
            op: CmpOp::Eq,
            value: JsonLit::Bool(true),
        })
        .collect()
}

/// A reader of `paths` (as filter comparisons, in this order).
fn reader(paths: &[&str]) -> JsonDoc {
    JsonDoc::for_plan(&path_filter(paths), None).unwrap()
}

fn read(paths: &[&str], doc: &[u8]) -> Vec<V> {
    let mut r = reader(paths);
    r.read(doc);
    (0..paths.len()).map(|i| owned(r.for_op(i))).collect()
}

fn one(path: &str, doc: &str) -> V {
    read(&[path], doc.as_bytes()).remove(0)
}

#[test]
fn nested_members_and_arrays() {
    let doc = r#"{"a": {"b": {"c": 5}}, "tags": ["x", "y", {"k": true}], "n": null}"#;
    assert_eq!(one("$.a.b.c", doc), V::Int(5));
    assert_eq!(one("$.a.b", doc), V::Container);
    assert_eq!(one("$", doc), V::Container);
    assert_eq!(one("$.a.x", doc), V::Missing);
    assert_eq!(one("$.a.b.c.d", doc), V::Missing);
    assert_eq!(one("$.tags[1]", doc), V::Str("y".into()));
    assert_eq!(one("$.tags[2].k", doc), V::Bool(true));
    assert_eq!(one("$.tags[3]", doc), V::Missing);
    assert_eq!(one("$.tags.k", doc), V::Missing);
    assert_eq!(one("$.a[0]", doc), V::Missing);
    assert_eq!(one("$.n", doc), V::Null);
    assert_eq!(one("$", "31"), V::Int(31));
    assert_eq!(one("$", " \"x\" \n"), V::Str("x".into()));
    assert_eq!(one("$[1][0]", "[[1], [2, 3]]"), V::Int(2));
}

#[test]
fn several_paths_in_one_pass_share_prefixes() {
    let doc = br#"{"a": {"b": 2, "c": "s"}, "c": [0, "z"], "a2": 1}"#;
    assert_eq!(
        read(&["$.a", "$.a.b", "$.c[1]", "$.a.c", "$.a2", "$.a.b"], doc),
        vec![
            V::Container,
            V::Int(2),
            V::Str("z".into()),
            V::Str("s".into()),
            V::Int(1),
            V::Int(2),
        ]
    );
    // One slot per distinct path.
    assert_eq!(reader(&["$.a", "$.b", "$.a"]).paths().len(), 2);
}

#[test]
fn escapes_in_keys_and_strings() {
    let doc =
        r#"{"first name": "Al", "q\"uote": 1, "caf\u00e9": 2, "s": "a\"b\\c\u00e9\n", "a\\b": 3}"#;
    assert_eq!(one(r#"$["first name"]"#, doc), V::Str("Al".into()));
    assert_eq!(one(r#"$["q\"uote"]"#, doc), V::Int(1));
    assert_eq!(one("$.café", doc), V::Int(2));
    assert_eq!(one("$.s", doc), V::Str("a\"b\\cé\n".into()));
    assert_eq!(one(r#"$["a\\b"]"#, doc), V::Int(3));
}

#[test]
fn numbers_are_integers_only_when_written_so_and_within_i64() {
    let n = |text: &str| one("$.n", &format!("{{\"n\": {text}}}"));
    assert_eq!(n("9223372036854775807"), V::Int(i64::MAX));
    assert_eq!(n("-9223372036854775808"), V::Int(i64::MIN));
    assert_eq!(n("9223372036854775808"), V::Float(9223372036854775808.0));
    assert_eq!(n("-9223372036854775809"), V::Float(-9223372036854775809.0));
    assert_eq!(n("18446744073709551616"), V::Float(18446744073709551616.0));
    assert_eq!(
        n("123456789012345678901234567890"),
        V::Float(1.2345678901234568e29)
    );
    assert_eq!(n("0"), V::Int(0));
    assert_eq!(n("-0"), V::Float(-0.0)); // serde_json keeps the sign: a float
    // The f64 nearest to the text, to the last bit.
    assert_eq!(n("-19.420496236194758"), V::Float(-19.420496236194758));
    assert_eq!(n("0.1"), V::Float(0.1));
    assert_eq!(n("1.0"), V::Float(1.0));
    assert_eq!(n("1e2"), V::Float(100.0));
    assert_eq!(n("-2.5E-3"), V::Float(-0.0025));
    // Beyond f64 where it is read: serde_json refuses it, so no value.
    assert_eq!(n("1e400"), V::Missing);
    // Not JSON numbers.
    for bad in ["01", "+1", ".5", "1.", "NaN", "Infinity", "0x10"] {
        assert_eq!(n(bad), V::Missing, "{bad}");
    }
}

#[test]
fn bytes_that_are_not_one_json_document_have_no_values() {
    for doc in [
        &b""[..],
        b"   ",
        b"hello",
        b"\xff\xfe{}",
        b"{\"age\": 31",
        b"{\"age\": 31,}",
        b"{\"age\": 31}xyz",
        b"{\"age\": 31}{\"age\": 32}",
        b"{age: 31}",
        b"{'age': 31}",
        // Invalid UTF-8 in a string no path reads.
        b"{\"x\": \"\xff\", \"age\": 31}",
        // A control character in a string.
        b"{\"x\": \"a\x01b\", \"age\": 31}",
        b"alice,{\"age\": 31}",
    ] {
        assert_eq!(
            read(&["$.age", "$"], doc),
            vec![V::Missing, V::Missing],
            "{:?}",
            String::from_utf8_lossy(doc)
        );
    }
    assert_eq!(one("$.age", "\n {\"age\": 31} \t"), V::Int(31));
}

#[test]
fn every_truncation_of_a_document_has_no_values() {
    let doc = r#"{"name": "bob", "age": 31, "tags": ["a", {"b": [1.5, null]}]}"#;
    assert_eq!(one("$.age", doc), V::Int(31));
    let mut r = reader(&["$.name", "$.age"]);
    for cut in 0..doc.len() {
        r.read(&doc.as_bytes()[..cut]);
        assert_eq!(owned(r.for_op(0)), V::Missing, "cut at {cut}");
        assert_eq!(owned(r.for_op(1)), V::Missing, "cut at {cut}");
    }
}

#[test]
fn the_last_of_repeated_members_counts() {
    assert_eq!(one("$.a", r#"{"a": 1, "a": 2}"#), V::Int(2));
    let doc = r#"{"a": {"b": 1}, "a": 5}"#;
    assert_eq!(
        read(&["$.a.b", "$.a"], doc.as_bytes()),
        vec![V::Missing, V::Int(5)]
    );
    let doc = r#"{"a": 5, "a": {"b": 1}}"#;
    assert_eq!(
        read(&["$.a.b", "$.a"], doc.as_bytes()),
        vec![V::Int(1), V::Container]
    );
}

#[test]
fn values_of_one_document_do_not_leak_into_the_next() {
    let mut r = reader(&["$.age", "$.name"]);
    r.read(br#"{"age": 31, "name": "bob"}"#);
    assert_eq!(owned(r.for_op(1)), V::Str("bob".into()));
    r.read(br#"{"other": 1}"#);
    assert_eq!(
        (owned(r.for_op(0)), owned(r.for_op(1))),
        (V::Missing, V::Missing)
    );
    r.read(br#"{"name": "al"}"#);
    assert_eq!(owned(r.for_op(1)), V::Str("al".into()));
}

#[test]
fn deep_nesting_neither_recurses_nor_overflows() {
    // 200 000 levels beside the path: skipped in a loop.
    let deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
    let doc = format!("{{\"deep\": {deep}, \"age\": 7}}");
    assert_eq!(one("$.age", &doc), V::Int(7));
    assert_eq!(one("$.deep", &doc), V::Container);
    // Along a path of 16 steps into the same depth.
    let steps = "[0]".repeat(16);
    assert_eq!(one(&format!("${steps}"), &deep), V::Container);
    let beside = format!("${}[1]", "[0]".repeat(15));
    assert_eq!(one(&beside, &deep), V::Missing);
    let nested = format!("{}5{}", "[".repeat(16), "]".repeat(16));
    assert_eq!(one(&format!("${steps}"), &nested), V::Int(5));
    // Unbalanced: not JSON.
    assert_eq!(
        one(
            "$.age",
            &format!("{{\"age\": 1, \"d\": {}}}", "[".repeat(100_000))
        ),
        V::Missing
    );
}

#[test]
fn a_large_document_is_read_in_one_pass() {
    // ~1 MiB of members, the wanted one last.
    let mut doc = String::from("{");
    for i in 0..40_000 {
        doc.push_str(&format!("\"k{i}\": [\"{i:>10}\", {{\"x\": {i}}}], "));
    }
    doc.push_str("\"age\": 99}");
    assert!(doc.len() > 1 << 20);
    assert_eq!(one("$.age", &doc), V::Int(99));
    assert_eq!(one("$.k39999[1].x", &doc), V::Int(39999));
}

#[test]
fn too_many_distinct_paths_are_refused() {
    let paths: Vec<String> = (0..=MAX_JSON_PATHS).map(|i| format!("$.k{i}")).collect();
    let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
    let filter = path_filter(&refs);
    let e = JsonDoc::for_plan(&filter, None).unwrap_err();
    assert!(e.contains("at most 32 different JSON paths"), "{e}");
    assert!(JsonDoc::for_plan(&filter[1..], None).is_ok());
    // All 32 read in one pass.
    let doc = format!(
        "{{{}}}",
        (0..MAX_JSON_PATHS)
            .map(|i| format!("\"k{}\": {i}", i + 1))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let got = read(&refs[1..], doc.as_bytes());
    assert_eq!(
        got,
        (0..MAX_JSON_PATHS as i64).map(V::Int).collect::<Vec<_>>()
    );
}

proptest! {
    #[test]
    fn hostile_bytes_never_panic(doc in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut r = reader(&["$", "$.a", "$.a[0]", "$[\"\"]", "$[3].b"]);
        r.read(&doc);
    }

    #[test]
    fn mangled_json_never_panics(cut in 0usize..80, at in 0usize..80, byte in any::<u8>()) {
        let mut doc = br#"{"a": [1, -2.5e3, "s\"\u00e9", {"b": null}], "b": true, "c": {}}"#.to_vec();
        let at = at.min(doc.len() - 1);
        doc[at] = byte;
        doc.truncate(cut.max(at + 1));
        let mut r = reader(&["$.a[0]", "$.a[2]", "$.a[3].b", "$.b", "$.c"]);
        r.read(&doc);
    }
}
