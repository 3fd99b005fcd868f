"""The library and k3cachectl against a daemon out of step: a fake one, or a
proxy that rewrites a real one's answers. An answer that names no entry, or
another, or carries a payload the protocol has none for, or lists an entry
without its key, is refused with an error: never a crash, a wait for ever,
or another entry's state returned as this one's."""
import os
import socket
import struct
import subprocess
import threading
import time

import numpy as np
import pytest

import k3cache
from test_client import model_of, state, tokens


# ---- protobuf, as little as these answers need ----

def varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def read_varint(b, i):
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def fields(b):
    """(field, value, raw bytes) of each field of message b."""
    i, out = 0, []
    while i < len(b):
        start = i
        tag, i = read_varint(b, i)
        f, wt = tag >> 3, tag & 7
        if wt == 0:
            v, i = read_varint(b, i)
        elif wt == 2:
            n, i = read_varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        out.append((f, v, b[start:i]))
    return out


def fv(f, n):
    return varint(f << 3) + varint(n)


def fb(f, data):
    return varint(f << 3 | 2) + varint(len(data)) + data


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        got = s.recv(n - len(b))
        if not got:
            raise EOFError
        b += got
    return b


def read_frame(s):
    """A frame's header and its payload's length (Request and Response both
    carry it as field 2 / field 4: the caller says which)."""
    hlen = struct.unpack("<I", recv_exact(s, 4))[0]
    return recv_exact(s, hlen)


def field(msg, f, default=0):
    return next((v for g, v, _ in fields(msg) if g == f), default)


# ---- a fake daemon ----

KEY = bytes(range(32))
OP_HELLO, OP_LOOKUP, OP_RESTORE, OP_INSPECT, OP_LIST, OP_EVICT, OP_STAT = 10, 13, 14, 16, 15, 17, 18
OP_LIST_MODELS, OP_RESOLVE = 30, 32


class Server:
    """A Unix socket at path whose connections _serve runs, each on its own
    thread, until close."""

    def __init__(self, path):
        self.path = path
        self.ls = socket.socket(socket.AF_UNIX)
        self.ls.bind(self.path)
        self.ls.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                cs, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(cs,), daemon=True).start()

    def close(self):
        self.ls.close()


class FakeDaemon(Server):
    """Answers each request with answer(op) -> header bytes (None: an
    UNSUPPORTED error); trickle(op) says whether a byte a few times a second
    follows, for ever."""

    def __init__(self, tmp_path, answer, trickle=lambda op: False):
        self.answer, self.trickle = answer, trickle
        super().__init__(str(tmp_path / "fake.sock"))

    def _serve(self, cs):
        try:
            while True:
                h = read_frame(cs)
                rid = field(h, 1)
                op = next((g for g, _, _ in fields(h) if g >= 10), 0)
                if op == OP_HELLO:
                    a = fv(41, 1) + fb(42, b"fake")
                elif op == OP_LIST_MODELS:
                    a = b""  # none
                elif op == OP_RESOLVE:
                    a = fb(31, KEY)
                else:
                    a = self.answer(op)
                    if a is None:
                        a = fv(2, 8) + fb(3, b"unsupported")
                a = fv(1, rid) + a
                cs.sendall(struct.pack("<I", len(a)) + a)
                while self.trickle(op):
                    cs.sendall(b"x")
                    time.sleep(0.2)
        except (EOFError, OSError):
            pass
        finally:
            cs.close()


def ctl(sock, *args):
    return subprocess.run([os.environ["K3CACHECTL"], "--socket", sock, *args],
                          capture_output=True, text=True, timeout=30)


def test_ctl_refuses_entries_without_their_key(tmp_path):
    """k3cachectl read 32 bytes from an entry's key, or an inspected entry's
    model, whatever their length: a missing field was a NULL dereference."""
    answers = {
        OP_LIST: fb(38, fb(13, b"m") + fv(4, 5)),      # one entry, no key
        OP_EVICT: fb(38, fv(6, 100)),                  # one entry, no key
        OP_INSPECT: fb(38, fb(1, KEY) + fv(4, 5)),     # its key, no model
    }
    fake = FakeDaemon(tmp_path, answers.get)
    try:
        for args in (["ls"], ["evict", "--all", "--dry-run"],
                     ["--json", "evict", "--all", "--dry-run"], ["inspect", KEY.hex()]):
            r = ctl(fake.path, *args)
            assert r.returncode == 1, (args, r.returncode, r.stderr)
            assert "out of step" in r.stderr, (args, r.stderr)
    finally:
        fake.close()


