//! `insitu update` on a typed table, on a real cluster: a column named by
//! its name, values read by its type, SQL's NULL rules, the refusals a user
//! meets, a secondary index kept exact, and an update that cannot apply to
//! one row writing nothing there.

use crate::common;

use common::{Cluster, fails, ok, users_table};

#[test]
fn typed_update_from_the_cli() {
    let cluster = Cluster::start(2, 2);
    // id int64 (key), name utf8, age int32 null, score decimal(10,2):
    // (1, alice, 31, 10.50), (2, bob, NULL, 3.25), (3, carol, 45, -1).
    users_table(&cluster);

    let out = ok(cluster.cli(&[
        "update", "users", "score", "--add", "1.25", "--where", "age > 30",
    ]));
    assert_eq!(out.trim(), "updated 2 rows");
    assert_eq!(
        ok(cluster.cli(&["agg", "users", "sum", "score"])).trim(),
        "15.25"
    );

    // NULL + 1 is NULL: bob's age stays NULL (his row counts, as in SQL).
    let out = ok(cluster.cli(&["update", "users", "age", "--add", "1"]));
    assert_eq!(out.trim(), "updated 3 rows");
    assert_eq!(
        ok(cluster.cli(&["agg", "users", "sum", "age"])).trim(),
        "78"
    );
    assert_eq!(cluster.count_where("users", "age is null"), "1");

    // Text and NULL are set like any value; the rest of the row is kept.
    let out = ok(cluster.cli(&[
        "update", "users", "name", "--set", "Zed", "--where", "id = 2",
    ]));
    assert_eq!(out.trim(), "updated 1 rows");
    assert_eq!(
        cluster.count_where("users", "name = 'Zed' and score = 3.25"),
        "1"
    );
    ok(cluster.cli(&[
        "update", "users", "age", "--set", "NULL", "--where", "id = 3",
    ]));
    assert_eq!(cluster.count_where("users", "age is null"), "2");
    assert_eq!(
        cluster.count_where("users", "name = 'carol' and score = 0.25"),
        "1"
    );

    // Refusals name what is wrong, and change nothing.
    for (args, want) in [
        (&["id", "--set", "7"][..], "primary key"),
        (&["age", "--set", "5000000000"], "int32"),
        (&["name", "--add", "1"], "not a number"),
        (&["score", "--add", "0.001"], "digits after the point"),
        (&["score", "--add", "x"], "not a decimal"),
        (&["age", "--add", "1.5"], "not a whole number"),
        (&["height", "--set", "1"], "no column \"height\""),
        (&["age", "--set", "1", "--where", "height > 1"], "height"),
        (&["age"], "--add X or --set X"),
    ] {
        let mut a = vec!["update", "users"];
        a.extend_from_slice(args);
        let e = fails(cluster.cli(&a));
        assert!(e.contains(want), "{args:?}: {e}");
    }
    assert_eq!(
        ok(cluster.cli(&["agg", "users", "sum", "age"])).trim(),
        "32"
    );

    // A sum out of the column's range refuses the update on that row's
    // tablet: nothing there is written.
    ok(cluster.cli(&[
        "update",
        "users",
        "age",
        "--set",
        "2147483647",
        "--where",
        "id = 1",
    ]));
    let e = fails(cluster.cli(&["update", "users", "age", "--add", "1", "--where", "id = 1"]));
    assert!(
        e.contains("out of int32's range") && e.contains("age"),
        "{e}"
    );
    assert_eq!(cluster.count_where("users", "age = 2147483647"), "1");
}

#[test]
fn an_index_stays_exact_across_updates() {
    let cluster = Cluster::start(1, 2);
    users_table(&cluster);
    ok(cluster.cli(&["index", "create", "users", "age"]));
    assert_eq!(cluster.count_where("users", "age = 31"), "1");
    ok(cluster.cli(&["update", "users", "age", "--add", "10"]));
    // Equality on an indexed column probes the index: it must see the
    // updated values, not the old ones.
    assert_eq!(cluster.count_where("users", "age = 31"), "0");
    assert_eq!(cluster.count_where("users", "age = 41"), "1");
    assert_eq!(cluster.count_where("users", "age in (41, 55)"), "2");
}

#[test]
fn sql_update_runs_on_the_servers() {
    let cluster = Cluster::start(1, 2);
    users_table(&cluster);
    let out = ok(cluster.cli(&[
        "sql",
        "--format",
        "csv",
        "UPDATE users SET score = score + 1, name = 'x' WHERE age > 30",
    ]));
    assert_eq!(out.trim(), "count\n2", "{out}");
    assert_eq!(cluster.count_where("users", "name = 'x'"), "2");
    assert_eq!(
        ok(cluster.cli(&["agg", "users", "sum", "score"])).trim(),
        "14.75"
    );
    // A snapshot session reads the past: it cannot change the present.
    let e = fails(cluster.cli(&["sql", "--snapshot", "UPDATE users SET age = 1"]));
    assert!(e.contains("an UPDATE changes the newest rows"), "{e}");
    let e = fails(cluster.cli(&["sql", "UPDATE users SET age = score"]));
    assert!(e.contains("SET age = <value>"), "{e}");
    assert_eq!(cluster.count_where("users", "age = 1"), "0");
}
