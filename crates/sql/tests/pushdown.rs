//! SQL through `InsituTable` over the in-memory reference source, against
//! the same SQL on DataFusion's own `MemTable` holding the same rows (no
//! pushdown): every answer must be the same, and EXPLAIN must show what was
//! pushed.

mod common;

use common::fixture::{Fixture, fixture, render, same};
use datafusion::prelude::SessionContext;
use insitu_protocol::plan::CmpOp;
use insitu_protocol::query::{Pred, QueryOutput, Scalar};
use insitu_sql::run_sql;

async fn explain(ctx: &SessionContext, sql: &str) -> String {
    let b = run_sql(ctx, &format!("EXPLAIN {sql}")).await.unwrap();
    render(&b, false).0.join("\n")
}

const FILTERS: &[&str] = &[
    "qty > 5",
    "5 < qty",
    "qty <= 3 AND qty <> 1",
    "qty = 7",
    "qty >= -1",
    "qty < owner",
    "id = owner",
    "qty = price",
    "price BETWEEN 1.50 AND 20.00",
    "price NOT BETWEEN 1.50 AND 20.00",
    "qty BETWEEN 7 AND 2",
    "qty IN (1, 2, 3)",
    "qty NOT IN (1, 2, 3)",
    "qty IN (1, NULL)",
    "qty NOT IN (1, NULL)",
    "name IS NULL",
    "name IS NOT NULL",
    "price IS NULL OR qty IS NULL",
    "name LIKE 'a%'",
    "name NOT LIKE 'a%'",
    "name ILIKE '%b_%'",
    "name LIKE 'x\\%%'",
    "name LIKE '_a%'",
    "name ~ 'b[0-9]'",
    "name ~* '^b'",
    "name !~ 'a'",
    "name !~* 'A'",
    "regexp_like(name, 'ET', 'i')",
    "flag",
    "NOT flag",
    "flag = false",
    "(qty > 3 OR price < 5) AND NOT (name LIKE '%a%')",
    "NOT (qty > 3 AND price < 10)",
    "qty > 3 OR name = 'alpha'",
    "ship >= DATE '2020-01-10'",
    "ship < '2020-01-05'",
    "score > 0.5",
    "score <= -1",
    "disc = 0.05",
    "price > 10.001",
    "price * 2 > 10",
    "upper(name) = 'BETA'",
    "qty + 1 > 3",
];

#[tokio::test]
async fn filters_match_datafusion() {
    let f = fixture().await;
    for w in FILTERS {
        let sql = format!("SELECT * FROM items WHERE {w}");
        same(&f, &sql).await;
        same(&f, &format!("SELECT id, name FROM items WHERE {w}")).await;
        same(&f, &format!("SELECT count(*) FROM items WHERE {w}")).await;
    }
}

#[tokio::test]
async fn projections_limits_aggregates_and_joins_match() {
    let f = fixture().await;
    let queries = [
        "SELECT name, id FROM items",
        "SELECT count(*) FROM items",
        "SELECT count(name), count(price) FROM items",
        "SELECT id FROM items ORDER BY id DESC LIMIT 5",
        "SELECT count(*) FROM (SELECT id FROM items WHERE qty > 2 LIMIT 5)",
        "SELECT count(*) FROM (SELECT id FROM items LIMIT 7)",
        "SELECT qty, count(*), sum(price), min(name), max(ship), avg(price), avg(qty), \
         sum(price * disc), sum(price * (1 - disc)), min(price), max(score), sum(score), count(flag) \
         FROM items GROUP BY qty",
        "SELECT flag, name, sum(qty), avg(score) FROM items WHERE qty > 0 GROUP BY flag, name",
        "SELECT sum(qty), sum(-price), avg(disc), min(id), max(id) FROM items WHERE name LIKE '%a%'",
        "SELECT sum(qty) FROM items WHERE qty > 1000",
        "SELECT count(*) FROM items GROUP BY owner",
        "SELECT i.id, o.oname FROM items i JOIN owners o ON i.owner = o.owner_id \
         WHERE o.oname LIKE 'owner%' AND i.qty > 2",
        "SELECT o.oname, count(*), sum(i.price) FROM items i LEFT JOIN owners o \
         ON i.owner = o.owner_id GROUP BY o.oname",
        "SELECT id FROM items WHERE owner IN (SELECT owner_id FROM owners WHERE oname = 'owner1')",
    ];
    for q in queries {
        same(&f, q).await;
    }
}

