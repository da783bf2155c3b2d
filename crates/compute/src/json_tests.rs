//! The path parser (good and bad paths, limits, the canonical text read
//! back) and comparisons of what a path finds.

use super::*;
use insitu_protocol::Number;
use proptest::prelude::*;

fn key(k: &str) -> JsonStep {
    JsonStep::Key(k.into())
}

fn path(steps: Vec<JsonStep>) -> JsonPath {
    JsonPath { steps }
}

#[test]
fn good_paths_parse() {
    let cases = [
        ("$", path(vec![])),
        ("$.age", path(vec![key("age")])),
        (" $.address.city ", path(vec![key("address"), key("city")])),
        ("$.tags[0]", path(vec![key("tags"), JsonStep::Index(0)])),
        (
            "$[0][12]",
            path(vec![JsonStep::Index(0), JsonStep::Index(12)]),
        ),
        ("$[\"first name\"]", path(vec![key("first name")])),
        (r#"$["q\"uote\\"]"#, path(vec![key("q\"uote\\")])),
        (r#"$["caf\u00e9"].x"#, path(vec![key("café"), key("x")])),
        ("$.café", path(vec![key("café")])),
        ("$.a-b_c.0", path(vec![key("a-b_c"), key("0")])),
        ("$[\"\"]", path(vec![key("")])),
        ("$[\"a.b[0]\"]", path(vec![key("a.b[0]")])),
        ("$[4294967295]", path(vec![JsonStep::Index(u32::MAX)])),
    ];
    for (text, want) in cases {
        assert_eq!(parse_path(text), Ok(want.clone()), "{text}");
        // The canonical text reads back as the same path.
        assert_eq!(parse_path(&want.to_string()), Ok(want), "{text}");
    }
}

#[test]
fn bad_paths_say_what_is_wrong_and_where() {
    let cases = [
        ("", "starts with $"),
        ("age", "starts with $"),
        ("$.", "at byte 3: expected a key after \".\""),
        ("$.a.", "expected a key"),
        ("$.a b", "at byte 4: unexpected ' '"),
        ("$age", "at byte 2: unexpected 'a'"),
        ("$[", "expected a \"quoted key\" or an array index"),
        ("$[-1]", "expected a \"quoted key\" or an array index"),
        ("$[ 0]", "expected a \"quoted key\" or an array index"),
        ("$[0", "expected \"]\""),
        ("$[\"a\"", "expected \"]\""),
        ("$[\"a", "no closing \""),
        ("$['a']", "double-quoted"),
        (r#"$["bad \x"]"#, "bad quoted key"),
        ("$[4294967296]", "too large"),
        ("$.a)", "unexpected ')'"),
    ];
    for (text, want) in cases {
        let e = parse_path(text).unwrap_err();
        assert!(
            e.contains("bad JSON path") && e.contains(want),
            "{text}: {e}"
        );
    }
}

#[test]
fn paths_are_limited_in_steps_and_bytes() {
    let steps = |n| format!("${}", ".a".repeat(n));
    assert!(parse_path(&steps(MAX_JSON_PATH_STEPS)).is_ok());
    let e = parse_path(&steps(MAX_JSON_PATH_STEPS + 1)).unwrap_err();
    assert!(e.contains("more than 16 steps"), "{e}");
    // "$." and a key: 256 bytes in all is fine, 257 is not.
    let long = |n| format!("$.{}", "k".repeat(n));
    assert!(parse_path(&long(MAX_JSON_PATH_BYTES - 2)).is_ok());
    let e = parse_path(&long(MAX_JSON_PATH_BYTES - 1)).unwrap_err();
    assert!(e.contains("longer than 256 bytes"), "{e}");
    // Found without reading a huge text to its end first.
    let e = parse_path(&format!("$.a{}", "[0]".repeat(1_000_000))).unwrap_err();
    assert!(e.contains("steps") || e.contains("bytes"), "{e}");
    // A path built in code is checked like a decoded one.
    let many = path(vec![JsonStep::Index(0); MAX_JSON_PATH_STEPS + 1]);
    assert!(check_path(&many).unwrap_err().contains("17 steps"));
    let wide = path(vec![key(&"k".repeat(200)), key(&"k".repeat(57))]);
    assert!(check_path(&wide).unwrap_err().contains("257 bytes"));
}

#[test]
fn literals_are_checked() {
    let p = path(vec![key("ok")]);
    assert!(check_cmp(&p, CmpOp::Eq, &JsonLit::Bool(true)).is_ok());
    assert!(check_cmp(&p, CmpOp::Ne, &JsonLit::Bool(false)).is_ok());
    let e = check_cmp(&p, CmpOp::Lt, &JsonLit::Bool(true)).unwrap_err();
    assert!(e.contains("= or <> only") && e.contains("$.ok"), "{e}");
    let long = JsonLit::Str("s".repeat(MAX_JSON_STR_BYTES + 1));
    assert!(check_cmp(&p, CmpOp::Eq, &long).is_err());
    assert!(check_cmp(&p, CmpOp::Lt, &JsonLit::Str("b".into())).is_ok());
}

#[test]
fn comparisons_need_a_value_of_the_literals_kind() {
    let num = |n| JsonLit::Num(n);
    let int = |v| JsonValue::Num(Number::I64(v));
    // Integers compare exactly, even where f64 cannot tell them apart.
    let max = i64::MAX;
    assert_eq!(
        compare_json(int(max), CmpOp::Gt, &num(Number::I64(max - 1))),
        Some(true)
    );
    assert_eq!(
        compare_json(int(max - 1), CmpOp::Eq, &num(Number::I64(max))),
        Some(false)
    );
    assert_eq!(
        compare_json(int(2), CmpOp::Lt, &num(Number::F64(2.5))),
        Some(true)
    );
    assert_eq!(
        compare_json(
            JsonValue::Num(Number::F64(2.0)),
            CmpOp::Eq,
            &num(Number::I64(2))
        ),
        Some(true)
    );
    // Strings bytewise: "B" < "a" < "ab" < "é".
    let s = |t: &'static str| JsonLit::Str(t.into());
    assert_eq!(
        compare_json(JsonValue::Str("B"), CmpOp::Lt, &s("a")),
        Some(true)
    );
    assert_eq!(
        compare_json(JsonValue::Str("ab"), CmpOp::Gt, &s("a")),
        Some(true)
    );
    assert_eq!(
        compare_json(JsonValue::Str("é"), CmpOp::Gt, &s("z")),
        Some(true)
    );
    assert_eq!(
        compare_json(JsonValue::Str("bob"), CmpOp::Eq, &s("bob")),
        Some(true)
    );
    assert_eq!(
        compare_json(JsonValue::Str("bob"), CmpOp::Ne, &s("bob")),
        Some(false)
    );
    let t = JsonLit::Bool(true);
    assert_eq!(
        compare_json(JsonValue::Bool(true), CmpOp::Eq, &t),
        Some(true)
    );
    assert_eq!(
        compare_json(JsonValue::Bool(false), CmpOp::Ne, &t),
        Some(true)
    );
    // Any other kind, or nothing: unknown.
    for v in [
        JsonValue::Missing,
        JsonValue::Null,
        JsonValue::Container,
        JsonValue::Str("31"),
        JsonValue::Bool(true),
    ] {
        assert_eq!(
            compare_json(v, CmpOp::Eq, &num(Number::I64(31))),
            None,
            "{v:?}"
        );
        assert_eq!(
            compare_json(v, CmpOp::Ne, &num(Number::I64(31))),
            None,
            "{v:?}"
        );
    }
    assert_eq!(compare_json(int(1), CmpOp::Eq, &t), None);
    assert_eq!(compare_json(int(1), CmpOp::Eq, &s("1")), None);
}

fn arb_step() -> impl Strategy<Value = JsonStep> {
    prop_oneof![
        any::<u32>().prop_map(JsonStep::Index),
        "[a-z0-9_-]{1,6}".prop_map(JsonStep::Key),
        any::<String>().prop_map(|k| JsonStep::Key(k.chars().take(8).collect())),
    ]
}

proptest! {
    #[test]
    fn canonical_text_reads_back(steps in proptest::collection::vec(arb_step(), 0..6)) {
        let p = path(steps);
        let text = p.to_string();
        prop_assume!(text.len() <= MAX_JSON_PATH_BYTES);
        prop_assert_eq!(parse_path(&text), Ok(p));
    }

    #[test]
    fn any_text_parses_or_fails_without_panicking(text in any::<String>()) {
        let _ = parse_path(&text);
        let _ = parse_path(&format!("$[\"{text}"));
        let _ = parse_path(&format!("$.{text}"));
    }
}
