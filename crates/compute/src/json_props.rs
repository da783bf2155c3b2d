//! Property: what a shard computes over JSON documents (the reference
//! evaluator: validation, the one-pass reading, the kernels, as a shard runs
//! them; the plan sent through postcard as a server receives it) equals a
//! model computed here directly from the generated values.

use insitu_protocol::Number;
use insitu_protocol::plan::{
    AggPartial, CmpOp, JsonLit, JsonPath, JsonStep, Op, Partial, PredOp, ScanPlan,
};
use proptest::prelude::*;

use crate::reference::evaluate;

/// What a person's `age` member holds.
#[derive(Clone, Debug)]
enum Age {
    Absent,
    Null,
    Int(i64),
    Float(f64),
    Text(String),
    Flag(bool),
}

/// One object: a small JSON document, or bytes that are not one.
#[derive(Clone, Debug)]
enum Obj {
    Person {
        age: Age,
        /// An earlier `age` member the last one replaces.
        shadowed: Option<i64>,
        name: String,
        /// `age` written after `name` rather than before.
        age_last: bool,
        /// Spaces and newlines between tokens.
        spaced: bool,
    },
    /// The document cut short: no values.
    Truncated(i64),
    /// Not JSON at all.
    Junk(Vec<u8>),
}

fn age() -> impl Strategy<Value = Age> {
    prop_oneof![
        Just(Age::Absent),
        Just(Age::Null),
        (-50i64..50).prop_map(Age::Int),
        any::<i64>().prop_map(Age::Int),
        (-50.0f64..50.0).prop_map(Age::Float),
        "[a-z0-9]{0,3}".prop_map(Age::Text),
        any::<bool>().prop_map(Age::Flag),
    ]
}

fn obj() -> impl Strategy<Value = Obj> {
    prop_oneof![
        8 => (age(), proptest::option::of(-9i64..9), "(al|bob|b|é\"x)", any::<bool>(), any::<bool>())
            .prop_map(|(age, shadowed, name, age_last, spaced)| Obj::Person {
                age, shadowed, name, age_last, spaced
            }),
        1 => any::<i64>().prop_map(Obj::Truncated),
        1 => proptest::collection::vec(any::<u8>(), 0..12).prop_map(Obj::Junk),
    ]
}

fn json_str(s: &str) -> String {
    let mut out = String::new();
    insitu_protocol::json_path::write_json_string(&mut out, s).expect("a String takes any text");
    out
}

