//! JSON paths on an untyped table, on a real cluster (separate processes):
//! `agg TABLE FUNC '$.path'` and `count --where` with numbers, strings,
//! booleans and paths some values lack, computed in the servers, at a
//! snapshot and without; and the errors a user meets.

use crate::common;

use common::{Cluster, fails, ok};

/// `users` over 4 tablets: JSON documents with and without `age`, a string
/// age, a value that is not JSON.
fn users(cluster: &Cluster) {
    ok(cluster.cli(&["table", "create", "users", "--tablets", "4"]));
    // Loaded as a user would: `key,value` lines.
    let csv = cluster.dir.path().join("users.csv");
    std::fs::write(
        &csv,
        "alice,{\"age\": 31}\ncarol,\"{\"\"age\"\": 27, \"\"name\"\": \"\"carol\"\", \"\"first name\"\": \"\"Carol\"\"}\"\n",
    )
    .unwrap();
    ok(cluster.cli(&["load", "users", csv.to_str().unwrap()]));
    assert_eq!(
        ok(cluster.cli(&["get", "users", "alice"])).trim(),
        "{\"age\": 31}"
    );
    for (key, value) in [
        (
            "alice",
            r#"{"age": 31, "name": "alice", "address": {"city": "Oslo"}, "tags": ["admin", "dev"], "ok": true}"#,
        ),
        ("bob", r#"{"name": "bob", "age": 40.5, "ok": false}"#),
        ("dave", "hello"),
        ("erin", r#"{"name": "erin"}"#),
        ("frank", r#"{"age": "31", "name": "frank"}"#),
        ("gus", r#"{"age": null, "name": "gus"}"#),
        ("hal", r#"{"age": 50, "name": "hal""#), // cut short: not JSON
    ] {
        ok(cluster.cli(&["put", "users", key, value]));
    }
}

#[test]
fn json_paths_aggregate_and_filter_in_the_servers() {
    let cluster = Cluster::start(2, 2);
    users(&cluster);
    // Numbers at $.age: 31, 40.5, 27 (a string, null, no age, not JSON: skipped).
    let out = cluster.cli(&["agg", "users", "sum", "$.age"]);
    assert_eq!(out.0, 0, "{}", out.2);
    assert_eq!(out.1.trim(), "98.5");
    assert!(
        out.2
            .contains("$.age reads the JSON number at that path; values without it are skipped"),
        "{}",
        out.2
    );
    let agg = |func: &str| {
        ok(cluster.cli(&["agg", "users", func, "$.age"]))
            .trim()
            .to_string()
    };
    assert_eq!(agg("count"), "3");
    assert_eq!(agg("min"), "27");
    assert_eq!(agg("max"), "40.5");
    assert_eq!(agg("avg"), (98.5f64 / 3.0).to_string());
    assert_eq!(agg("COUNT"), "3");

    for (filter, matching) in [
        // Numbers; unknown (no number) is neither > 30 nor not > 30.
        ("$.age > 30", "2"),
        ("not $.age > 30", "1"),
        ("$.age between 27 and 31", "2"),
        ("$.age = 31", "1"),
        // Strings, nested members, array elements, keys with spaces, booleans.
        ("$.name = 'bob'", "1"),
        ("$.name <> 'bob'", "5"),
        ("$.age = '31'", "1"),
        ("$.address.city = 'Oslo'", "1"),
        ("$.tags[1] = 'dev'", "1"),
        ("$[\"first name\"] = 'Carol'", "1"),
        ("$.ok = true", "1"),
        ("$.ok != true", "1"),
        // A path no value has: nothing either way.
        ("$.missing > 0", "0"),
        ("not $.missing > 0", "0"),
        // Three-valued logic: unknown or true is true.
        ("$.age > 30 or $.name = 'erin'", "3"),
    ] {
        assert_eq!(cluster.count_where("users", filter), matching, "{filter}");
    }
    // A filter and an aggregate over paths together.
    assert_eq!(
        ok(cluster.cli(&["agg", "users", "sum", "$.age", "--where", "$.name <> 'bob'"])).trim(),
        "58"
    );
    // At one snapshot (the default over 4 tablets), forced, and without.
    for mode in ["--at-snapshot", "--no-snapshot"] {
        assert_eq!(
            ok(cluster.cli(&["count", "users", "--where", "$.age > 30", mode])).trim(),
            "2",
            "{mode}"
        );
        assert_eq!(
            ok(cluster.cli(&["agg", "users", "sum", "$.age", mode])).trim(),
            "98.5",
            "{mode}"
        );
    }
    // Raw fields still read bytes: every value is at least one byte long.
    assert_eq!(cluster.count_where("users", "u8@0 = 123"), "7"); // every value but "hello"
}

#[test]
fn json_integer_sums_are_exact() {
    let cluster = Cluster::start(1, 2);
    ok(cluster.cli(&["table", "create", "big", "--tablets", "2"]));
    for k in ["a", "b", "c"] {
        ok(cluster.cli(&["put", "big", k, "{\"n\": 9223372036854775807}"]));
    }
    ok(cluster.cli(&["put", "big", "d", "{\"n\": -1}"]));
    let sum = ok(cluster.cli(&["agg", "big", "sum", "$.n"]));
    assert_eq!(sum.trim(), "27670116110564327420");
    assert_eq!(ok(cluster.cli(&["agg", "big", "min", "$.n"])).trim(), "-1");
}

#[test]
fn json_path_mistakes_are_clear_errors() {
    let cluster = Cluster::start(1, 1);
    users(&cluster);
    let e = fails(cluster.cli(&["agg", "users", "sum", "$."]));
    assert!(
        e.contains("bad JSON path \"$.\"") && e.contains("expected a key"),
        "{e}"
    );
    let e = fails(cluster.cli(&["agg", "users", "sum", "$['age']"]));
    assert!(e.contains("double-quoted"), "{e}");
    let e = fails(cluster.cli(&["agg", "users", "median", "$.age"]));
    assert!(e.contains("unknown aggregate"), "{e}");
    let e = fails(cluster.cli(&["count", "users", "--where", "$.tags[ > 1"]));
    assert!(e.contains("bad JSON path"), "{e}");
    let long = format!("$.{} > 1", "k".repeat(300));
    let e = fails(cluster.cli(&["count", "users", "--where", &long]));
    assert!(e.contains("longer than 256 bytes"), "{e}");
    let e = fails(cluster.cli(&["count", "users", "--where", "$.ok < true"]));
    assert!(e.contains("= or <> only"), "{e}");
    let e = fails(cluster.cli(&["count", "users", "--where", "$.name = bob"]));
    assert!(e.contains("a number, a 'string', true or false"), "{e}");
    let e = fails(cluster.cli(&["update", "users", "$.age", "--add", "1"]));
    assert!(e.contains("update of a JSON path is not supported"), "{e}");
    // A field that is neither says both ways to name one.
    let e = fails(cluster.cli(&["agg", "users", "sum", "age"]));
    assert!(e.contains("untyped") && e.contains("$.age"), "{e}");
}
