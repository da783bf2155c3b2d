"""count, aggregate, update and train_logreg: computed on the servers and
checked against the same computation in Python / NumPy."""

import struct

import numpy as np
import pytest

import insitu


def rows(n: int):
    """(key, value) with an i64 at byte 0, an f64 at byte 8 and a u8 at byte 16."""
    for i in range(n):
        yield f"r{i:05d}".encode(), struct.pack("<qdB", i - 50, i * 0.5, i % 3)


@pytest.fixture
def numbers(table):
    table.put_many(rows(200))
    return table


def test_count(numbers):
    assert numbers.count() == 200
    assert numbers.count("i64@0 >= 0") == 150
    assert numbers.count(where="u8@16 = 0 and i64@0 < 0") == sum(
        1 for i in range(200) if i % 3 == 0 and i < 50)
    assert numbers.count("not (f64@8 between 10 and 20)") == 200 - 21
    assert numbers.count(from_key="r00100") == 100
    assert numbers.count(from_key=b"r00100", to_key="r00110") == 10


def test_aggregate(numbers):
    ints = [i - 50 for i in range(200)]
    floats = [i * 0.5 for i in range(200)]
    assert numbers.aggregate("sum", "i64@0") == sum(ints)
    assert isinstance(numbers.aggregate("sum", "i64@0"), int)
    assert numbers.aggregate("min", "i64@0") == -50
    assert numbers.aggregate("max", "i64@0") == 149
    assert numbers.aggregate("count", "i64@0") == 200
    assert numbers.aggregate("avg", "i64@0") == pytest.approx(sum(ints) / 200)
    assert numbers.aggregate("sum", "f64@8") == pytest.approx(sum(floats))
    assert numbers.aggregate("MAX", "f64@8") == 99.5
    assert numbers.aggregate("sum", "i64@0", "u8@16 = 1") == sum(
        i - 50 for i in range(200) if i % 3 == 1)
    # nothing matches: avg/min/max are None, sum and count 0
    assert numbers.aggregate("avg", "i64@0", "i64@0 > 1000") is None
    assert numbers.aggregate("min", "i64@0", "i64@0 > 1000") is None
    assert numbers.aggregate("sum", "i64@0", "i64@0 > 1000") == 0


def test_aggregate_exact_beyond_i64(table):
    big = 2**62
    table.put_many((f"b{i}", struct.pack("<q", big)) for i in range(8))
    assert table.aggregate("sum", "i64@0") == 8 * big  # > 2**63: exact, not wrapped


def test_update(numbers):
    assert numbers.update("i64@0", add=1000, where="u8@16 = 2") == sum(
        1 for i in range(200) if i % 3 == 2)
    assert numbers.count("i64@0 >= 950") == sum(1 for i in range(200) if i % 3 == 2)
    # the rows raised by 1000 are no longer negative
    assert numbers.update("f64@8", set=-1.5, where="i64@0 < 0") == sum(
        1 for i in range(50) if i % 3 != 2)
    assert numbers.aggregate("min", "f64@8") == -1.5
    assert numbers.update("u8@16", set=7) == 200
    assert numbers.count("u8@16 = 7") == 200
    v = numbers.get("r00000")
    assert struct.unpack("<qdB", v) == (-50, -1.5, 7)


def test_delete_where(numbers):
    with pytest.raises(ValueError, match="all=True"):
        numbers.delete_where()
    assert numbers.count() == 200
    assert numbers.delete_where("u8@16 = 1") == sum(1 for i in range(200) if i % 3 == 1)
    assert numbers.count("u8@16 = 1") == 0
    assert numbers.delete_where(from_key="r00100", to_key="r00110") == sum(
        1 for i in range(100, 110) if i % 3 != 1)
    assert numbers.get("r00102") is None
    left = numbers.count()
    assert numbers.delete_where(all=True) == left
    assert numbers.count() == 0