impl Obj {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Obj::Person {
                age,
                shadowed,
                name,
                age_last,
                spaced,
            } => {
                let age_text = match age {
                    Age::Absent => None,
                    Age::Null => Some("null".to_string()),
                    Age::Int(i) => Some(i.to_string()),
                    // `{:?}` writes a point or an exponent: read as a float.
                    Age::Float(f) => Some(format!("{f:?}")),
                    Age::Text(t) => Some(json_str(t)),
                    Age::Flag(b) => Some(b.to_string()),
                };
                let mut members = Vec::new();
                if let Some(s) = shadowed {
                    members.push(format!("\"age\": {s}"));
                }
                let age_member = age_text.map(|a| format!("\"age\": {a}"));
                let name_member = format!("\"name\": {}", json_str(name));
                let nested = "\"extra\": {\"age\": 1000, \"list\": [1, {\"age\": 2}]}".to_string();
                if !*age_last {
                    members.extend(age_member.clone());
                }
                members.push(nested);
                members.push(name_member);
                if *age_last {
                    members.extend(age_member);
                }
                let sep = if *spaced { " ,\n  " } else { "," };
                format!("{{{}}}", members.join(sep)).into_bytes()
            }
            Obj::Truncated(i) => format!("{{\"age\": {i}, \"name\": \"bo").into_bytes(),
            Obj::Junk(b) => [&[0xffu8][..], b].concat(), // never UTF-8
        }
    }

    /// The number at `$.age` (the last member), if there is one.
    fn age(&self) -> Option<Number> {
        match self {
            Obj::Person {
                age: Age::Int(i), ..
            } => Some(Number::I64(*i)),
            Obj::Person {
                age: Age::Float(f), ..
            } => Some(Number::F64(*f)),
            Obj::Person {
                age: Age::Absent,
                shadowed: Some(s),
                ..
            } => Some(Number::I64(*s)),
            _ => None,
        }
    }

    fn name(&self) -> Option<&str> {
        match self {
            Obj::Person { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// `age > t` as a model: exact between integers, else in f64.
fn model_gt(a: Number, t: Number) -> bool {
    match (a, t) {
        (Number::I64(a), Number::I64(t)) => a > t,
        (Number::I64(a), Number::F64(t)) => (a as f64) > t,
        (Number::F64(a), Number::I64(t)) => a > t as f64,
        (Number::F64(a), Number::F64(t)) => a > t,
    }
}

fn path(key: &str) -> JsonPath {
    JsonPath {
        steps: vec![JsonStep::Key(key.into())],
    }
}

fn gt(t: Number) -> PredOp {
    PredOp::JsonCmp {
        path: path("age"),
        op: CmpOp::Gt,
        value: JsonLit::Num(t),
    }
}

fn named(n: &str) -> PredOp {
    PredOp::JsonCmp {
        path: path("name"),
        op: CmpOp::Eq,
        value: JsonLit::Str(n.into()),
    }
}

/// The plan as a server receives it (through postcard), evaluated.
fn shard(filter: Vec<PredOp>, op: Op, objs: &[(Vec<u8>, Vec<u8>)]) -> Partial {
    let mut plan = ScanPlan::new(op);
    plan.filter = filter;
    let bytes = postcard::to_stdvec(&plan).expect("encode");
    let plan: ScanPlan = postcard::from_bytes(&bytes).expect("decode");
    let refs: Vec<(&[u8], &[u8])> = objs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    evaluate(&plan, &refs).expect("evaluate")
}

fn count(filter: Vec<PredOp>, objs: &[(Vec<u8>, Vec<u8>)]) -> u64 {
    match shard(filter, Op::Count, objs) {
        Partial::Count(n) => n,
        other => panic!("{other:?}"),
    }
}

fn threshold() -> impl Strategy<Value = Number> {
    prop_oneof![
        (-60i64..60).prop_map(Number::I64),
        (-60.0f64..60.0).prop_map(Number::F64),
        any::<i64>().prop_map(Number::I64),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
    #[test]
    fn json_counts_and_sums_match_a_model(
        objs in proptest::collection::vec(obj(), 0..40),
        t in threshold(),
        who in "(al|bob|é\"x|nobody)",
    ) {
        let stored: Vec<(Vec<u8>, Vec<u8>)> = objs
            .iter()
            .enumerate()
            .map(|(i, o)| (format!("k{i}").into_bytes(), o.bytes()))
            .collect();
        let ages: Vec<Option<Number>> = objs.iter().map(Obj::age).collect();
        let is_who: Vec<Option<bool>> = objs.iter().map(|o| o.name().map(|n| n == who)).collect();

        // age > t; not age > t: neither counts an object without a number.
        let want_gt = ages.iter().flatten().filter(|&&a| model_gt(a, t)).count() as u64;
        let want_not = ages.iter().flatten().filter(|&&a| !model_gt(a, t)).count() as u64;
        prop_assert_eq!(count(vec![gt(t)], &stored), want_gt);
        prop_assert_eq!(count(vec![gt(t), PredOp::Not], &stored), want_not);
        prop_assert_eq!(
            count(vec![named(&who)], &stored),
            is_who.iter().filter(|w| **w == Some(true)).count() as u64
        );
        // Kleene: age > t or name = who is true when either part is true.
        let want_or = ages
            .iter()
            .zip(&is_who)
            .filter(|(a, w)| a.is_some_and(|a| model_gt(a, t)) || **w == Some(true))
            .count() as u64;
        prop_assert_eq!(count(vec![gt(t), named(&who), PredOp::Or], &stored), want_or);

        // sum/min/max of $.age over the objects named `who`: the filter's
        // path and the aggregate's read in one pass.
        let mut want = AggPartial::default();
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for (a, w) in ages.iter().zip(&is_who) {
            if let (Some(a), Some(true)) = (a, w) {
                want.count += 1;
                let f = match *a {
                    Number::I64(i) => { want.sum_int += i as i128; i as f64 }
                    Number::F64(f) => { want.sum_float += f; f }
                };
                lo = lo.min(f);
                hi = hi.max(f);
            }
        }
        let got = match shard(vec![named(&who)], Op::JsonAggregate { path: path("age") }, &stored) {
            Partial::Aggregate(a) => a,
            other => panic!("{other:?}"),
        };
        prop_assert_eq!((got.count, got.sum_int, got.sum_float), (want.count, want.sum_int, want.sum_float));
        let f = |n: Option<Number>| n.map(crate::field::as_f64);
        prop_assert_eq!(f(got.min), (want.count > 0).then_some(lo));
        prop_assert_eq!(f(got.max), (want.count > 0).then_some(hi));
    }
}
