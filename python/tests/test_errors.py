"""Errors: each becomes its insitu exception, and a dead or frozen cluster
fails within the client's timeout instead of hanging."""

import threading
import time

import pytest

import insitu
from conftest import Cluster, free_port, run_bounded


def test_hierarchy():
    for cls in (insitu.NotFound, insitu.UnknownTable, insitu.Conflict, insitu.Timeout,
                insitu.ConnectionError, insitu.Unavailable, insitu.OutOfMemory,
                insitu.TooLarge, insitu.BadRequest, insitu.DataLost):
        assert issubclass(cls, insitu.Error)
    assert issubclass(insitu.TableExists, insitu.Conflict)
    assert issubclass(insitu.Error, Exception)
    assert insitu.Error("by hand").status is None
    # Retrying does not bring lost objects back: not an Unavailable.
    assert not issubclass(insitu.DataLost, insitu.Unavailable)


def test_unknown_table(client):
    with pytest.raises(insitu.UnknownTable) as e:
        client.table("no_such_table")
    assert e.value.status == "UnknownTable"
    assert "no_such_table" in str(e.value) or "UnknownTable" in str(e.value)
    with pytest.raises(insitu.UnknownTable):
        client.drop_table("no_such_table")
    with pytest.raises(insitu.UnknownTable):
        client.accept_loss("no_such_table")


def test_dropped_table(client):
    t = client.create_table("py_dropped", tablets=2)
    t.put(b"k", b"v")
    client.drop_table("py_dropped")
    for call in (lambda: t.get(b"k"), lambda: t.put(b"k", b"v"), lambda: t.count(),
                 lambda: t.get_many([b"k"]), lambda: t.aggregate("sum", "i64@0"),
                 lambda: list(t.scan())):
        with pytest.raises(insitu.UnknownTable):
            call()


def test_table_exists(client, table):
    with pytest.raises(insitu.TableExists) as e:
        client.create_table(table.name)
    assert isinstance(e.value, insitu.Conflict)
    assert e.value.status == "TableExists"


def test_bad_requests(table):
    with pytest.raises(insitu.BadRequest):
        table.put(b"", b"v")
    with pytest.raises(insitu.TooLarge):
        table.put(b"k", bytes((1 << 20) + 1))  # values are at most 1 MiB
    with pytest.raises(insitu.TooLarge):
        table.put(bytes(70_000), b"v")
    # a refused write changed nothing
    assert table.get(b"k") is None


def test_connect_errors():
    port = free_port()  # nothing listens there
    with pytest.raises(insitu.ConnectionError):
        run_bounded(lambda: insitu.connect(f"127.0.0.1:{port}", timeout=1.0))
    with pytest.raises(insitu.Error):
        run_bounded(lambda: insitu.connect("not an address", timeout=1.0))
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            insitu.connect("127.0.0.1:1", timeout=bad)


def test_server_down_fails_within_timeout(own_cluster):
    c = own_cluster.connect(timeout=1.0)
    t = c.create_table("down", tablets=2)
    t.put(b"k", b"v")
    own_cluster.kill()
    for call in (lambda: t.get(b"k"), lambda: t.put(b"k", b"w"), lambda: t.count(),
                 lambda: c.tables(), lambda: t.get_many([b"k", b"j"])):
        with pytest.raises((insitu.ConnectionError, insitu.Timeout)):
            run_bounded(call)


def test_frozen_cluster_times_out(own_cluster):
    c = own_cluster.connect(timeout=0.5)
    t = c.create_table("frozen", tablets=1)
    t.put(b"k", b"v")
    own_cluster.pause()
    try:
        with pytest.raises(insitu.Timeout) as e:
            run_bounded(lambda: t.get(b"k"))
        assert e.value.status is None
    finally:
        own_cluster.resume()
    assert t.get(b"k") == b"v"


def test_calls_release_the_gil(own_cluster):
    """A call blocked on a frozen cluster lets other threads run: the main
    thread resumes the cluster while the call waits, and the call succeeds.
    (Holding the GIL, the main thread could only resume it after the call's
    60 s timeout, and the call would raise Timeout.)"""
    c = own_cluster.connect(timeout=60.0)
    t = c.create_table("gil", tablets=1)
    t.put(b"k", b"v")
    own_cluster.pause()
    started = threading.Event()
    out = {}

    def reader():
        started.set()
        try:
            out["value"] = t.get(b"k")
        except insitu.Error as e:
            out["error"] = e

    th = threading.Thread(target=reader)
    th.start()
    started.wait(10)
    time.sleep(0.3)  # let the reader enter the call (if not, the test still passes)
    own_cluster.resume()
    th.join(120)
    assert not th.is_alive()
    assert out == {"value": b"v"}


def test_lost_objects_raise_data_lost_until_acknowledged():
    """With --replicas 0 a crash loses the objects, never silently: a read of
    a key that may have existed raises DataLost until an operator runs
    `insitu table ack-loss`, and a key written again gets a higher version."""
    c = Cluster(servers=1, memory_mb=64, extra=("--replicas", "0"))
    try:
        t = c.connect(timeout=20.0).create_table("cache", tablets=2)
        old = t.put(b"k", b"v")
        for _ in range(20):
            old = t.put(b"k", b"v")
        c.restart()
        t = c.connect(timeout=20.0).table("cache")
        with pytest.raises(insitu.DataLost) as e:
            t.get(b"k")
        assert e.value.status == "DataLost"
        assert "may have existed" in str(e.value)
        assert t.put(b"k", b"again") > old
        assert t.get(b"k") == b"again"
        # Acknowledged from Python; the operator's command then finds nothing left.
        assert c.connect(timeout=20.0).ack_loss("cache") == 2
        # No tablet waits for a refused recovery: nothing to give up.
        assert c.connect(timeout=20.0).accept_loss("cache") == 0
        assert t.get(b"never") is None
        out = c.cli("table", "ack-loss", "cache")
        assert out.returncode == 0, out.stderr
        assert "has no lost objects" in out.stdout
    finally:
        c.stop()
