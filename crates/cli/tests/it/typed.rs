//! Typed tables on a real cluster (separate processes): create with a
//! schema, insert and load rows, count and aggregate by column name with a
//! typed --where, queries answered in pages, and the refusals a user meets.

use crate::common;

use std::collections::HashSet;

use common::typed::{rows_plan, typed_table};
use common::{Cluster, fails, ok, rt, users_table};
use insitu_client::QueryAnswer;
use insitu_protocol::query::Scalar;

#[test]
fn typed_table_from_the_cli() {
    let mut cluster = Cluster::start(2, 2);
    users_table(&cluster);
    assert_eq!(cluster.answer(&["count", "users"]), "3");
    // Typed counts and aggregates read one snapshot, as untyped ones do: by
    // default when the table has several tablets, always with
    // --at-snapshot, never with --no-snapshot (the stderr line names it).
    for (args, snapshot) in [
        (&["count", "users"][..], true),
        (&["count", "users", "--at-snapshot"], true),
        (&["agg", "users", "sum", "score", "--at-snapshot"], true),
        (&["count", "users", "--no-snapshot"], false),
    ] {
        let (code, out, err) = cluster.cli(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let want = if args[0] == "count" { "3" } else { "12.75" };
        assert_eq!(out.trim(), want, "{args:?}");
        assert_eq!(err.contains(" at snapshot "), snapshot, "{args:?}: {err}");
    }
    for (filter, want) in [
        ("age > 30", "2"),
        ("age is null", "1"),
        // NULL is not > 30 and not <= 30: SQL's three-valued logic.
        ("not age > 30", "0"),
        ("name like 'a%' or name ~ '^c'", "2"),
    ] {
        assert_eq!(cluster.count_where("users", filter), want, "{filter}");
    }
    assert_eq!(cluster.answer(&["agg", "users", "sum", "score"]), "12.75");
    assert_eq!(cluster.answer(&["agg", "users", "max", "name"]), "carol");
    assert_eq!(
        cluster.answer(&["agg", "users", "sum", "score", "--where", "score > 0"]),
        "13.75"
    );

    // Refusals name what was wrong.
    let e = fails(cluster.cli(&["insert", "users", "4,dave,old,1"]));
    assert!(e.contains("age") && e.contains("not an integer"), "{e}");
    let e = fails(cluster.cli(&["insert", "users", "4,dave,40,1.234"]));
    assert!(e.contains("score"), "{e}");
    let e = fails(cluster.cli(&["count", "users", "--where", "height > 1"]));
    assert!(e.contains("height"), "{e}");
    let e = fails(cluster.cli(&["count", "users", "--where", "name ~ '('"]));
    assert!(
        e.to_lowercase().contains("regex") || e.contains("pattern"),
        "{e}"
    );
    let e = fails(cluster.cli(&["count", "users", "--where", "name > 3"]));
    assert!(e.contains("name"), "{e}");
    let e = fails(cluster.cli(&["agg", "users", "sum", "i64@0"]));
    assert!(e.contains("no column"), "{e}");
    let e = fails(cluster.cli(&["put", "users", "k", "v"]));
    assert!(
        e.contains("typed table") && e.contains("insitu insert"),
        "{e}"
    );
    let e = fails(cluster.cli(&[
        "table",
        "create",
        "bad",
        "--schema",
        "a int64 null",
        "--key",
        "a",
    ]));
    assert!(e.contains("NOT NULL"), "{e}");

    // Load a CSV whose header orders the columns differently.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("more.csv");
    let mut text = String::from("score,name,id,age\n");
    for i in 10..110 {
        text.push_str(&format!(
            "{}.5,user{i},{i},{}\n",
            i,
            if i % 2 == 0 { "20" } else { "" }
        ));
    }
    std::fs::write(&csv, text).unwrap();
    let out = ok(cluster.cli(&["load", "users", csv.to_str().unwrap()]));
    assert!(out.contains("loaded 100 rows"), "{out}");
    assert_eq!(cluster.answer(&["count", "users"]), "103");
    assert_eq!(cluster.count_where("users", "age = 20"), "50");

    // The schema is durable metadata: a restarted coordinator still knows it.
    cluster.restart_coordinator();
    assert_eq!(cluster.count_where("users", "id between 10 and 19"), "10");
}

#[test]
fn untyped_aggregates_say_what_the_field_reads() {
    let cluster = Cluster::start(1, 1);
    ok(cluster.cli(&["table", "create", "docs"]));
    ok(cluster.cli(&["put", "docs", "alice", "{\"age\": 31}"]));
    let out = cluster.cli(&["agg", "docs", "sum", "i64@0"]);
    assert_eq!(out.0, 0, "{}", out.2);
    assert!(
        out.2.contains("untyped table") && out.2.contains("little-endian"),
        "{}",
        out.2
    );
    let e = fails(cluster.cli(&["agg", "docs", "sum", "age"]));
    assert!(e.contains("untyped"), "{e}");
}

#[test]
fn large_answers_come_in_pages_with_every_row_once() {
    let cluster = Cluster::start(2, 1);
    let rt = rt();
    let (client, t) = typed_table(&cluster, &rt, "wide", 2, "id int64, pad utf8", "id");
    // 12 000 rows of ~500 bytes: ~6 MB, several 1 MiB pages per tablet.
    let n = 12_000i64;
    rt.block_on(async {
        for start in (0..n).step_by(1000) {
            let rows: Vec<Vec<Scalar>> = (start..start + 1000)
                .map(|i| vec![Scalar::Int(i), Scalar::Str(format!("{i:0>500}"))])
                .collect();
            for r in client.put_rows(t, &rows).await.unwrap() {
                r.unwrap();
            }
        }
        let plan = rows_plan(vec![0, 1], None);
        let out = client.query(t, &plan).await.unwrap();
        assert!(out.pages > 4, "{} pages", out.pages);
        let QueryAnswer::Rows(batches) = out.answer else {
            panic!("rows expected")
        };
        let mut seen = HashSet::new();
        for b in &batches {
            let ids = b
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .unwrap();
            for i in 0..b.num_rows() {
                assert!(seen.insert(ids.value(i)), "row {} twice", ids.value(i));
            }
        }
        assert_eq!(seen.len() as i64, n);

        // A LIMIT stops early and returns exactly that many rows.
        let plan = rows_plan(vec![0], Some(7));
        let out = client.query(t, &plan).await.unwrap();
        let QueryAnswer::Rows(batches) = out.answer else {
            panic!("rows expected")
        };
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 7);
    });
}

