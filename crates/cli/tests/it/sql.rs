//! `insitu sql` on a real cluster (separate processes): filters, joins and
//! aggregates over typed tables, the output formats, the errors a user
//! meets, and the 22 TPC-H queries against answers computed by another
//! engine.

use crate::common;

use common::{Cluster, fails, ok, users_table};

fn sql_csv(cluster: &Cluster, sql: &str) -> String {
    ok(cluster.cli(&["sql", "--format", "csv", sql]))
}

/// The plan `explain` prints for `query`.
fn explain(cluster: &Cluster, query: &str) -> String {
    sql_csv(cluster, &format!("explain {query}"))
}

/// Assert that `query`'s plan probes an index with `probe` (as `index=[...]` shows it).
fn assert_probes(cluster: &Cluster, query: &str, probe: &str) {
    let plan = explain(cluster, query);
    assert!(plan.contains(&format!("index=[{probe}]")), "{plan}");
}

#[test]
fn sql_over_typed_tables() {
    let cluster = Cluster::start(2, 2);
    users_table(&cluster);
    ok(cluster.cli(&[
        "table",
        "create",
        "orders",
        "--schema",
        "oid int64, uid int64, placed date32, amount decimal(12,2)",
        "--key",
        "oid",
    ]));
    // An untyped table has no columns: SQL does not list it.
    ok(cluster.cli(&["table", "create", "blobs"]));
    ok(cluster.cli(&[
        "insert",
        "orders",
        "10,1,2024-01-05,100.00",
        "11,1,2024-02-01,50.25",
        "12,3,2024-02-03,7.00",
    ]));

    // A filter (pushed to the servers) with NULL treated as SQL does.
    assert_eq!(
        sql_csv(
            &cluster,
            "select name, age from users where age > 30 order by name"
        ),
        "name,age\nalice,31\ncarol,45\n"
    );
    assert_eq!(
        sql_csv(&cluster, "select name from users where age is null"),
        "name\nbob\n"
    );
    // Aggregates run on the servers; decimals stay exact.
    assert_eq!(
        sql_csv(
            &cluster,
            "select count(*) as n, sum(score) as s, max(name) as m from users"
        ),
        "n,s,m\n3,12.75,carol\n"
    );
    // A join and a group-by run in this process over the servers' rows.
    assert_eq!(
        sql_csv(
            &cluster,
            "select u.name, sum(o.amount) as total, count(*) as n from users u \
             join orders o on u.id = o.uid where o.placed >= date '2024-01-01' \
             group by u.name order by total desc"
        ),
        "name,total,n\nalice,150.25,2\ncarol,7.00,1\n"
    );
    // EXPLAIN shows what the servers evaluate.
    let plan = ok(cluster.cli(&["sql", "explain select count(*) from users where age > 30"]));
    assert!(plan.contains("InsituAggregate"), "{plan}");

    // JSON: one object per row.
    let json = ok(cluster.cli(&[
        "sql",
        "--format",
        "json",
        "select id, name from users where id = 2",
    ]));
    assert_eq!(json.trim(), r#"{"id":2,"name":"bob"}"#);
    // The default is an aligned table.
    let table = ok(cluster.cli(&["sql", "select name from users where id = 1"]));
    assert!(table.contains("| alice |"), "{table}");

    // Errors name what was wrong and leave the servers up.
    let e = fails(cluster.cli(&["sql", "select * from nope"]));
    assert!(e.contains("nope"), "{e}");
    let e = fails(cluster.cli(&["sql", "selec 1"]));
    assert!(e.contains("syntax error"), "{e}");
    let e = fails(cluster.cli(&["sql", "select height from users"]));
    assert!(e.contains("height"), "{e}");
    let e = fails(cluster.cli(&["sql", "select * from blobs"]));
    assert!(e.contains("blobs"), "{e}");
    let e = fails(cluster.cli(&["sql", "--format", "xml", "select 1"]));
    assert!(e.contains("unknown format"), "{e}");
    assert_eq!(
        sql_csv(&cluster, "select count(*) as n from users"),
        "n\n3\n"
    );
}

#[test]
fn indexed_columns_are_probed_and_explain_says_so() {
    let cluster = Cluster::start(1, 2);
    users_table(&cluster);
    let out = ok(cluster.cli(&["index", "create", "users", "age"]));
    assert!(out.contains("created index on users.age"), "{out}");
    ok(cluster.cli(&["index", "create", "users", "name"]));
    assert_eq!(
        ok(cluster.cli(&["index", "list"])),
        "users\tname\nusers\tage\n"
    );
    assert_probes(
        &cluster,
        "select name from users where age = 31",
        "age = 31",
    );
    assert_eq!(
        sql_csv(&cluster, "select name from users where age = 31"),
        "name\nalice\n"
    );
    // Written after the index was built: found through it.
    ok(cluster.cli(&["insert", "users", "4,dave,31,2"]));
    assert_eq!(
        sql_csv(
            &cluster,
            "select name from users where age = 31 order by name"
        ),
        "name\nalice\ndave\n"
    );
    assert_probes(
        &cluster,
        "select id from users where name in ('bob', 'dave')",
        "name IN ('bob', 'dave')",
    );
    assert_eq!(
        sql_csv(
            &cluster,
            "select id from users where name in ('bob', 'dave') order by id"
        ),
        "id\n2\n4\n"
    );
    assert_probes(
        &cluster,
        "select id from users where age between 30 and 40",
        "30 <= age <= 40",
    );
    // Aggregates pushed to the servers probe too.
    assert_probes(
        &cluster,
        "select count(*) from users where age = 31",
        "age = 31",
    );
    assert_eq!(
        sql_csv(&cluster, "select count(*) as n from users where age = 31"),
        "n\n2\n"
    );
    // So do `count` and `agg` with a --where that pins the column: they
    // visit only the matching rows (the servers say how many they visited).
    let out = cluster.cli(&["count", "users", "--where", "age = 31"]);
    assert_eq!(ok(out.clone()), "2\n");
    assert!(out.2.contains("2 rows matched of 2 "), "{}", out.2);
    let out = cluster.cli(&[
        "agg",
        "users",
        "sum",
        "score",
        "--where",
        "age in (31, 45) and id > 1",
    ]);
    assert_eq!(ok(out.clone()), "1.00\n");
    assert!(out.2.contains("2 rows matched of 3 "), "{}", out.2);
    // A one-sided range is not selective enough to probe.
    let plan = explain(&cluster, "select id from users where age > 30");
    assert!(!plan.contains("index="), "{plan}");
    let e = fails(cluster.cli(&["index", "create", "users", "score2"]));
    assert!(e.contains("no column \"score2\""), "{e}");
    ok(cluster.cli(&["index", "drop", "users", "age"]));
    let plan = explain(&cluster, "select name from users where age = 31");
    assert!(!plan.contains("index="), "{plan}");
}

#[test]
fn tpch_queries_match_the_stored_answers() {
    let cluster = Cluster::start(2, 2);
    let out = ok(cluster.cli(&["tpch", "load", "--sf", "0.01"]));
    assert!(out.contains("lineitem"), "{out}");
    let mut failures = Vec::new();
    for n in 1..=22u32 {
        let sql = insitu_tpch::query(n).expect("22 queries");
        let out = cluster.cli(&["sql", "--format", "csv", sql]);
        if out.0 != 0 {
            failures.push(format!("q{n:02}: failed: {}", out.2));
            continue;
        }
        let mut rows = insitu_tpch::check::parse_csv(&out.1).expect("our CSV parses");
        // Our header row; the stored answer's names are DuckDB's.
        rows.remove(0);
        if let Err(e) = insitu_tpch::check::compare_sf0_01(n, &rows) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn sql_at_a_snapshot_reads_one_instant_of_every_table() {
    let cluster = Cluster::start(1, 2);
    users_table(&cluster);
    let at = |args: &[&str]| {
        let (code, out, err) = cluster.cli(args);
        assert_eq!(code, 0, "{out}{err}");
        // The last timestamp printed is the one read at (a refused first
        // one, below the servers' new floor, is replaced by a fresh one).
        let ts = err
            .lines()
            .filter_map(|l| l.strip_prefix("snapshot at timestamp "))
            .next_back()
            .unwrap_or_else(|| panic!("no timestamp printed: {err}"))
            .to_string();
        (out, ts)
    };
    let query = "select count(*) as n, max(age) as oldest from users";
    let (out, ts) = at(&["sql", "--snapshot", "--format", "csv", query]);
    assert_eq!(out, "n,oldest\n3,45\n");

    // Typed rows written by a transaction after the snapshot: a new row and
    // one replaced.
    let script = cluster.dir.path().join("txn.txt");
    std::fs::write(
        &script,
        "insert users 4,dave,70,1.00\ninsert users 1,alice,32,10.50\n",
    )
    .unwrap();
    let script = script.to_str().unwrap();
    ok(cluster.cli(&["txn", script]));

    assert_eq!(sql_csv(&cluster, query), "n,oldest\n4,70\n");
    assert_eq!(
        ok(cluster.cli(&["sql", "--at", &ts, "--format", "csv", query])),
        "n,oldest\n3,45\n",
        "as of the snapshot"
    );
    assert_eq!(
        ok(cluster.cli(&[
            "sql",
            "--at",
            &ts,
            "--format",
            "csv",
            "select name, age from users where id = 1"
        ])),
        "name,age\nalice,31\n"
    );
    // Plain writes after the snapshot (`insitu insert`: a multiWrite, no
    // transaction): a new row and one replaced. Neither is seen at it
    // (before, both were: plain writes took no timestamp).
    ok(cluster.cli(&["insert", "users", "6,fay,80,2.00", "3,carol,46,-1"]));
    assert_eq!(sql_csv(&cluster, query), "n,oldest\n5,80\n");
    assert_eq!(
        ok(cluster.cli(&["sql", "--at", &ts, "--format", "csv", query])),
        "n,oldest\n3,45\n",
        "plain writes after the snapshot"
    );
    // A timestamp the oracle has not handed out is refused.
    let e = fails(cluster.cli(&["sql", "--at", "999999999999999999", query]));
    assert!(e.contains("in the future"), "{e}");
    // Scripts name what a typed table takes.
    std::fs::write(cluster.dir.path().join("bad.txt"), "get users 1\n").unwrap();
    let bad = cluster.dir.path().join("bad.txt");
    let e = fails(cluster.cli(&["txn", bad.to_str().unwrap()]));
    assert!(e.contains("insert users ROW"), "{e}");
    std::fs::write(&bad, "insert users 5,erin,notanumber,1\n").unwrap();
    let e = fails(cluster.cli(&["txn", bad.to_str().unwrap()]));
    assert!(e.contains("age") || e.contains("notanumber"), "{e}");
}

/// A query reads one snapshot by default on tables of several tablets: while
/// `insitu txn` writes pairs of rows that sum to zero (row 2j to i, row 2j+1
/// to -i, the two rows mostly on different tablets and shards), every
/// `select sum(bal)` answers 0, run alone or as statements of the shell. With `--no-snapshot` a sum may see one row
/// of a commit and not the other; it is run once here only to check the
/// flag is taken. An UPDATE is not a query and runs without a snapshot.
#[test]
fn sql_queries_read_one_snapshot_by_default() {
    let cluster = Cluster::start(1, 2);
    ok(cluster.cli(&[
        "table",
        "create",
        "pairs",
        "--schema",
        "id int64, bal int64",
        "--key",
        "id",
        "--tablets",
        "4",
    ]));
    const PAIRS: i64 = 8;
    let rows: Vec<String> = (0..2 * PAIRS)
        .map(|id| format!("insert pairs {id},0"))
        .collect();
    let script = cluster.dir.path().join("zeros.txn");
    std::fs::write(&script, rows.join("\n") + "\n").unwrap();
    ok(cluster.cli(&["txn", script.to_str().unwrap()]));
    let query = "select sum(bal) as s, count(*) as n from pairs";
    let want = format!("s,n\n0,{}\n", 2 * PAIRS);
    assert_eq!(sql_csv(&cluster, query), want);

    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Two writers, each on its own half of the pairs (no conflicts).
        for w in 0..2i64 {
            let stop = &stop;
            let cluster = &cluster;
            scope.spawn(move || {
                let script = cluster.dir.path().join(format!("pair{w}.txn"));
                let mut i = 1i64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let j = (2 * i + w) % PAIRS;
                    let text = format!(
                        "insert pairs {},{i}\ninsert pairs {},{}\n",
                        2 * j,
                        2 * j + 1,
                        -i
                    );
                    std::fs::write(&script, text).unwrap();
                    ok(cluster.cli(&["txn", script.to_str().unwrap()]));
                    i += 1;
                }
            });
        }
        let mut answers: Vec<(i32, String, String)> = (0..50)
            .map(|_| cluster.cli(&["sql", "--format", "csv", query]))
            .collect();
        // The shell: each statement reads a snapshot of its own.
        let statements = format!("{query};\n").repeat(30);
        let (code, out, err) =
            common::cli_with_input(&cluster.addr(), &["sql", "--format", "csv"], &statements);
        for answer in out.split("s,n\n").skip(1) {
            answers.push((code, format!("s,n\n{answer}"), err.clone()));
        }
        let shell_output = format!("{out}{err}");
        // Stopped before any assertion, so a failing one does not leave
        // the writer running and the scope waiting for it.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(answers.len(), 80, "{shell_output}");
        for (code, out, err) in answers {
            assert_eq!((code, out.as_str()), (0, want.as_str()), "{err}");
        }
    });
    let out = ok(cluster.cli(&["sql", "--no-snapshot", "--format", "csv", query]));
    assert!(out.starts_with("s,n\n"), "{out}");
    let e = fails(cluster.cli(&["sql", "--no-snapshot", "--snapshot", query]));
    assert!(
        e.contains("--no-snapshot") || e.contains("cannot be used"),
        "{e}"
    );
    // An UPDATE is not a query: it runs (on the newest rows) by default.
    ok(cluster.cli(&["sql", "update pairs set bal = 1 where id >= 0"]));
    let ones = 2 * PAIRS;
    assert_eq!(sql_csv(&cluster, query), format!("s,n\n{ones},{ones}\n"));
}

