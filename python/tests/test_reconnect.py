"""A Client outlives its connection: after a call fails with .unreachable
(the daemon restarted, or hung up on a publish it refused TOO_LARGE), that
call raises, and the next one connects again, with the timeout the Client
was made with, to the address it was made with. Nothing is retried: the
call that failed is not sent again."""
import os
import socket
import threading

import pytest

import k3cache
from test_client import model_of, same, state, tokens


def test_the_next_call_connects_again_after_the_daemon_restarts(new_daemon, twin_path):
    d = new_daemon("--max-bytes", "64MiB")
    spec = model_of(twin_path)
    t, s = tokens(40, 800000), state(spec, 40, 1)
    with k3cache.Client(d.sock) as c:
        fp = c.put_model(twin_path)
        key = c.publish(fp, t, s)

        d.halt()
        # the call that meets the lost connection raises, unreachable
        with pytest.raises(k3cache.Error) as ei:
            c.lookup(fp, t + [1])
        assert ei.value.unreachable
        # while the daemon is down, every call tries to connect, and says where to
        for _ in range(2):
            with pytest.raises(k3cache.InternalError) as ei:
                c.lookup(fp, t + [1])
            assert ei.value.unreachable
            assert f"cannot connect to unix:{d.sock}" in str(ei.value)

        d.start()  # the same store and socket
        r = c.lookup(fp, t + [1])
        assert (r.prefix_len, r.key) == (40, key)
        out = c.empty_layers(40)
        assert c.restore_into(key, out) == 40
        same(s, out)
        # the same namespace (a Hello on the new connection): the same key
        assert c.publish(fp, t, s) == key and not c.last_publish["created"]

        # restarted between two calls: the first call on the old connection
        # still fails, and is not sent again (its entry is not stored)
        d.halt()
        d.start()
        t2, s2 = tokens(30, 900000), state(spec, 30, 2)
        with pytest.raises(k3cache.Error) as ei:
            c.publish(fp, t2, s2)
        assert ei.value.unreachable
        assert c.lookup(fp, t2 + [1]).prefix_len == 0
        key2 = c.publish(fp, t2, s2)
        assert c.last_publish["created"]
        assert c.restore(key2).prefix_len == 30


def test_the_next_call_connects_again_after_a_publish_refused_too_large(new_daemon, twin_path):
    # a payload over the store's capacity (and over the stage size, 16MiB)
    # is answered before it is all sent, and the connection is closed
    d = new_daemon("--max-bytes", "1MiB")
    spec = model_of(twin_path)
    with k3cache.Client(d.sock) as c:
        fp = c.put_model(twin_path)
        small = tokens(20, 1000)
        key = c.publish(fp, small, state(spec, 20, 3))
        with pytest.raises(k3cache.TooLargeError) as ei:
            c.publish(fp, tokens(2000, 1000), state(spec, 2000, 4))
        assert ei.value.unreachable and "capacity" in str(ei.value)
        r = c.lookup(fp, small + [1])
        assert (r.prefix_len, r.key) == (20, key)
        key3 = c.publish(fp, tokens(30, 5000), state(spec, 30, 5))
        assert c.restore(key3).prefix_len == 30


class Flaky:
    """A socket that closes its first connection at once and holds its
    second one open without a word, until release() (or 20 s)."""

    def __init__(self, path):
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(4)
        self.srv.settimeout(0.05)  # accept() looks at done this often
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def accept(self):
        while not self.done.is_set():
            try:
                return self.srv.accept()[0]
            except socket.timeout:
                pass
        return None

    def run(self):
        first = self.accept()
        if first:
            first.close()
        held = self.accept()
        if held:
            self.done.wait(20)
            held.close()

    def release(self):
        self.done.set()
        self.thread.join()
        self.srv.close()


def test_connecting_again_keeps_the_address_and_the_timeout(tmp_path, monkeypatch):
    path = str(tmp_path / "flaky.sock")
    monkeypatch.setenv("K3CACHE_SOCKET", path)
    fake = Flaky(path)
    try:
        c = k3cache.Client(timeout_ms=300)  # the address from $K3CACHE_SOCKET, now
        monkeypatch.setenv("K3CACHE_SOCKET", str(tmp_path / "elsewhere.sock"))
        with pytest.raises(k3cache.Error) as ei:  # hung up on
            c.lookup(b"\x01" * 32, [1, 2, 3])
        assert ei.value.unreachable
        # connected again to the same socket, which answers nothing: the
        # Client's 300 ms, not the library's default of 60 s (the peer hangs
        # up after 20 s, with another message)
        with pytest.raises(k3cache.Error) as ei:
            c.lookup(b"\x01" * 32, [1, 2, 3])
        assert ei.value.unreachable
        assert f"{path} timed out after 300 ms" in str(ei.value)
        c.close()
    finally:
        fake.release()


def test_a_connect_waits_at_most_timeout_ms():
    """A TCP listener whose accept queue is full drops new handshakes, as a
    host that is down does: the Client gives up after its timeout_ms, not the
    library's 60 s (before, k3cache_connect's default bounded the connect
    whatever timeout_ms said), on its first connect and on connecting again."""
    import time
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.bind(("127.0.0.1", 0))
    lst.listen(0)
    port = lst.getsockname()[1]
    fill = []
    try:
        for _ in range(4):  # never accepted: the queue stays full
            f = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
            fill.append(f)
        t0 = time.monotonic()
        with pytest.raises(k3cache.Error) as ei:
            k3cache.Client(f"tcp:127.0.0.1:{port}", timeout_ms=300)
        assert ei.value.unreachable
        assert time.monotonic() - t0 < 2.0
    finally:
        for f in fill:
            f.close()
        lst.close()
