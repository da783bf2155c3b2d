"""Point operations, multi-operations and scans against a real cluster."""

import threading

import pytest


def test_put_get_delete(table):
    v1 = table.put(b"k", b"v1")
    v2 = table.put(b"k", b"v2")
    assert isinstance(v1, int) and v2 > v1
    assert table.get(b"k") == b"v2"
    assert table.delete(b"k") is True
    assert table.get(b"k") is None
    assert table.delete(b"k") is False


def test_str_is_utf8(table):
    table.put("naïve-ключ-🔑", "värde ✓")
    assert table.get("naïve-ключ-🔑".encode()) == "värde ✓".encode()
    assert table.get("naïve-ключ-🔑") == "värde ✓".encode()


def test_binary_and_empty_values(table):
    blob = bytes(range(256)) * 4
    table.put(b"\x00\xff", blob)
    assert table.get(b"\x00\xff") == blob
    table.put(b"empty", b"")
    assert table.get(b"empty") == b""


def test_large_value_1mib(table):
    big = bytes((i * 7) % 251 for i in range(1 << 20))
    table.put(b"big", big)
    assert table.get(b"big") == big
    assert table.get_many([b"big", b"nope"]) == [big, None]


def test_get_many_put_many(table):
    n = table.put_many({f"k{i}": f"v{i}" for i in range(1000)})
    assert n == 1000
    assert table.put_many([(b"a", b"1"), (b"b", b"2")]) == 2
    assert table.put_many((("c", "3"),)) == 1
    assert table.put_many([]) == 0
    got = table.get_many(["a", b"b", "c", "missing"] + [f"k{i}" for i in range(1000)])
    assert got[:4] == [b"1", b"2", b"3", None]
    assert got[4:] == [f"v{i}".encode() for i in range(1000)]
    assert table.get_many([]) == []
    # any iterable, including a generator
    assert table.get_many(f"k{i}" for i in range(3)) == [b"v0", b"v1", b"v2"]


def test_get_many_100k_keys(table):
    keys = [f"key-{i:06d}".encode() for i in range(100_000)]
    table.put_many((k, k[::-1]) for k in keys)
    got = table.get_many(keys)
    assert len(got) == 100_000
    assert all(g == k[::-1] for g, k in zip(got, keys))
    assert table.count() == 100_000


def test_scan_yields_everything_in_batches(table):
    data = {f"s{i}".encode(): bytes([i % 256]) * 2000 for i in range(2000)}
    table.put_many(data)
    seen = dict(table.scan())
    assert seen == data
    batches = list(table.scan(batched=True))
    # about 1 MiB per batch: 2000 * ~2 KB spans several batches
    assert len(batches) > 1
    assert all(isinstance(b, list) and b for b in batches)
    assert {k: v for b in batches for k, v in b} == data


def test_scan_empty_table(table):
    assert list(table.scan()) == []
    assert list(table.scan(batched=True)) == []


def test_tables_create_drop(client):
    t = client.create_table("py_tables_test", tablets=2)
    assert t.name == "py_tables_test" and isinstance(t.id, int)
    assert "py_tables_test" in client.tables()
    assert client.table("py_tables_test").id == t.id
    client.drop_table("py_tables_test")
    assert "py_tables_test" not in client.tables()
    assert repr(t) == f'insitu.Table("py_tables_test", id={t.id})'


def test_threads_share_one_client(table):
    errors = []

    def worker(w: int) -> None:
        try:
            for i in range(200):
                table.put(f"w{w}-{i}", str(i))
                assert table.get(f"w{w}-{i}") == str(i).encode()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
    assert table.count() == 800


def test_wrong_types(table):
    with pytest.raises(TypeError, match="key must be bytes or str"):
        table.put(1, b"x")
    with pytest.raises(TypeError, match="value must be bytes or str"):
        table.put(b"k", 1.5)
    with pytest.raises(TypeError):
        table.get_many(5)
    with pytest.raises(TypeError, match="pair"):
        table.put_many([b"not-a-pair"])
    with pytest.raises(TypeError, match="key must be bytes or str"):
        table.get_many([b"ok", None])


def test_put_with_a_deadline(table):
    import time

    table.put(b"forever", b"v")
    table.put(b"soon", b"v", ttl=0.4)
    at = time.time() + 3600
    table.put(b"later", b"v", expires_at=at)
    assert table.get(b"soon") == b"v"
    assert table.expires_at(b"forever") is None
    assert table.expires_at(b"nope") is None
    assert abs(table.expires_at(b"later") - at) < 0.002
    # The deadline is rounded up to the next millisecond (never early), so
    # read back right away it may lie up to 1 ms past put time + 0.4 s.
    assert 0 < table.expires_at(b"soon") - time.time() <= 0.401
    assert table.count() == 3
    time.sleep(0.6)
    # Gone at once for reads and server-side counts; the server removes it.
    assert table.get(b"soon") is None
    assert table.expires_at(b"soon") is None
    assert table.count() == 2
    assert sorted(k for k, _ in table.scan()) == [b"forever", b"later"]
    # A plain put replaces the deadline.
    table.put(b"later", b"w")
    assert table.expires_at(b"later") is None
    for bad in ({"ttl": 0}, {"ttl": -1.0}, {"ttl": float("nan")}, {"expires_at": -5},
                {"ttl": 1, "expires_at": at}, {"expires_at": 1e30}):
        with pytest.raises(ValueError):
            table.put(b"x", b"v", **bad)
    assert table.get(b"x") is None