/// A query whose answer is too large to hold at one snapshot (rows of a
/// 14 MiB server that cannot also hold them as pages) is refused at the
/// default snapshot with a line saying how to read without one, and
/// `--no-snapshot` reads it (paged in hash order).
#[test]
fn a_default_snapshot_too_large_to_hold_says_how_to_read_without() {
    let (_up, _line, addr, dir) = common::start_up(1, 14);
    let cli = |args: &[&str]| common::cli(&addr, args);
    ok(cli(&[
        "table",
        "create",
        "wide",
        "--schema",
        "id int64, pad utf8",
        "--key",
        "id",
        "--tablets",
        "2",
    ]));
    let csv = dir.path().join("wide.csv");
    let mut text = String::from("id,pad\n");
    for i in 0..12_000 {
        text.push_str(&format!("{i},{i:0>500}\n"));
    }
    std::fs::write(&csv, text).unwrap();
    ok(cli(&["load", "wide", csv.to_str().unwrap()]));
    let query = "select id, pad from wide";
    let e = fails(cli(&["sql", "--format", "csv", query]));
    assert!(
        e.contains("more than one tablet may hold") && e.contains("--no-snapshot"),
        "{e}"
    );
    let out = ok(cli(&["sql", "--no-snapshot", "--format", "csv", query]));
    assert_eq!(out.lines().count(), 1 + 12_000);
}
