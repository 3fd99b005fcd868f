"""Fixtures: a real k3cached on a temporary store and socket.

Paths come from the environment that `make test` (ctest) sets:
K3CACHED (the daemon), K3CACHECTL, K3PUB (a C client that publishes
synthetic snapshots), K3_SHARED_DIR, and K3CACHE_LIBRARY (libk3cache.so.0).
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _need(name):
    v = os.environ.get(name)
    if not v:
        pytest.fail(f"${name} is not set: run these tests through `make test` (ctest)")
    return v


class Daemon:
    """k3cached on a store and socket of its own. halt() stops it with
    SIGTERM and start() starts it again on the same store and socket, as a
    restart of the service would."""

    def __init__(self, *flags):
        self.dir = tempfile.mkdtemp(prefix="k3py-")
        self.sock = os.path.join(self.dir, "k3.sock")
        self.flags = flags
        self.log = open(os.path.join(self.dir, "k3cached.log"), "w")
        self.proc = None
        self.start()

    def start(self):
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.proc = subprocess.Popen(
            [_need("K3CACHED"), "--db", os.path.join(self.dir, "db"), "--socket", self.sock,
             *self.flags], stdout=self.log, stderr=subprocess.STDOUT)
        # up once a connect succeeds: the path is there from its bind(), a
        # moment before its listen() (a connect then is refused)
        for _ in range(1000):
            if self.proc.poll() is not None:
                break
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(self.sock)
                    return
                except OSError:
                    pass
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("k3cached did not start: " + open(self.log.name).read())

    def halt(self):
        """SIGTERM, and waits until it has stopped; the store stays."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        assert not os.path.exists(self.sock), "k3cached left its socket behind"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.log.close()
        subprocess.run(["rm", "-rf", self.dir], check=False)


@pytest.fixture(scope="session")
def daemon():
    d = Daemon("--max-bytes", "512MiB")
    yield d
    d.stop()


@pytest.fixture
def shared():
    return _need("K3_SHARED_DIR")


@pytest.fixture
def twin_path(shared):
    return os.path.join(shared, "models", "kimi-k3-0.40b-twin.json")


@pytest.fixture
def new_daemon():
    """new_daemon(*flags): a Daemon of the test's own (to halt, restart or
    start with other flags), stopped after the test."""
    made = []

    def make(*flags):
        made.append(Daemon(*flags))
        return made[-1]

    yield make
    for d in made:
        d.stop()
