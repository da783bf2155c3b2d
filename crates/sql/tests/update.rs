//! `UPDATE` and `DELETE` through `InsituTable` (translated to the servers'
//! typed update or removal and applied by their own `RowUpdate` / compiled
//! filter over the in-memory source) against the same statement on
//! DataFusion's `MemTable`: the same count and the same table afterwards;
//! what the servers cannot apply exactly is refused with the reason, and
//! `EXPLAIN` changes nothing.

mod common;

use common::fixture::{fixture, render, same};
use insitu_sql::run_sql;

const UPDATES: &[&str] = &[
    "UPDATE items SET qty = qty + 1 WHERE price > 10",
    "UPDATE items SET qty = 3",
    "UPDATE items SET price = price - 0.05, name = 'zz' WHERE qty IS NULL OR flag",
    "UPDATE items SET name = NULL WHERE name LIKE 'a%'",
    "UPDATE items SET score = score + 0.5 WHERE score < 0",
    "UPDATE items SET ship = ship + INTERVAL '2' DAY WHERE id < 10",
    "UPDATE items SET ship = DATE '2021-03-04' WHERE ship IS NULL",
    "UPDATE items SET ship = '2021-03-04' WHERE id = 3",
    "UPDATE items SET disc = 0.1 WHERE disc = 0.05",
    "UPDATE items SET owner = 1 + owner, flag = true WHERE owner BETWEEN 1 AND 2",
    "UPDATE items SET qty = qty - 2 WHERE qty IN (1, 2, 3) AND NOT flag",
    "UPDATE items SET price = NULL WHERE id > 100",
    // A literal DataFusion casts to the column's type itself (constant
    // folding): the servers store the value DataFusion computed.
    "UPDATE items SET qty = 2.5 WHERE id < 5",
    "UPDATE items SET price = 1.255 WHERE id < 5",
];

const DELETES: &[&str] = &[
    "DELETE FROM items WHERE qty > 3",
    "DELETE FROM items WHERE name IS NULL OR price < 10",
    "DELETE FROM items WHERE NOT flag",
    "DELETE FROM items WHERE name LIKE '%a%' AND ship >= DATE '2020-01-10'",
    "DELETE FROM items WHERE id > 100",
    "DELETE FROM items",
];

#[tokio::test]
async fn updates_and_deletes_match_datafusion() {
    for sql in UPDATES.iter().chain(DELETES) {
        let f = fixture().await;
        let rows = same(&f, sql).await;
        assert_eq!(rows, 1, "{sql}: one count row");
        same(&f, "SELECT * FROM items").await;
    }
}

#[tokio::test]
async fn updates_the_servers_cannot_apply_exactly_are_refused() {
    let f = fixture().await;
    let before = render(
        &run_sql(&f.insitu, "SELECT * FROM items").await.unwrap(),
        true,
    );
    for (sql, want) in [
        (
            "UPDATE items SET qty = owner",
            "SET qty = <value> or SET qty = qty + <number>",
        ),
        ("UPDATE items SET name = upper(name)", "SET name = <value>"),
        ("UPDATE items SET id = 5", "primary key"),
        ("UPDATE items SET qty = 99999999999", "Int32"),
        (
            "UPDATE items SET qty = qty + 0.5",
            "not a number int32 can add exactly",
        ),
        (
            "UPDATE items SET qty = 1 WHERE upper(name) = 'BETA'",
            "cannot evaluate this WHERE clause",
        ),
        (
            "UPDATE items SET qty = 1 WHERE qty + 1 > 3",
            "cannot evaluate this WHERE clause",
        ),
    ] {
        let e = match run_sql(&f.insitu, sql).await {
            Ok(b) => panic!("{sql} was run: {:?}", render(&b, false).0),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want), "{sql}: {e}");
    }
    let e = run_sql(&f.insitu, "UPDATE items SET nosuch = 1")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("nosuch"), "{e}");
    let plan = render(
        &run_sql(
            &f.insitu,
            "EXPLAIN UPDATE items SET qty = qty + 1 WHERE price > 10",
        )
        .await
        .unwrap(),
        false,
    )
    .0
    .join("\n");
    assert!(
        plan.contains("InsituWriteExec: UPDATE table=items, set=[qty = "),
        "{plan}"
    );
    let plan = render(
        &run_sql(&f.insitu, "EXPLAIN DELETE FROM items WHERE price > 10")
            .await
            .unwrap(),
        false,
    )
    .0
    .join("\n");
    assert!(
        plan.contains("InsituWriteExec: DELETE table=items, filter=[price > "),
        "{plan}"
    );
    let after = render(
        &run_sql(&f.insitu, "SELECT * FROM items").await.unwrap(),
        true,
    );
    assert_eq!(
        before, after,
        "a refused or explained statement changed rows"
    );
}