#[tokio::test]
async fn limit_is_pushed_and_honoured() {
    let f = fixture().await;
    let b = run_sql(&f.insitu, "SELECT id FROM items WHERE qty > 2 LIMIT 5")
        .await
        .unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
    let plan = f.items.plans.lock().unwrap().last().cloned().unwrap();
    match plan.output {
        QueryOutput::Rows { limit, .. } => assert_eq!(limit, Some(5)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn explain_shows_pushed_filter_projection_and_limit() {
    let f = fixture().await;
    let e = explain(
        &f.insitu,
        "SELECT id FROM items WHERE qty > 5 AND name LIKE 'a%' LIMIT 3",
    )
    .await;
    assert!(e.contains("InsituScanExec: table=items"), "{e}");
    assert!(e.contains("pushed_filter=["), "{e}");
    assert!(e.contains("limit=3"), "{e}");
    assert!(!e.contains("FilterExec"), "the filter is exact: {e}");
    // A filter the servers cannot evaluate stays in DataFusion.
    let e = explain(&f.insitu, "SELECT id FROM items WHERE upper(name) = 'A'").await;
    assert!(e.contains("FilterExec"), "{e}");
    assert!(!e.contains("pushed_filter"), "{e}");
}

#[tokio::test]
async fn pushed_program_is_what_the_servers_get() {
    let f = fixture().await;
    run_sql(
        &f.insitu,
        "SELECT id FROM items WHERE qty BETWEEN 1 AND 4 AND name IS NOT NULL",
    )
    .await
    .unwrap();
    let plan = f.items.plans.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        plan.filter,
        vec![
            // DataFusion rewrites BETWEEN as two comparisons.
            Pred::Cmp {
                col: 1,
                op: CmpOp::Ge,
                value: Scalar::Int(1)
            },
            Pred::Cmp {
                col: 1,
                op: CmpOp::Le,
                value: Scalar::Int(4)
            },
            Pred::And,
            Pred::IsNull { col: 5 },
            Pred::Not,
            Pred::And,
        ]
    );
}

#[tokio::test]
async fn errors_are_clear() {
    let f = fixture().await;
    let e = run_sql(&f.insitu, "SELEC 1").await.unwrap_err().to_string();
    assert!(e.starts_with("SQL syntax error"), "{e}");
    let e = run_sql(&f.insitu, "SELECT nope FROM items")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("SQL planning error") && e.contains("nope"),
        "{e}"
    );
    let e = run_sql(&f.insitu, "SELECT * FROM nowhere")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("SQL planning error") && e.contains("nowhere"),
        "{e}"
    );
}

#[tokio::test]
async fn aggregates_are_pushed_and_exact() {
    let f = fixture().await;
    let pushed = [
        "SELECT qty, count(*), sum(price), avg(price), min(name), max(ship), avg(qty), \
         sum(price * (1 - disc)), count(name), sum(score), avg(score), min(price), max(flag) \
         FROM items WHERE name LIKE '%a%' GROUP BY qty",
        "SELECT count(*) FROM items",
        "SELECT count(*), sum(qty), avg(price) FROM items WHERE qty > 1000",
        "SELECT flag, name, sum(-qty), avg(disc) FROM items GROUP BY flag, name",
        "SELECT sum(price * disc * 2), avg(price - disc) FROM items WHERE price IS NOT NULL",
        "SELECT owner, sum(qty) AS s FROM items GROUP BY owner HAVING sum(qty) > 3 ORDER BY s, owner",
    ];
    for sql in pushed {
        let e = explain(&f.insitu, sql).await;
        assert!(e.contains("InsituAggregateExec"), "{sql}: {e}");
        assert!(!e.contains("AggregateExec: mode"), "{sql}: {e}");
        same(&f, sql).await;
        let plan = f.items.plans.lock().unwrap().last().cloned().unwrap();
        assert!(
            matches!(plan.output, QueryOutput::Aggregate { .. }),
            "{sql}: {plan:?}"
        );
    }
    // DataFusion plans count(DISTINCT x) as a group-by on x (pushed) under
    // its own count.
    same(
        &f,
        "SELECT count(DISTINCT qty), count(DISTINCT name) FROM items",
    )
    .await;
    // Not pushed (and still right): an unpushed filter below, a
    // function of a column, min of an expression.
    let kept = [
        "SELECT sum(qty) FROM items WHERE upper(name) = 'BETA'",
        "SELECT sum(length(name)) FROM items",
        "SELECT min(qty + 1) FROM items",
        "SELECT sum(qty), avg(qty) FROM items WHERE qty * 2 > 5",
    ];
    for sql in kept {
        let e = explain(&f.insitu, sql).await;
        assert!(!e.contains("InsituAggregateExec"), "{sql}: {e}");
        same(&f, sql).await;
    }
}

