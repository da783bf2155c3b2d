"""Fixtures: a real insitu cluster (`insitu up`) on a free loopback port.

The binary is `target/debug/insitu` of the repository (built with
`cargo build -p insitu` when missing), or the one the INSITU_BIN environment
variable names.
"""

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

import insitu

REPO = Path(__file__).resolve().parents[2]
# How long `insitu up` may take to say it is up before the fixture gives up.
STARTUP_TIMEOUT_S = 60.0


def insitu_bin() -> str:
    """The insitu binary to start clusters with (built if missing)."""
    override = os.environ.get("INSITU_BIN")
    if override:
        return override
    path = REPO / "target" / "debug" / "insitu"
    if not path.exists():
        subprocess.run(["cargo", "build", "-p", "insitu"], cwd=REPO, check=True)
    return str(path)


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One `insitu up` process: a coordinator and its storage servers."""

    def __init__(self, servers: int = 2, memory_mb: int = 256, extra: tuple[str, ...] = ()):
        self.dir = tempfile.TemporaryDirectory(prefix="insitu-pytest-")
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self._args = [insitu_bin(), "up", "--servers", str(servers), "--shards", "1",
                      "--port", str(self.port), "--dir", self.dir.name,
                      "--memory-mb", str(memory_mb), *extra]
        self._start()
        # `insitu up` requires authentication: the client token it wrote.
        with open(os.path.join(self.dir.name, "auth-token")) as f:
            self.token = f.read().strip()

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            self._args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self._wait_up()

    def restart(self) -> None:
        """kill -9 the whole cluster, then start it again on the same
        directory and port (as an operator would after a crash)."""
        self.kill()
        self._start()

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """Run `insitu ARGS...` against this cluster with its token."""
        token = os.path.join(self.dir.name, "auth-token")
        return subprocess.run(
            [insitu_bin(), "--auth-token-file", token, *args],
            env={**os.environ, "INSITU_CLUSTER": self.addr},
            capture_output=True, text=True, timeout=60,
        )

    def connect(self, **kwargs) -> insitu.Client:
        """`insitu.connect` to this cluster, presenting its token."""
        return insitu.connect(self.addr, auth_token=self.token, **kwargs)

    def _wait_up(self) -> None:
        """Read output until "insitu is up" (bounded by STARTUP_TIMEOUT_S)."""
        lines: list[str] = []
        up = threading.Event()

        def reader() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.append(line)
                if "insitu is up" in line:
                    up.set()
            # The rest of the output is read (and dropped) until exit, so
            # the process never blocks on a full pipe.

        threading.Thread(target=reader, daemon=True).start()
        if not up.wait(STARTUP_TIMEOUT_S):
            self.kill()
            raise RuntimeError("insitu up did not come up:\n" + "".join(lines))

    def kill(self) -> None:
        """Stop the whole cluster at once (SIGKILL) and wait for it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def pause(self) -> None:
        """Freeze the cluster (SIGSTOP): connections stay open, nothing answers.

        Returns once every thread is stopped: the signal is delivered
        asynchronously, and on a busy machine a shard thread can otherwise
        answer one more request after `kill` returns."""
        self.proc.send_signal(signal.SIGSTOP)
        tasks = Path(f"/proc/{self.proc.pid}/task")
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            states = []
            for task in tasks.iterdir():
                try:
                    # The state follows the ")" that ends the command name.
                    states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
                except (OSError, IndexError):
                    continue  # a thread that just exited
            if states and all(st in ("T", "t") for st in states):
                return
            time.sleep(0.005)
        raise RuntimeError("insitu up did not stop within 5 s of SIGSTOP")

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop cleanly (as Ctrl-C does), or kill after a bounded wait."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.dir.cleanup()


@pytest.fixture(scope="session")
def cluster():
    """A 2-server cluster shared by the whole session."""
    c = Cluster()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def client(cluster):
    return cluster.connect()


@pytest.fixture
def table(client):
    """A fresh table (unique name), dropped after the test."""
    name = "t_" + uuid.uuid4().hex[:12]
    t = client.create_table(name, tablets=4)
    yield t
    try:
        client.drop_table(name)
    except insitu.UnknownTable:
        pass


@pytest.fixture
def own_cluster():
    """A cluster of its own, for tests that stop or freeze it."""
    c = Cluster(servers=1, memory_mb=64)
    yield c
    if c.proc.poll() is None:
        c.resume()
    c.stop()


def run_bounded(fn, limit_s: float = 60.0):
    """Run fn() in a thread; fail the test if it has not returned in limit_s
    (a hang guard, not a performance check). Returns fn's result or raises
    its exception."""
    out: dict = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            out["error"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(limit_s)
    assert not th.is_alive(), f"call still blocked after {limit_s} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def assert_runner_passes_through(run, table, bad_argument):
    """What `Client.read_only` and `Client.run_transaction` both promise:
    `run(body)` returns what `body` returned, and an exception `body`
    raises (its own, or `bad_argument`'s TypeError) passes through as is."""
    assert run(lambda handle: handle.get(table, "nothing")) is None

    def bad(handle):
        raise ValueError("from the body")

    with pytest.raises(ValueError, match="from the body"):
        run(bad)
    with pytest.raises(TypeError):
        run(bad_argument)