def test_bad_specs_are_value_errors(numbers):
    with pytest.raises(ValueError, match="column 9"):
        numbers.count("i64@0 > ")
    with pytest.raises(ValueError, match="unknown type"):
        numbers.aggregate("sum", "i65@0")
    with pytest.raises(ValueError, match="unknown aggregate"):
        numbers.aggregate("median", "i64@0")
    with pytest.raises(ValueError, match="exactly one"):
        numbers.update("i64@0")
    with pytest.raises(ValueError, match="exactly one"):
        numbers.update("i64@0", add=1, set=2)
    with pytest.raises(ValueError, match="bad update"):
        numbers.update("u8@16", set=300)
    with pytest.raises(ValueError, match="out of range"):
        numbers.update("i64@0", add=2**70)
    with pytest.raises(ValueError, match="finite"):
        numbers.update("f64@8", set=float("inf"))
    with pytest.raises(TypeError):
        numbers.update("i64@0", add="1")
    # nothing was changed by any of the refused updates
    assert numbers.count("u8@16 = 0") == sum(1 for i in range(200) if i % 3 == 0)


def logreg_reference(x: np.ndarray, y: np.ndarray, iterations: int, rate: float):
    """The same batch gradient descent as the servers' (mean gradient, from zero)."""
    w = np.zeros(x.shape[1])
    b = 0.0
    n = len(y)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
        w -= rate * (x.T @ (p - y)) / n
        b -= rate * float(np.sum(p - y)) / n
    return w, b


def make_points(n: int, dims: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dims)).astype(np.float32)
    true_w = np.linspace(-2, 2, dims)
    y = (x @ true_w + 0.3 * rng.normal(size=n) > 0).astype(np.uint8)
    return x, y


def test_train_logreg_matches_numpy(client, table):
    dims = 5
    x, y = make_points(2000, dims)
    table.put_many((f"p{i}", x[i].astype("<f4").tobytes() + bytes([y[i]])) for i in range(len(y)))
    w = client.train_logreg(table.name, dims=dims, iterations=20, rate=0.5)
    assert isinstance(w, np.ndarray) and w.dtype == np.float32 and w.shape == (dims,)
    ref_w, ref_b = logreg_reference(x.astype(np.float64), y.astype(np.float64), 20, 0.5)
    np.testing.assert_allclose(w, ref_w, rtol=1e-3, atol=1e-4)

    m = client.train_logreg_model(table, dims=dims, iterations=20, rate=0.5)
    np.testing.assert_array_equal(m.weights, w)
    assert m.bias == pytest.approx(ref_b, rel=1e-3, abs=1e-4)
    assert m.losses.shape == (20,) and m.losses.dtype == np.float64
    assert m.losses[-1] < m.losses[0]
    assert "TrainedModel(dims=5" in repr(m)


def test_train_logreg_offsets(client, table):
    dims = 3
    x, y = make_points(300, dims, seed=3)
    # 4 bytes of header, the label first, then the vector
    table.put_many((f"q{i}", b"HEAD" + bytes([y[i]]) + x[i].astype("<f4").tobytes())
                   for i in range(len(y)))
    w = client.train_logreg(table, dims, 5, 0.5, offset=5, label_offset=4)
    ref_w, _ = logreg_reference(x.astype(np.float64), y.astype(np.float64), 5, 0.5)
    np.testing.assert_allclose(w, ref_w, rtol=1e-3, atol=1e-4)


def test_train_logreg_errors(client, table):
    with pytest.raises(ValueError, match="dims"):
        client.train_logreg(table, dims=0)
    with pytest.raises(ValueError, match="rate"):
        client.train_logreg(table, dims=2, rate=-1.0)
    with pytest.raises(insitu.UnknownTable):
        client.train_logreg("no_such_table_here", dims=2)
    with pytest.raises(TypeError):
        client.train_logreg(42, dims=2)
    # an empty table trains nothing: zero weights
    w = client.train_logreg(table, dims=2)
    assert w.tolist() == [0.0, 0.0]


def test_json_paths(table):
    docs = {"a": {"age": 31, "name": "ann"}, "b": {"age": 40.5, "name": "bob"},
            "c": {"name": "cy"}, "d": {"age": 2**62}}
    import json
    table.put_many((k, json.dumps(v)) for k, v in docs.items())
    table.put("junk", b"\x00not json")
    assert table.aggregate("sum", "$.age", "$.age < 1000") == 71.5
    assert table.aggregate("count", "$.age") == 3
    assert table.aggregate("sum", "$.age", "$.name = 'ann'") == 31
    assert isinstance(table.aggregate("sum", "$.age", "$.age < 35"), int)
    assert table.aggregate("max", "$.age") == 2**62
    assert table.count("$.name = 'bob' or $.age > 35") == 2
    assert table.count("not $.age > 35") == 1  # cy and junk have no age: unknown
    with pytest.raises(ValueError, match="JSON path"):
        table.aggregate("sum", "$.")
