"""TLS against a real `insitu up --tls`: the client verifies the servers
with the cluster's CA (given as ``tls_ca`` or by INSITU_TLS_CA) and then
works as usual; without TLS, or trusting another CA, it is refused."""

import os
import subprocess

import pytest

import insitu
from conftest import Cluster, insitu_bin


@pytest.fixture(scope="module")
def tls_cluster():
    c = Cluster(servers=2, memory_mb=64, extra=("--tls",))
    yield c
    c.stop()


def ca_of(cluster: Cluster) -> str:
    return os.path.join(cluster.dir.name, "tls", "ca.pem")


def test_tls_client_reads_and_writes(tls_cluster):
    c = tls_cluster.connect(tls_ca=ca_of(tls_cluster))
    t = c.create_table("tls_rw", tablets=4)
    for i in range(50):
        t.put(f"k{i}", f"v{i}".encode())
    assert all(t.get(f"k{i}") == f"v{i}".encode() for i in range(50))
    assert t.count() == 50
    c.drop_table("tls_rw")


def test_ca_from_the_environment(tls_cluster, monkeypatch):
    monkeypatch.setenv("INSITU_TLS_CA", ca_of(tls_cluster))
    c = tls_cluster.connect()
    assert isinstance(c.tables(), list)


def test_plain_client_is_refused(tls_cluster, monkeypatch):
    monkeypatch.delenv("INSITU_TLS_CA", raising=False)
    with pytest.raises(insitu.ConnectionError):
        tls_cluster.connect(timeout=5.0)


def test_another_ca_is_refused(tls_cluster, tmp_path):
    other = tmp_path / "other"
    subprocess.run(
        [insitu_bin(), "tls", "init", str(other), "--host", "127.0.0.1"],
        check=True, capture_output=True,
    )
    with pytest.raises(insitu.ConnectionError) as e:
        tls_cluster.connect(timeout=5.0, tls_ca=str(other / "ca.pem"))
    assert "certificate" in str(e.value)


def test_unreadable_ca_is_a_value_error(tls_cluster, tmp_path):
    with pytest.raises(ValueError) as e:
        tls_cluster.connect(tls_ca=str(tmp_path / "missing.pem"))
    assert "missing.pem" in str(e.value)
