"""Transactions from Python against a real cluster: all or nothing, conflicts
raise Conflict, `run_transaction` retries until it commits (no lost update
under threads), a used transaction cannot be used again, and rows of typed
tables written by `insert`."""

import datetime
import decimal
import threading
import uuid

import pytest

import insitu
from conftest import assert_runner_passes_through


def as_int(v):
    return 0 if v is None else int(v)


def test_with_block_commits_and_reads_own_writes(client, table):
    table.put("alice", "100")
    with client.transaction() as tx:
        a = as_int(tx.get(table, "alice"))
        tx.put(table, "alice", str(a - 30))
        tx.put(table, "bob", "30")
        assert tx.get(table, "alice") == b"70", "reads see the transaction's writes"
        assert tx.get_many(table, ["alice", "bob", "carol"]) == [b"70", b"30", None]
        assert table.get("bob") is None, "nothing applied before the commit"
    assert table.get("alice") == b"70"
    assert table.get("bob") == b"30"


def test_an_exception_discards_everything(client, table):
    with pytest.raises(ZeroDivisionError):
        with client.transaction() as tx:
            tx.put(table, "x", "written")
            tx.delete(table, "y")
            1 / 0
    assert table.get("x") is None


def test_a_conflict_raises_and_applies_nothing(client, table):
    table.put("k", "1")
    tx = client.transaction()
    assert tx.get(table, "k") == b"1"
    tx.put(table, "other", "by the transaction")
    table.put("k", "2")  # someone else changes what it read
    with pytest.raises(insitu.Conflict) as e:
        tx.commit()
    assert e.value.status == "Conflict"
    assert table.get("other") is None
    with pytest.raises(RuntimeError):
        tx.commit()  # it has ended
    with pytest.raises(RuntimeError):
        tx.get(table, "k")


def test_run_transaction_retries_so_no_update_is_lost(client, table):
    def increment(tx):
        n = as_int(tx.get(table, "counter"))
        tx.put(table, "counter", str(n + 1))
        return n + 1

    def worker():
        for _ in range(25):
            client.run_transaction(increment)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert table.get("counter") == b"100"


def test_run_transaction_returns_and_other_errors_pass_through(client, table):
    assert_runner_passes_through(
        client.run_transaction, table, lambda tx: tx.put(table, 5, "v")
    )


def test_a_transaction_gives_deadlines(client, table):
    import time

    with client.transaction() as tx:
        tx.put(table, b"session", b"s", ttl=3600)
        tx.put(table, b"plain", b"p")
    assert 3590 < table.expires_at(b"session") - time.time() <= 3600
    assert table.expires_at(b"plain") is None
    with pytest.raises(ValueError):
        with client.transaction() as tx:
            tx.put(table, b"bad", b"v", ttl=-1)
    assert table.get(b"bad") is None


# A typed table's columns for `insert`: every kind of value a row may hold.
ROW_SCHEMA = ("id int64, qty int32, price decimal(15,2), shipped date32, "
              "note utf8 null, rush bool")


@pytest.fixture
def typed(client):
    """A fresh typed table of ROW_SCHEMA keyed by id, dropped after the test."""
    name = "txrows_" + uuid.uuid4().hex[:10]
    t = client.create_table(name, tablets=4, schema=ROW_SCHEMA, key="id")
    yield t
    client.drop_table(name)


def rows_of(client, table):
    return client.sql(f"SELECT * FROM {table.name} ORDER BY id").to_pylist()


def test_insert_writes_typed_rows_at_the_commit(client, typed):
    first = {"id": 1, "qty": 3, "price": decimal.Decimal("12.50"),
             "shipped": datetime.date(2024, 2, 29), "note": "first", "rush": True}
    # Columns in any order; the nullable note left out is NULL; a str date
    # and an int price convert as insert_arrow converts them.
    second = {"rush": False, "shipped": "1999-12-31", "price": 7, "qty": -2, "id": 2}
    with client.transaction() as tx:
        tx.insert(typed, first)
        tx.insert(typed, second)
        assert rows_of(client, typed) == [], "nothing applied before the commit"
    assert rows_of(client, typed) == [
        first,
        {"id": 2, "qty": -2, "price": decimal.Decimal("7.00"),
         "shipped": datetime.date(1999, 12, 31), "note": None, "rush": False},
    ]


def test_an_insert_in_a_discarded_transaction_is_not_visible(client, typed):
    row = {"id": 5, "qty": 1, "price": 1.25, "shipped": datetime.date(2020, 1, 1),
           "rush": True}
    tx = client.transaction()
    tx.insert(typed, row)
    tx.discard()
    with pytest.raises(ZeroDivisionError):
        with client.transaction() as tx:
            tx.insert(typed, row)
            1 / 0
    assert rows_of(client, typed) == []


def test_insert_refuses_rows_that_do_not_fit_naming_the_column(client, typed, table):
    good = {"id": 9, "qty": 1, "price": 2, "shipped": datetime.date(2020, 1, 1),
            "rush": False}
    tx = client.transaction()
    missing = {k: v for k, v in good.items() if k != "qty"}
    with pytest.raises(insitu.BadRequest, match='"qty".*NOT NULL') as e:
        tx.insert(typed, missing)
    assert e.value.status == "BadRequest"
    with pytest.raises(insitu.BadRequest, match='"colour"'):
        tx.insert(typed, {**good, "colour": "red"})
    with pytest.raises(insitu.BadRequest, match='"qty".*int32'):
        tx.insert(typed, {**good, "qty": "many"})
    with pytest.raises(insitu.BadRequest, match='"qty".*range'):
        tx.insert(typed, {**good, "qty": 2**40})
    with pytest.raises(insitu.BadRequest, match='"price".*digits'):
        tx.insert(typed, {**good, "price": decimal.Decimal("0.125")})
    with pytest.raises(insitu.BadRequest, match='"rush".*NOT NULL'):
        tx.insert(typed, {**good, "rush": None})
    with pytest.raises(TypeError, match='"note".*bytes'):
        tx.insert(typed, {**good, "note": b"raw"})
    with pytest.raises(TypeError, match='"shipped".*datetime'):
        tx.insert(typed, {**good, "shipped": datetime.datetime(2020, 1, 1, 12)})
    with pytest.raises(TypeError, match="dict"):
        tx.insert(typed, [9, 1])
    with pytest.raises(insitu.BadRequest, match="untyped"):
        tx.insert(table, good)
    # The refusals queued nothing: the commit writes the good row only.
    tx.insert(typed, good)
    tx.commit()
    assert [r["id"] for r in rows_of(client, typed)] == [9]
