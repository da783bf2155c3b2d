"""Transactions from Python against a real cluster: all or nothing, conflicts
raise Conflict, `run_transaction` retries until it commits (no lost update
under threads), and a used transaction cannot be used again."""

import threading

import pytest

import insitu


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
    assert client.run_transaction(lambda tx: tx.get(table, "nothing")) is None

    def bad(tx):
        raise ValueError("from the body")

    with pytest.raises(ValueError, match="from the body"):
        client.run_transaction(bad)
    with pytest.raises(TypeError):
        client.run_transaction(lambda tx: tx.put(table, 5, "v"))


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