/// A sort key as (column, descending, nulls_first).
type Key = (u16, bool, bool);

/// The sort keys and limit of the last `Rows` plan `items` received.
fn last_order(f: &Fixture) -> (Vec<Key>, Option<u64>) {
    let plan = f.items.plans.lock().unwrap().last().cloned().unwrap();
    match plan.output {
        QueryOutput::Rows {
            order_by, limit, ..
        } => (
            order_by
                .iter()
                .map(|k| (k.col, k.descending, k.nulls_first))
                .collect(),
            limit,
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn order_by_limit_is_a_top_k_on_the_servers_and_matches_datafusion() {
    let f = fixture().await;
    // (query, expected sort keys, k).
    // Ties are broken by id so that the answer is one list.
    let cases: &[(&str, &[Key], u64)] = &[
        (
            "SELECT id, qty FROM items ORDER BY qty, id LIMIT 5",
            &[(1, false, false), (0, false, false)],
            5,
        ),
        (
            "SELECT id, qty FROM items ORDER BY qty DESC, id LIMIT 5",
            &[(1, true, true), (0, false, false)],
            5,
        ),
        (
            "SELECT id, qty FROM items ORDER BY qty DESC NULLS LAST, id LIMIT 7",
            &[(1, true, false), (0, false, false)],
            7,
        ),
        (
            "SELECT id, qty FROM items ORDER BY qty NULLS FIRST, id DESC LIMIT 7",
            &[(1, false, true), (0, true, true)],
            7,
        ),
        (
            "SELECT name, id FROM items WHERE qty > 0 ORDER BY name, id LIMIT 4",
            &[(5, false, false), (0, false, false)],
            4,
        ),
        (
            "SELECT id, price FROM items ORDER BY price DESC, id LIMIT 3",
            &[(2, true, true), (0, false, false)],
            3,
        ),
        (
            "SELECT id FROM items ORDER BY ship, id LIMIT 6",
            &[(4, false, false), (0, false, false)],
            6,
        ),
        (
            "SELECT id, flag FROM items ORDER BY flag DESC, id LIMIT 5",
            &[(6, true, true), (0, false, false)],
            5,
        ),
        // OFFSET: the servers keep offset + limit rows.
        (
            "SELECT id, qty FROM items ORDER BY qty, id LIMIT 3 OFFSET 4",
            &[(1, false, false), (0, false, false)],
            7,
        ),
        // More than the table holds: every row, in order.
        (
            "SELECT id, disc FROM items ORDER BY disc DESC, id LIMIT 100",
            &[(3, true, true), (0, false, false)],
            100,
        ),
    ];
    for (sql, keys, k) in cases {
        let rows = same(&f, sql).await;
        assert!(rows > 0, "{sql}: no rows");
        assert_eq!(last_order(&f), (keys.to_vec(), Some(*k)), "{sql}");
    }
}

#[tokio::test]
async fn a_top_k_that_could_choose_other_rows_is_not_pushed() {
    let f = fixture().await;
    for sql in [
        // NaN sorts above every number in DataFusion, unordered on the servers.
        "SELECT id FROM items ORDER BY score, id LIMIT 3",
        // The filter stays in DataFusion, above the scan: the scan's rows
        // are not the ones the sort chooses from.
        "SELECT id FROM items WHERE upper(name) = 'BETA' ORDER BY id LIMIT 2",
        // Not a stored column.
        "SELECT id FROM items ORDER BY qty + 1, id LIMIT 3",
        // No limit: nothing to cut.
        "SELECT id FROM items WHERE qty > 3 ORDER BY id",
        // More rows than a tablet may sort (MAX_TOP_K).
        "SELECT id FROM items ORDER BY id LIMIT 100001",
    ] {
        same(&f, sql).await;
        assert!(last_order(&f).0.is_empty(), "{sql} was pushed");
    }
}

#[tokio::test]
async fn explain_shows_the_top_k_order() {
    let f = fixture().await;
    let e = explain(
        &f.insitu,
        "SELECT id, qty FROM items WHERE qty > 0 ORDER BY qty DESC, id LIMIT 5",
    )
    .await;
    assert!(
        e.contains("top_k_order=[qty DESC NULLS FIRST, id ASC NULLS LAST], limit=5"),
        "{e}"
    );
}
