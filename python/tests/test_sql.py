"""Typed tables from Python: create_table(schema=, key=), insert_arrow, schema,
and SQL answered as a pyarrow.Table, against a real cluster."""

import asyncio
import datetime
import decimal
import os
import subprocess
import threading
import uuid

import pyarrow as pa
import pytest
from conftest import insitu_bin, run_bounded

import insitu
from insitu import aio

# The columns every test table here has: one of each type insitu stores.
SCHEMA_TEXT = ("id int64, qty int32, price decimal(15,2), shipped date32, "
               "comment utf8 null, rush bool, weight float64 null")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def typed(client):
    """A fresh typed table of SCHEMA_TEXT keyed by id, dropped after the test."""
    name = unique("sql")
    t = client.create_table(name, tablets=4, schema=SCHEMA_TEXT, key="id")
    yield t
    client.drop_table(name)


def rows(n: int, start: int = 0) -> pa.Table:
    """n rows of SCHEMA_TEXT's columns, every value derived from the id."""
    ids = list(range(start, start + n))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "qty": pa.array([i % 50 for i in ids], pa.int32()),
        "price": pa.array([decimal.Decimal(i % 1000) / 100 for i in ids], pa.decimal128(15, 2)),
        "shipped": pa.array([datetime.date(1995, 1, 1) + datetime.timedelta(days=i % 365)
                             for i in ids], pa.date32()),
        "comment": pa.array([None if i % 7 == 0 else f"row {i} ünïcode" for i in ids],
                            pa.string()),
        "rush": pa.array([i % 3 == 0 for i in ids], pa.bool_()),
        "weight": pa.array([None if i % 5 == 0 else i * 0.5 for i in ids], pa.float64()),
    })


def test_rows_inserted_from_arrow_come_back_from_sql_unchanged(client, typed):
    data = rows(2_500)
    assert typed.insert_arrow(data, batch_rows=1_000) == 2_500
    got = client.sql(f"SELECT * FROM {typed.name} ORDER BY id")
    assert isinstance(got, pa.Table)
    assert got.num_rows == 2_500
    assert got.column_names == data.column_names
    assert got.schema.field("price").type == pa.decimal128(15, 2)
    assert got.schema.field("shipped").type == pa.date32()
    assert got.to_pylist() == data.to_pylist()


def test_sql_update_and_delete_run_in_the_servers(client, typed):
    data = rows(1_000)
    typed.insert_arrow(data)
    got = client.sql(f"UPDATE {typed.name} SET qty = qty + 100, comment = 'x' WHERE rush")
    rush = sum(1 for i in range(1_000) if i % 3 == 0)
    assert got.to_pylist() == [{"count": rush}]
    back = client.sql(f"SELECT id, qty, comment FROM {typed.name} ORDER BY id").to_pylist()
    for i, r in enumerate(back):
        if i % 3 == 0:
            assert (r["qty"], r["comment"]) == (i % 50 + 100, "x")
        else:
            assert r["qty"] == i % 50
    got = client.sql(f"DELETE FROM {typed.name} WHERE qty >= 100")
    assert got.to_pylist() == [{"count": rush}]
    n = client.sql(f"SELECT count(*) AS n FROM {typed.name}").to_pylist()[0]["n"]
    assert n == 1_000 - rush
    with pytest.raises(insitu.BadRequest, match="SET qty = <value>"):
        client.sql(f"UPDATE {typed.name} SET qty = weight")


def test_sql_aggregates_match_the_same_sums_in_python(client, typed):
    data = rows(3_000)
    typed.insert_arrow(data)
    got = client.sql(
        f"SELECT count(*) AS n, sum(qty) AS q, sum(price) AS p, max(shipped) AS d "
        f"FROM {typed.name} WHERE rush AND price > 2.50").to_pylist()
    chosen = [r for r in data.to_pylist() if r["rush"] and r["price"] > decimal.Decimal("2.50")]
    assert got == [{
        "n": len(chosen),
        "q": sum(r["qty"] for r in chosen),
        "p": sum(r["price"] for r in chosen),
        "d": max(r["shipped"] for r in chosen),
    }]
    grouped = client.sql(
        f"SELECT rush, count(*) AS n FROM {typed.name} GROUP BY rush ORDER BY rush").to_pylist()
    assert grouped == [{"rush": False, "n": 2_000}, {"rush": True, "n": 1_000}]


