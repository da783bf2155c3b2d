"""redis-py, unchanged, against insitu's Redis protocol port (`--resp-port`):
plain commands, pipelines, MULTI/EXEC with WATCH (redis-py's `transaction`
helper), RESP3, SCAN, AUTH with the cluster's token, and the same objects
read back through insitu's own client."""

import threading

import pytest
import redis

from conftest import Cluster, free_port


@pytest.fixture(scope="module")
def resp_cluster():
    port = free_port()
    c = Cluster(extra=("--resp-port", str(port)))
    c.resp_port = port
    yield c
    c.stop()


def redis_client(c, **kwargs) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=c.resp_port, password=c.token, **kwargs)


def test_plain_commands_and_errors(resp_cluster):
    r = redis_client(resp_cluster)
    assert r.ping()
    assert r.set("greeting", "hello")
    assert r.get("greeting") == b"hello"
    assert r.set("greeting", "again", nx=True) is None
    assert r.incrby("counter", 5) == 5
    assert r.incrbyfloat("float", 1.5) == 1.5
    assert r.mset({"a": "1", "b": "2"})
    assert r.mget("a", "b", "missing") == [b"1", b"2", None]
    assert r.append("greeting", "!") == 6
    assert r.getrange("greeting", 0, 1) == b"he"
    assert r.exists("a", "b", "missing") == 2
    assert r.delete("a", "missing") == 1
    assert r.ttl("b") == -1
    with pytest.raises(redis.ResponseError, match="value is not an integer"):
        r.incr("greeting")
    with pytest.raises(redis.ResponseError, match="unknown command"):
        r.execute_command("NO-SUCH-COMMAND")


def test_wrong_password_is_refused(resp_cluster):
    bad = redis.Redis(host="127.0.0.1", port=resp_cluster.resp_port, password="wrong")
    with pytest.raises(redis.AuthenticationError):
        bad.ping()
    anonymous = redis.Redis(host="127.0.0.1", port=resp_cluster.resp_port)
    with pytest.raises(redis.AuthenticationError):
        anonymous.get("greeting")


def test_pipelines_and_transactions(resp_cluster):
    r = redis_client(resp_cluster)
    # redis-py's default pipeline is MULTI ... EXEC.
    pipe = r.pipeline()
    for i in range(200):
        pipe.set(f"p:{i}", i)
    pipe.incr("p:count")
    results = pipe.execute()
    assert results[:200] == [True] * 200 and results[200] == 1
    assert r.get("p:199") == b"199"

    # WATCH-based increments from threads (redis-py's `transaction` helper
    # retries on WatchError): no update is lost.
    def bump(pipe):
        n = int(pipe.get("watched") or 0)
        pipe.multi()
        pipe.set("watched", n + 1)

    def worker():
        client = redis_client(resp_cluster)
        for _ in range(10):
            client.transaction(bump, "watched")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert r.get("watched") == b"40"


def test_resp3_and_scan(resp_cluster):
    r = redis_client(resp_cluster, protocol=3)
    assert r.set("r3", "x")
    assert r.get("r3") == b"x"
    assert r.get("r3-missing") is None
    for i in range(120):
        r.set(f"scan:{i}", i)
    keys = set(r.scan_iter(match="scan:*", count=25))
    assert len(keys) == 120


def test_the_same_objects_through_insitu(resp_cluster):
    r = redis_client(resp_cluster)
    r.set("shared", "seen by both")
    client = resp_cluster.connect()
    table = client.table("redis")
    assert table.get("shared") == b"seen by both"
    assert table.count() == r.dbsize()


def test_expiry(resp_cluster):
    import time

    r = redis_client(resp_cluster)
    assert r.set("session", "abc", ex=100)
    assert r.ttl("session") == 100
    assert r.expire("session", 200, gt=True)
    assert r.ttl("session") == 200
    assert r.persist("session")
    assert r.ttl("session") == -1
    assert r.set("brief", "x", px=300)
    assert r.incr("counted") == 1 and r.expire("counted", 100)
    assert r.incr("counted") == 2
    assert r.ttl("counted") == 100  # INCR keeps a TTL, as in Redis
    assert r.getex("counted", persist=True) == b"2"
    assert r.ttl("counted") == -1
    time.sleep(0.5)
    assert r.get("brief") is None
    assert r.exists("brief") == 0
    assert r.ttl("brief") == -2
    with r.pipeline(transaction=True) as p:
        p.set("in_multi", "v", ex=100)
        p.ttl("in_multi")
        assert p.execute() == [True, 100]
    with pytest.raises(redis.ResponseError, match="invalid expire time"):
        r.set("bad", "v", ex=0)


def test_cluster_client(resp_cluster):
    from redis.cluster import RedisCluster

    rc = RedisCluster(host="127.0.0.1", port=resp_cluster.resp_port,
                      password=resp_cluster.token)
    try:
        # Every server is a node, the first on the port given; the slots
        # are spread over both.
        nodes = rc.get_nodes()
        assert len(nodes) == 2, nodes
        assert ("127.0.0.1", resp_cluster.resp_port) in [(n.host, n.port) for n in nodes]
        owners = {rc.nodes_manager.get_node_from_slot(s).port for s in range(0, 16384, 512)}
        assert len(owners) == 2, owners
        assert rc.keyslot("foo") == 12182
        for i in range(200):
            assert rc.set(f"cluster-{i}", i)
        assert rc.get("cluster-7") == b"7"
        assert rc.mget_nonatomic([f"cluster-{i}" for i in range(0, 200, 50)]) == [
            b"0", b"50", b"100", b"150"]
        assert rc.incr("{c}.n") == 1 and rc.incr("{c}.n") == 2
        assert rc.delete("cluster-0") == 1
        assert rc.exists("cluster-0") == 0
        # A plain client on one port reads what the cluster client wrote
        # on both servers.
        assert redis_client(resp_cluster).mget("cluster-7", "cluster-150") == [b"7", b"150"]
    finally:
        rc.close()
