"""Authentication against a real `insitu up` (which requires it by default):
no token, a wrong token and a malformed one are refused with
AuthenticationError; the token works given directly or from the
environment (INSITU_AUTH_TOKEN, INSITU_AUTH_TOKEN_FILE)."""

import os

import pytest

import insitu


def test_missing_token_is_refused(cluster, monkeypatch):
    monkeypatch.delenv("INSITU_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("INSITU_AUTH_TOKEN_FILE", raising=False)
    with pytest.raises(insitu.AuthenticationError) as e:
        insitu.connect(cluster.addr, timeout=5.0)
    assert e.value.status == "Unauthenticated"
    assert "INSITU_AUTH_TOKEN" in str(e.value)


def test_wrong_token_is_refused(cluster):
    with pytest.raises(insitu.AuthenticationError) as e:
        insitu.connect(cluster.addr, timeout=5.0, auth_token="not-the-cluster-token-123")
    assert "not this cluster's" in str(e.value)


def test_malformed_token_is_a_value_error(cluster):
    with pytest.raises(ValueError):
        insitu.connect(cluster.addr, auth_token="short")


def test_token_from_the_environment(cluster, monkeypatch):
    monkeypatch.delenv("INSITU_AUTH_TOKEN_FILE", raising=False)
    monkeypatch.setenv("INSITU_AUTH_TOKEN", cluster.token)
    c = insitu.connect(cluster.addr)
    t = c.create_table("auth_env", tablets=2)
    t.put("k", b"v")
    assert t.get("k") == b"v"
    c.drop_table("auth_env")

    monkeypatch.delenv("INSITU_AUTH_TOKEN")
    monkeypatch.setenv("INSITU_AUTH_TOKEN_FILE", os.path.join(cluster.dir.name, "auth-token"))
    c = insitu.connect(cluster.addr)
    assert "auth_env" not in c.tables()


def test_the_exception_is_exported():
    assert issubclass(insitu.AuthenticationError, insitu.Error)
    assert "AuthenticationError" in insitu.__all__