def test_sql_joins_two_tables_and_gives_pandas(client, typed):
    pandas = pytest.importorskip("pandas")
    typed.insert_arrow(rows(100))
    names = client.create_table(unique("names"), schema="qty int32, label utf8", key="qty")
    try:
        names.insert_arrow({"qty": pa.array([1, 2], pa.int32()), "label": ["one", "two"]})
        got = client.sql(
            f"SELECT n.label, count(*) AS c FROM {typed.name} t JOIN {names.name} n "
            f"ON t.qty = n.qty GROUP BY n.label ORDER BY n.label")
        frame = got.to_pandas()
        assert isinstance(frame, pandas.DataFrame)
        assert frame.to_dict("records") == [{"label": "one", "c": 2}, {"label": "two", "c": 2}]
    finally:
        client.drop_table(names.name)


def test_an_empty_result_keeps_its_columns(client, typed):
    got = client.sql(f"SELECT id, comment FROM {typed.name} WHERE id < 0")
    assert got.num_rows == 0
    assert got.column_names == ["id", "comment"]


def test_a_row_with_the_same_key_replaces_the_old_one(client, typed):
    typed.insert_arrow(rows(10))
    newer = rows(1, start=4).set_column(1, "qty", pa.array([999], pa.int32()))
    typed.insert_arrow(newer)
    got = client.sql(f"SELECT count(*) AS n, max(qty) AS q FROM {typed.name}").to_pylist()
    assert got == [{"n": 10, "q": 999}]


def test_every_kind_of_arrow_input_is_taken(client, typed):
    data = rows(40)
    batches = data.to_batches(max_chunksize=10)
    assert typed.insert_arrow(batches[0]) == 10
    assert typed.insert_arrow(pa.RecordBatchReader.from_batches(data.schema, batches[1:2])) == 10
    assert typed.insert_arrow(batches[2:3]) == 10
    assert typed.insert_arrow(batches[3].to_pandas()) == 10
    assert client.sql(f"SELECT count(*) AS n FROM {typed.name}").to_pylist() == [{"n": 40}]


def test_missing_nullable_columns_are_null_and_columns_match_by_name(client, typed):
    # Columns in another order, the nullable "comment" and "weight" left out.
    data = rows(5).select(["rush", "shipped", "price", "qty", "id"])
    assert typed.insert_arrow(data) == 5
    got = client.sql(f"SELECT count(*) AS n FROM {typed.name} "
                     f"WHERE comment IS NULL AND weight IS NULL").to_pylist()
    assert got == [{"n": 5}]


def test_a_large_insert_goes_in_steps(client, typed):
    assert typed.insert_arrow(rows(25_000), batch_rows=4_096) == 25_000
    got = client.sql(f"SELECT count(*) AS n, sum(id) AS s FROM {typed.name}").to_pylist()
    assert got == [{"n": 25_000, "s": sum(range(25_000))}]


def test_schema_is_the_tables_columns_as_pyarrow(client, typed):
    s = typed.schema
    assert isinstance(s, pa.Schema)
    assert s.names == ["id", "qty", "price", "shipped", "comment", "rush", "weight"]
    assert s.field("id").type == pa.int64() and not s.field("id").nullable
    assert s.field("comment").type == pa.string() and s.field("comment").nullable
    assert client.table(typed.name).schema == s


def test_an_untyped_table_has_no_schema_and_takes_no_arrow(client, table):
    assert table.schema is None
    with pytest.raises(insitu.BadRequest, match="untyped"):
        table.insert_arrow(rows(1))


def test_a_table_created_from_a_pyarrow_schema(client):
    schema = pa.schema([("k", pa.string()), ("n", pa.int16()), ("x", pa.float32())])
    t = client.create_table(unique("pa"), schema=schema, key=["k"])
    try:
        got = t.schema
        assert got.names == ["k", "n", "x"]
        assert got.field("k").type == pa.string() and not got.field("k").nullable
        assert got.field("n").type == pa.int32() and got.field("n").nullable
        assert got.field("x").type == pa.float64()
        t.insert_arrow(pa.table({"k": ["a", "b"], "n": pa.array([1, None], pa.int16()),
                                 "x": pa.array([0.5, 1.5], pa.float32())}))
        assert client.sql(f"SELECT sum(x) AS s, count(n) AS c FROM {t.name}").to_pylist() == \
            [{"s": 2.0, "c": 1}]
    finally:
        client.drop_table(t.name)