def test_a_payload_the_protocol_has_none_for_closes_the_connection(tmp_path):
    """A lookup's miss announcing a 1 TiB payload, then a byte every 0.2 s:
    the library drained it, each byte within the timeout, for ever."""
    fake = FakeDaemon(tmp_path, lambda op: fv(4, 1 << 40) if op in (OP_LOOKUP, OP_STAT) else None,
                      trickle=lambda op: op in (OP_LOOKUP, OP_STAT))
    try:
        c = k3cache.Client(fake.path, timeout_ms=1000)
        t0 = time.monotonic()
        with pytest.raises(k3cache.Error) as ei:
            c.lookup(bytes(32), [1, 2, 3])
        assert time.monotonic() - t0 < 5
        assert "payload" in ei.value.message and "closed" in ei.value.message
        assert ei.value.unreachable  # closed: connect again
        with pytest.raises(k3cache.Error):  # the connection is gone, not out of step
            c.lookup(bytes(32), [1, 2, 3])
        c.close()
        r = ctl(fake.path, "stat")  # an op that never has one
        assert r.returncode == 3 and "payload" in r.stderr, r.stderr  # connection closed
    finally:
        fake.close()


# ---- a proxy that swaps two entries ----

class SwapProxy(Server):
    """In front of a real daemon: a request naming key a asks for key b, and
    the answer then names a (mode "rename") or no entry at all ("strip"); or
    (mode "flip", a == b) a restore's payload has one bit flipped, or ("cut")
    ends halfway, the connection closed; or ("lose-models") a request for
    the model specs is met by the connection closed unanswered."""

    def __init__(self, daemon, a, b, mode):
        self.daemon, self.a, self.b, self.mode = daemon.sock, a, b, mode
        super().__init__(daemon.sock + ".swap-" + mode)

    def _answer(self, r):
        if self.mode == "rename":
            return r.replace(self.b, self.a)
        return b"".join(raw for f, _, raw in fields(r) if f != 31)  # no key

    def _serve(self, cs):
        ds = socket.socket(socket.AF_UNIX)
        ds.connect(self.daemon)
        try:
            while True:
                h = read_frame(cs)
                if self.mode == "lose-models" and any(f == OP_LIST_MODELS for f, _, _ in fields(h)):
                    return
                body = recv_exact(cs, field(h, 2)) if field(h, 2) else b""
                restore = any(f == OP_RESTORE for f, _, _ in fields(h))
                h = h.replace(self.a, self.b)
                ds.sendall(struct.pack("<I", len(h)) + h + body)
                r = read_frame(ds)
                body = recv_exact(ds, field(r, 4)) if field(r, 4) else b""
                if restore and self.mode == "cut" and body:
                    cs.sendall(struct.pack("<I", len(r)) + r + body[:len(body) // 2])
                    return
                if restore and self.mode == "flip" and body:
                    body = bytearray(body)
                    body[len(body) // 2] ^= 0x10
                    body = bytes(body)
                elif restore and self.mode != "lose-models":
                    r = self._answer(r)
                cs.sendall(struct.pack("<I", len(r)) + r + body)
        except (EOFError, OSError):
            pass
        finally:
            cs.close()
            ds.close()


def test_another_entrys_restore_is_refused(daemon, twin_path):
    """Entries A (P=120) and B (P=200): a restore of A answered with B's
    bytes, the answer naming A or naming no entry, returned OK with B's
    state and P. The answer must name the entry asked for, and a key's P is
    the one its lookup or publish gave."""
    spec = model_of(twin_path)
    with k3cache.Client(daemon.sock) as c:
        fp = c.put_model(twin_path)
        a = c.publish(fp, tokens(120, 900), state(spec, 120, 5))
        b = c.publish(fp, tokens(200, 950), state(spec, 200, 6))
    for mode, words in (("strip", "answered with entry none"), ("rename", "P=200")):
        proxy = SwapProxy(daemon, a, b, mode)
        try:
            with k3cache.Client(proxy.path) as c:
                c.put_model(twin_path)
                assert c.lookup(fp, tokens(121, 900)).key == a  # P=120, through the proxy
                with pytest.raises(k3cache.Error) as ei:
                    c.restore_into(a, c.empty_layers(256))
                assert words in ei.value.message, (mode, ei.value.message)
        finally:
            proxy.close()
    # the real daemon serves A as A
    with k3cache.Client(daemon.sock) as c:
        c.put_model(twin_path)
        got = c.restore(a)
        assert got.prefix_len == 120
        want = state(spec, 120, 5)
        assert np.asarray(got[0][0], dtype=np.float32).tobytes() == want[0][0].tobytes()


def test_ctl_export_writes_no_bytes_known_bad(daemon, twin_path, tmp_path):
    """A restore's payload damaged between the daemon and k3cachectl export:
    the file was written with the bad bytes (only import checked them)."""
    spec = model_of(twin_path)
    with k3cache.Client(daemon.sock) as c:
        fp = c.put_model(twin_path)
        a = c.publish(fp, tokens(64, 4000), state(spec, 64, 9))
    proxy = SwapProxy(daemon, a, a, "flip")
    out = tmp_path / "a.k3snap"
    try:
        r = ctl(proxy.path, "export", a.hex()[:16], "-o", str(out))
        assert r.returncode == 1, (r.returncode, r.stderr)
        assert "nothing written" in r.stderr and "layer" in r.stderr, r.stderr
        assert not out.exists()
    finally:
        proxy.close()
    r = ctl(daemon.sock, "export", a.hex()[:16], "-o", str(out))  # the daemon's own bytes
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 0


def test_a_restore_cut_short_says_what_may_have_cut_it(daemon, twin_path):
    """The daemon cannot answer in the middle of a payload: a client it
    closed for reading under --min-download-rate saw only "closed the
    connection"."""
    spec = model_of(twin_path)
    with k3cache.Client(daemon.sock) as c:
        fp = c.put_model(twin_path)
        a = c.publish(fp, tokens(64, 5000), state(spec, 64, 4))
    proxy = SwapProxy(daemon, a, a, "cut")
    try:
        with k3cache.Client(proxy.path) as c:
            c.put_model(twin_path)
            assert c.lookup(fp, tokens(65, 5000)).key == a
            with pytest.raises(k3cache.Error) as ei:
                c.restore_into(a, c.empty_layers(64))
            m = ei.value.message
            assert "closed the connection mid-restore (layer" in m, m
            assert "--min-download-rate" in m and "must not be used" in m, m
            assert ei.value.unreachable
        # k3cachectl's export reads the payload itself: the same hint, and exit 3 (the
        # connection lost, no answer)
        r = ctl(proxy.path, "export", a.hex()[:16], "-o", "/dev/null")
        assert r.returncode == 3 and "--min-download-rate" in r.stderr, (r.returncode, r.stderr)
    finally:
        proxy.close()


def test_ctl_a_daemon_lost_reading_the_models_is_no_missing_model(daemon, twin_path, tmp_path):
    """The connection lost while export or inspect read the model specs: export
    said "the entry's model spec is not in the store" and exited 1 (inspect
    went on to "model unknown"). A lost daemon is exit 3, saying so."""
    spec = model_of(twin_path)
    with k3cache.Client(daemon.sock) as c:
        fp = c.put_model(twin_path)
        a = c.publish(fp, tokens(64, 6000), state(spec, 64, 3))
    proxy = SwapProxy(daemon, a, a, "lose-models")
    out = tmp_path / "a.k3snap"
    try:
        for args in (("export", a.hex()[:16], "-o", str(out)), ("inspect", a.hex()[:16])):
            r = ctl(proxy.path, *args)
            assert r.returncode == 3, (args[0], r.returncode, r.stdout, r.stderr)
            assert "not in the store" not in r.stderr, r.stderr
            assert "model unknown" not in r.stdout, r.stdout
        assert not out.exists()
    finally:
        proxy.close()