#[test]
fn a_row_written_without_the_schema_fails_the_query_not_the_server() {
    let cluster = Cluster::start(1, 1);
    let rt = rt();
    let (client, t) = typed_table(&cluster, &rt, "t", 1, "id int64, v int64", "id");
    rt.block_on(async {
        client
            .put_rows(t, &[vec![Scalar::Int(1), Scalar::Int(5)]])
            .await
            .unwrap();
        client.write(t, b"junk", b"not a row").await.unwrap();
        let plan = rows_plan(vec![0, 1], None);
        let e = client.query(t, &plan).await.unwrap_err().to_string();
        assert!(e.contains("junk") && e.contains("not a typed row"), "{e}");
        client.remove(t, b"junk").await.unwrap();
        // A row of the format whose NOT NULL `id` is marked NULL (tag, null
        // bitmap with bit 0 set, id, v): the Arrow answer declares `id`
        // non-nullable, and building it from this row used to panic the shard.
        let mut nulled = vec![0xA1, 0b01];
        nulled.extend_from_slice(&0i64.to_le_bytes());
        nulled.extend_from_slice(&7i64.to_le_bytes());
        client.write(t, b"nulled", &nulled).await.unwrap();
        let e = client.query(t, &plan).await.unwrap_err().to_string();
        assert!(e.contains("nulled") && e.contains("NOT NULL"), "{e}");
        client.remove(t, b"nulled").await.unwrap();
        let out = client.query(t, &plan).await.unwrap();
        assert_eq!(out.matched, 1);
    });
}