def test_bad_schemas_are_refused_before_anything_is_created(client):
    name = unique("bad")
    with pytest.raises(ValueError, match="primary key"):
        client.create_table(name, schema="a int64")
    with pytest.raises(ValueError, match="schema="):
        client.create_table(name, key="a")
    with pytest.raises(ValueError, match="unknown type"):
        client.create_table(name, schema="a int65", key="a")
    with pytest.raises(ValueError, match="not in the schema"):
        client.create_table(name, schema="a int64", key="b")
    with pytest.raises(TypeError, match="has no insitu column type"):
        client.create_table(name, schema=pa.schema([("a", pa.list_(pa.int64()))]), key="a")
    assert name not in client.tables()


def test_bad_rows_are_refused_with_the_column_and_row_named(client, typed):
    wrong_type = rows(3).set_column(1, "qty", pa.array(["x", "y", "z"]))
    with pytest.raises(insitu.BadRequest, match=r"row 1: .*qty"):
        typed.insert_arrow(wrong_type)
    with pytest.raises(insitu.BadRequest, match="'extra'|\"extra\""):
        typed.insert_arrow(rows(2).append_column("extra", pa.array([1, 2])))
    with pytest.raises(insitu.BadRequest, match="\"qty\", which is NOT NULL"):
        typed.insert_arrow(rows(2).drop_columns(["qty"]))
    # The third step's first row is row 2,001 of the input: a NULL in a NOT NULL column.
    nulls = rows(2_500)
    nulls = nulls.set_column(1, "qty", pa.array(
        [None if i == 2_000 else 1 for i in range(2_500)], pa.int32()))
    with pytest.raises(insitu.BadRequest, match="row 2001"):
        typed.insert_arrow(nulls, batch_rows=1_000)
    # The steps before the refused one stay written.
    assert client.sql(f"SELECT count(*) AS n FROM {typed.name}").to_pylist() == [{"n": 2_000}]
    with pytest.raises(ValueError, match="batch_rows"):
        typed.insert_arrow(rows(1), batch_rows=0)
    with pytest.raises(ValueError, match="batch_rows"):
        typed.insert_arrow(rows(1), batch_rows=1_000_001)
    with pytest.raises(TypeError, match="insert_arrow takes"):
        typed.insert_arrow(42)


def test_bad_sql_raises_sql_error_naming_the_problem(client, typed):
    with pytest.raises(insitu.SqlError, match="syntax"):
        client.sql("SELEC 1")
    with pytest.raises(insitu.SqlError, match="no_such_table"):
        client.sql("SELECT * FROM no_such_table")
    with pytest.raises(insitu.SqlError, match="no_such_column"):
        client.sql(f"SELECT no_such_column FROM {typed.name}")
    with pytest.raises(insitu.SqlError):
        client.sql(f"SELECT comment + 1 FROM {typed.name}")
    # A SqlError is a BadRequest: code that catches those catches it.
    assert issubclass(insitu.SqlError, insitu.BadRequest)
    # The connection is still good.
    assert client.sql("SELECT 1 AS one").to_pylist() == [{"one": 1}]


def test_sql_on_a_stopped_cluster_is_a_connection_error_not_a_hang(own_cluster):
    c = own_cluster.connect(timeout=2.0)
    assert c.sql("SELECT 41 + 1 AS x").to_pylist() == [{"x": 42}]
    own_cluster.kill()
    with pytest.raises((insitu.ConnectionError, insitu.Timeout)):
        run_bounded(lambda: c.sql("SELECT 1"), limit_s=30.0)


def test_aio_sql_and_insert_arrow(cluster):
    async def main():
        c = await aio.connect(cluster.addr, auth_token=cluster.token)
        t = await c.create_table(unique("aio"), schema=SCHEMA_TEXT, key="id")
        try:
            assert await t.insert_arrow(rows(300), batch_rows=64) == 300
            assert (await t.schema()).names[0] == "id"
            got = await c.sql(f"SELECT count(*) AS n FROM {t.name} WHERE rush")
            return got.to_pylist()
        finally:
            await c.drop_table(t.name)

    assert asyncio.run(main()) == [{"n": 100}]


