//! `insitu delete` and SQL `DELETE` on a real cluster: objects and rows
//! removed by the servers, a forgotten filter refused, a value that cannot
//! be judged refusing its tablet's removal, an index kept exact.

use crate::common;

use common::{Cluster, fails, ok, rt, users_table};
use insitu_client::{Client, Selection};

#[test]
fn delete_untyped_objects_by_filter_and_key_range() {
    let cluster = Cluster::start(2, 1);
    ok(cluster.cli(&["table", "create", "nums", "--tablets", "4"]));
    let rt = rt();
    let client = rt.block_on(Client::connect(&cluster.addr())).unwrap();
    let t = rt.block_on(client.open_table("nums")).unwrap().id;
    rt.block_on(async {
        for i in 0..10i64 {
            client
                .write(t, format!("k{i}"), i.to_le_bytes())
                .await
                .unwrap();
        }
    });
    let count = || rt.block_on(client.count(t, &Selection::all())).unwrap();

    let e = fails(cluster.cli(&["delete", "nums"]));
    assert!(e.contains("--all"), "{e}");
    assert_eq!(count(), 10);

    let out = ok(cluster.cli(&["delete", "nums", "--where", "i64@0 >= 5"]));
    assert_eq!(out.trim(), "deleted 5 objects");
    assert_eq!(count(), 5);
    let out = ok(cluster.cli(&["delete", "nums", "--from-key", "k0", "--to-key", "k2"]));
    assert_eq!(out.trim(), "deleted 2 objects");
    assert!(rt.block_on(client.read(t, b"k1")).unwrap().is_none());
    assert!(rt.block_on(client.read(t, b"k2")).unwrap().is_some());

    // A value too short for the filter refuses its tablet's removal (the
    // other tablets' removals apply: the error says which).
    rt.block_on(client.write(t, b"short", b"x")).unwrap();
    let e = fails(cluster.cli(&["delete", "nums", "--where", "i64@0 > 100"]));
    assert!(e.contains("too short") && e.contains("applied on"), "{e}");
    assert!(rt.block_on(client.read(t, b"short")).unwrap().is_some());
    rt.block_on(client.remove(t, b"short")).unwrap();

    let out = ok(cluster.cli(&["delete", "nums", "--all"]));
    assert_eq!(out.trim(), "deleted 3 objects");
    assert_eq!(count(), 0);
}

#[test]
fn delete_typed_rows_from_the_cli_and_sql() {
    let cluster = Cluster::start(1, 2);
    // (1, alice, 31, 10.50), (2, bob, NULL, 3.25), (3, carol, 45, -1).
    users_table(&cluster);
    ok(cluster.cli(&["index", "create", "users", "age"]));
    let count = |filter: &str| {
        ok(cluster.cli(&["count", "users", "--where", filter]))
            .trim()
            .to_string()
    };
    let out = ok(cluster.cli(&["delete", "users", "--where", "age is null"]));
    assert_eq!(out.trim(), "deleted 1 rows");
    let e = fails(cluster.cli(&["delete", "users", "--where", "height > 1"]));
    assert!(e.contains("height"), "{e}");
    let e = fails(cluster.cli(&["delete", "users", "--from-key", "a"]));
    assert!(e.contains("untyped tables"), "{e}");

    let out = ok(cluster.cli(&["sql", "--format", "csv", "DELETE FROM users WHERE age = 31"]));
    assert_eq!(out.trim(), "count\n1", "{out}");
    // The index on age probes: it must not find the deleted row.
    assert_eq!(count("age = 31"), "0");
    assert_eq!(count("age = 45"), "1");
    assert_eq!(ok(cluster.cli(&["count", "users"])).trim(), "1");
    let e = fails(cluster.cli(&["sql", "DELETE FROM users WHERE upper(name) = 'CAROL'"]));
    assert!(e.contains("cannot evaluate this WHERE clause"), "{e}");
    assert_eq!(ok(cluster.cli(&["count", "users"])).trim(), "1");
    // A snapshot session reads the past: it cannot delete from the present.
    let e = fails(cluster.cli(&["sql", "--snapshot", "DELETE FROM users"]));
    assert!(e.contains("a DELETE changes the newest rows"), "{e}");
    assert_eq!(ok(cluster.cli(&["count", "users"])).trim(), "1");
}