/// A Parquet file of `ids`, with columns `id` and `name`.
fn parquet_of(ids: std::ops::Range<i64>) -> Vec<u8> {
    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    let names: Vec<String> = ids.clone().map(|i| format!("name{i}")).collect();
    let batch = RecordBatch::try_from_iter(vec![
        (
            "id",
            std::sync::Arc::new(Int64Array::from(ids.collect::<Vec<_>>())) as ArrayRef,
        ),
        (
            "name",
            std::sync::Arc::new(StringArray::from(names)) as ArrayRef,
        ),
    ])
    .unwrap();
    let mut out = Vec::new();
    let mut writer = parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    out
}

/// Whether the Parquet reader panics reading `bytes` whole.
fn reader_panics(bytes: &[u8]) -> bool {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let bytes = bytes::Bytes::copy_from_slice(bytes);
    std::panic::catch_unwind(move || {
        let Ok(builder) = ParquetRecordBatchReaderBuilder::try_new(bytes) else {
            return;
        };
        let Ok(reader) = builder.with_batch_size(100).build() else {
            return;
        };
        for batch in reader {
            if batch.is_err() {
                return;
            }
        }
    })
    .is_err()
}

/// `insitu load` of a damaged Parquet file: the Parquet crate panics on
/// some damaged files instead of returning an error; the CLI says the file
/// is damaged, naming it, with no crash report, and the cluster is as
/// before. The test damages a valid file (a few bytes changed, from a fixed
/// seed) until the reader panics on it, so it keeps testing the panic path
/// whichever damage the reader's version panics on.
#[test]
fn a_damaged_parquet_file_is_refused_with_a_clear_error() {
    let cluster = Cluster::start(1, 1);
    ok(cluster.cli(&[
        "table",
        "create",
        "pq",
        "--schema",
        "id int64, name utf8",
        "--key",
        "id",
    ]));
    let dir = tempfile::tempdir().unwrap();
    let good = parquet_of(0..2000);
    let path = dir.path().join("good.parquet");
    std::fs::write(&path, &good).unwrap();
    let out = ok(cluster.cli(&["load", "pq", path.to_str().unwrap()]));
    assert!(out.contains("loaded 2000 rows"), "{out}");

    // The default hook would print every panic the search below meets; the
    // other tests' threads keep theirs.
    let report: std::sync::Arc<dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync> =
        std::sync::Arc::from(std::panic::take_hook());
    let here = std::thread::current().id();
    let others = report.clone();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() != here {
            others(info);
        }
    }));
    let mut rng = insitu_testkit::rng(0xDA_4A6E);
    let damaged = (0..100_000).find_map(|_| {
        let mut bytes = good.clone();
        for _ in 0..rng.usize(1..4) {
            let at = rng.usize(0..bytes.len());
            bytes[at] = match rng.u8(0..3) {
                0 => bytes[at] ^ (1 << rng.u8(0..8)),
                1 => rng.u8(..),
                _ => 0xFF,
            };
        }
        reader_panics(&bytes).then_some(bytes)
    });
    std::panic::set_hook(Box::new(move |info| report(info)));
    let damaged = damaged.expect(
        "none of 100,000 damaged copies made the Parquet reader panic: \
         it may return errors for all now, and this test needs another way in",
    );
    let path = dir.path().join("damaged.parquet");
    std::fs::write(&path, &damaged).unwrap();
    let err = fails(cluster.cli(&["load", "pq", path.to_str().unwrap()]));
    assert!(
        err.contains("damaged.parquet is damaged or not a Parquet file"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // The cluster serves as before (a damaged batch may have loaded rows
    // before the one that failed, as any failed load may).
    let count: u64 = cluster.answer(&["count", "pq"]).parse().unwrap();
    assert!((2000..=4000).contains(&count), "{count}");
}