def test_insitu_load_takes_the_parquet_pyarrow_writes(cluster, client, typed, tmp_path):
    """`insitu load TABLE file.parquet` (the CLI's loader, which shares the
    column matching with insert_arrow) loads what pyarrow wrote; the nullable
    "weight" is left out of the file and comes back NULL."""
    pq = pytest.importorskip("pyarrow.parquet")
    data = rows(1_234).drop_columns(["weight"])
    path = tmp_path / "rows.parquet"
    pq.write_table(data, path, row_group_size=500)
    out = subprocess.run(
        [insitu_bin(), "load", typed.name, str(path), "--cluster", cluster.addr],
        env={**os.environ, "INSITU_AUTH_TOKEN": cluster.token},
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "loaded 1234 rows" in out.stdout
    got = client.sql(f"SELECT * FROM {typed.name} ORDER BY id")
    assert got.drop_columns(["weight"]).to_pylist() == data.to_pylist()
    assert got.column("weight").null_count == 1_234
    # A column the table lacks is refused by name, as insert_arrow refuses it.
    path2 = tmp_path / "extra.parquet"
    pq.write_table(rows(2).append_column("extra", pa.array([1, 2])), path2)
    out = subprocess.run(
        [insitu_bin(), "load", typed.name, str(path2), "--cluster", cluster.addr],
        env={**os.environ, "INSITU_AUTH_TOKEN": cluster.token},
        capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert '"extra" that the table does not' in out.stderr


def test_order_by_limit_runs_as_a_top_k_on_the_servers(client, typed):
    data = rows(3_000)
    typed.insert_arrow(data)
    sql = (f"SELECT id, qty, comment FROM {typed.name} WHERE rush "
           f"ORDER BY qty DESC, id LIMIT 10")
    got = client.sql(sql).to_pylist()
    chosen = sorted((r for r in data.to_pylist() if r["rush"]),
                    key=lambda r: (-r["qty"], r["id"]))[:10]
    assert got == [{k: r[k] for k in ("id", "qty", "comment")} for r in chosen]
    plan = "\n".join(client.sql("EXPLAIN " + sql).column("plan").to_pylist())
    assert "top_k_order=[qty DESC NULLS FIRST, id ASC NULLS LAST], limit=10" in plan, plan


def test_a_snapshot_runs_sql_as_of_its_instant_and_read_only_retries_it(own_cluster):
    c = own_cluster.connect()
    t = c.create_table("snapsql", schema=SCHEMA_TEXT, key="id")
    t.insert_arrow(rows(500))
    query = f"SELECT count(*) AS n, sum(qty) AS q FROM {t.name} WHERE rush"
    want = c.sql(query, snapshot=False).to_pylist()
    # A fresh cluster keeps no old versions yet (no snapshot was read): the
    # first snapshot read is refused with the typed error read_only retries.
    early = c.snapshot()
    with pytest.raises(insitu.Unavailable) as e:
        early.sql(query)
    assert e.value.status == "SnapshotTooOld"
    seen = []

    def body(snap):
        seen.append(snap.ts)
        return snap.sql(query).to_pylist()

    assert c.read_only(body) == want
    # Its answer again at the same instant, by timestamp.
    assert c.snapshot(ts=seen[-1]).sql(query).to_pylist() == want
    # SQL errors are still SQL errors at a snapshot.
    with pytest.raises(insitu.SqlError):
        c.snapshot(ts=seen[-1]).sql("SELECT nope FROM snapsql")


def test_sql_reads_one_snapshot_by_default_while_transactions_write(client):
    """A query reads every tablet at one instant by default: while a thread
    writes pairs of rows that sum to zero in transactions (row 2j to i, row
    2j+1 to -i), every sum is 0. snapshot=False reads the rows as they are
    (a sum there may see half of a commit, so it is not checked)."""
    name = unique("pairs")
    t = client.create_table(name, tablets=4, schema="id int64, bal int64", key="id")
    try:
        pairs = 8
        t.insert_arrow(pa.table({"id": pa.array(range(2 * pairs), pa.int64()),
                                 "bal": pa.array([0] * (2 * pairs), pa.int64())}))
        query = f"SELECT sum(bal) AS s, count(*) AS n FROM {name}"
        want = [{"s": 0, "n": 2 * pairs}]
        stop = threading.Event()
        errors = []

        def writer():
            i = 1
            try:
                while not stop.is_set():
                    j = i % pairs
                    with client.transaction() as tx:
                        tx.insert(t, {"id": 2 * j, "bal": i})
                        tx.insert(t, {"id": 2 * j + 1, "bal": -i})
                    i += 1
            except Exception as e:  # reported below, not lost in the thread
                errors.append(e)

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            answers = [client.sql(query).to_pylist() for _ in range(40)]
        finally:
            stop.set()
            thread.join()
        assert not errors, errors
        assert all(a == want for a in answers), [a for a in answers if a != want]
        assert client.sql(query, snapshot=True).to_pylist() == want
        assert client.sql(query, snapshot=False).to_pylist()[0]["n"] == 2 * pairs
    finally:
        client.drop_table(name)
