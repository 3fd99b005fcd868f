"""The k3cache package against a real daemon: round trips, byte identity
with the C client, every error code's exception, a tampered restore refused,
and buffers of the wrong size or dtype refused before anything is sent."""
import array
import json
import os
import socket
import subprocess
import threading

import numpy as np
import pytest

import k3cache


def model_of(path):
    with open(path) as f:
        return json.load(f)


def state(spec, p, seed):
    """A state as an engine holds it: per layer two float32 numpy arrays."""
    rng = np.random.default_rng(seed)
    layers = []
    for l in spec["layers"]:
        if l["mixer"] == "kda":
            n0, n1 = l["conv_len"], l["recurrent_len"]
        else:
            n0, n1 = p * l["k_row"], p * l["v_row"]
        layers.append((rng.standard_normal(n0, dtype=np.float32),
                       rng.standard_normal(n1, dtype=np.float32)))
    return layers


def empty_like(layers):
    return [(np.full_like(a, 7.0), np.full_like(b, 7.0)) for a, b in layers]


def same(want, got):
    assert len(want) == len(got)
    for (a, b), (x, y) in zip(want, got):
        assert np.asarray(x, dtype=np.float32).tobytes() == a.tobytes()
        assert np.asarray(y, dtype=np.float32).tobytes() == b.tobytes()


def stat(daemon):
    out = subprocess.run([os.environ["K3CACHECTL"], "--socket", daemon.sock, "--json", "stat"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def tokens(n, base):
    return [base + 3 * i for i in range(n)]


def test_round_trip(daemon, twin_path):
    spec = model_of(twin_path)
    with k3cache.Client(daemon.sock) as c:
        fp = c.put_model(twin_path)
        assert isinstance(fp, bytes) and len(fp) == 32
        want = subprocess.run([os.environ["K3CACHECTL"], "model", "fingerprint", twin_path],
                              check=True, capture_output=True, text=True).stdout.split()[0]
        assert fp.hex() == want
        t = tokens(500, 1000)
        s = state(spec, 500, 1)
        key = c.publish(fp, t, s)
        assert len(key) == 32
        assert c.last_publish["created"]
        r = c.lookup(fp, t + [9, 9, 9])
        assert (r.prefix_len, r.key) == (500, key)
        assert c.lookup(fp, [1, 2, 3]).key is None
        out = empty_like(s)
        assert c.restore_into(key, out) == 500
        same(s, out)
        got = c.restore(key)
        assert got.prefix_len == 500
        assert isinstance(got[0][0], np.ndarray) and got[0][0].dtype == np.float32
        same(s, got)
        # a second publish of the same state moves nothing and says so
        assert c.publish(fp, t, s) == key
        assert not c.last_publish["created"]


def test_other_buffers_and_specs(daemon, twin_path):
    spec = model_of(twin_path)
    with k3cache.Client("unix:" + daemon.sock) as c:
        assert c.put_model(spec) == c.put_model(json.dumps(spec)) == c.put_model(twin_path)
        fp = c.put_model(spec)
        s = state(spec, 40, 2)
        # array('f') and memoryviews in, array('f') out
        mixed = [(array.array("f", a.tobytes()), memoryview(b)) for a, b in s]
        key = c.publish(fp, tokens(40, 7), mixed, salt="tenant-a")
        assert c.lookup(fp, tokens(41, 7)).prefix_len == 0  # another salt
        assert c.lookup(fp, tokens(41, 7), salt=b"tenant-a").key == key
        out = [(array.array("f", bytes(4 * len(a))), array.array("f", bytes(4 * len(b))))
               for a, b in s]
        assert c.restore_into(key, out) == 40
        same(s, out)
        # a delta from the entry it resumed from: only the new rows go
        s2 = state(spec, 64, 2)
        for (a, b), (x, y), l in zip(s, s2, spec["layers"]):
            if l["mixer"] == "mla":
                x[: len(a)] = a
                y[: len(b)] = b
        key2 = c.publish(fp, tokens(64, 7), s2, salt="tenant-a", base_key=key, base_rows=40)
        assert c.last_publish["delta_rows"] == 40
        same(s2, c.restore(key2))


def test_byte_identity_with_the_c_client(daemon, twin_path):
    """An entry published by the C client (k3pub, blobs) restores in Python to
    the same floats, and the same floats published from Python are stored as
    the same bytes (every layer's size and XXH3 equal)."""
    spec = model_of(twin_path)
    n = 96
    pub = subprocess.run([os.environ["K3PUB"], daemon.sock, twin_path, f"N:{n}", "", "3"],
                         check=True, capture_output=True, text=True).stdout.split()
    ckey = bytes.fromhex(pub[-1])
    want = []
    for i, l in enumerate(spec["layers"]):
        n0, n1 = ((l["conv_len"], l["recurrent_len"]) if l["mixer"] == "kda"
                  else (n * l["k_row"], n * l["v_row"]))
        j = np.arange(n0 + n1, dtype=np.uint64)
        f = ((j * 31 + i * 7 + 3) % 1000).astype(np.float32) * np.float32(0.001) - np.float32(0.5)
        want.append((f[:n0].copy(), f[n0:].copy()))
    with k3cache.Client(daemon.sock) as c:
        fp = c.put_model(twin_path)
        same(want, c.restore(ckey))
        pkey = c.publish(fp, tokens(n, 123456), want)

    def layers(key):
        out = subprocess.run([os.environ["K3CACHECTL"], "--socket", daemon.sock, "--json",
                              "inspect", key.hex()], check=True, capture_output=True,
                             text=True).stdout
        return [(l["bytes"], l["xxh3"]) for l in json.loads(out)["layers"]]

    assert layers(ckey) == layers(pkey)


def test_every_code_has_its_exception(daemon, twin_path):
    names = [k3cache._lib.code_name(i).decode() for i in range(10)]
    assert names[0] == "OK"
    for name in names[1:]:
        cls = k3cache.ERRORS[name]
        assert issubclass(cls, k3cache.Error) and cls.code == name
        err = k3cache._lib.error_t(code=names.index(name), message=b"m")
        e = k3cache._error(err)
        assert type(e) is cls and e.code == name and e.message == "m"
    assert issubclass(k3cache.InvalidError, ValueError)
    # and real answers raise them
    with pytest.raises(k3cache.InternalError) as ei:
        k3cache.Client(daemon.sock + ".absent")
    assert ei.value.unreachable
    with k3cache.Client(daemon.sock) as c:
        fp = c.put_model(twin_path)
        with pytest.raises(k3cache.NotFoundError):
            c.restore(b"\x42" * 32)
        with pytest.raises(k3cache.UnknownModelError):
            c.publish(b"\x01" * 32, [1, 2], [])
        with pytest.raises(k3cache.InvalidError):
            c.put_model({"name": "x"})
        with pytest.raises(k3cache.InvalidError):
            c.lookup(fp[:31], [1, 2, 3])
        assert c.lookup(fp, []).prefix_len == 0  # an empty prompt: a miss
        for bad in ([-1, 2], [2**32], [1.5]):
            with pytest.raises(k3cache.InvalidError, match="tokens"):
                c.lookup(fp, bad)
        with pytest.raises(k3cache.InvalidError, match="limit"):
            c.lookup(fp, [1, 2, 3], limit=-1)


class FlipProxy:
    """A Unix socket in front of the daemon that, once armed, flips one bit
    of the answer stream `at` bytes after arming: inside a restore's floats."""

    def __init__(self, daemon, at):
        self.path = daemon.sock + ".proxy"
        self.daemon, self.at, self.armed = daemon.sock, at, False
        self.ls = socket.socket(socket.AF_UNIX)
        self.ls.bind(self.path)
        self.ls.listen(1)
        threading.Thread(target=self._serve, daemon=True).start()

    def _pump(self, src, dst, tamper):
        seen = 0
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:  # the other side closed both
                data = b""
            if not data:
                dst.close()
                return
            if tamper and self.armed:
                if seen <= self.at < seen + len(data):
                    b = bytearray(data)
                    b[self.at - seen] ^= 0x01
                    data = bytes(b)
                seen += len(data)
            dst.sendall(data)

    def _serve(self):
        cs, _ = self.ls.accept()
        ds = socket.socket(socket.AF_UNIX)
        ds.connect(self.daemon)
        threading.Thread(target=self._pump, args=(cs, ds, False), daemon=True).start()
        self._pump(ds, cs, True)


def test_tampered_restore_refused(daemon, twin_path):
    spec = model_of(twin_path)
    proxy = FlipProxy(daemon, 70000)  # past the answer's header, in layer 1's floats
    with k3cache.Client(proxy.path) as c:
        fp = c.put_model(twin_path)
        s = state(spec, 200, 4)
        key = c.publish(fp, tokens(200, 31), s)
        proxy.armed = True
        out = empty_like(s)
        with pytest.raises(k3cache.Error) as ei:
            c.restore_into(key, out)
        assert ei.value.code == "CORRUPT"
        assert "layer 1: checksum mismatch" in ei.value.message
        assert "must not be used" in ei.value.message


def test_empty_layers_and_an_engines_longer_buffers(daemon, twin_path):
    spec = model_of(twin_path)
    with k3cache.Client(daemon.sock) as c:
        fp = c.put_model(twin_path)
        t = tokens(120, 5000)
        s = state(spec, 120, 12)
        key = c.publish(fp, t, s)
        r = c.lookup(fp, t + [1])
        out = c.empty_layers(r.prefix_len)
        assert [(len(a), len(b)) for a, b in out] == [(len(a), len(b)) for a, b in s]
        assert all(a.dtype == np.float32 and b.dtype == np.float32 for a, b in out)
        assert c.restore_into(r.key, out) == 120
        same(s, out)
        # buffers for a longer context (an engine's, allocated once): the
        # first P rows of each MLA layer are written, the rest left alone
        big = c.empty_layers(300, fp=fp)
        for a, b in big:
            a.fill(7.0)
            b.fill(7.0)
        assert c.restore_into(key, big) == 120
        for i, l in enumerate(spec["layers"]):
            if l["mixer"] == "kda":
                same([s[i]], [big[i]])
                continue
            for got, want, row in ((big[i][0], s[i][0], l["k_row"]), (big[i][1], s[i][1],
                                                                        l["v_row"])):
                assert got[:120 * row].tobytes() == want.tobytes()
                assert (got[120 * row:] == 7.0).all()
        for bad in (-1, 1 << 32, "12", 1.5, True):
            with pytest.raises(k3cache.InvalidError, match="empty_layers: p is a prefix length"):
                c.empty_layers(bad)
        assert len(c.empty_layers(np.int64(3))[0][0]) == len(s[0][0])


def test_wrong_buffers_refused_before_sending(daemon, twin_path):
    spec = model_of(twin_path)
    with k3cache.Client(daemon.sock) as c:
        fp = c.put_model(twin_path)
        s = state(spec, 50, 5)
        key = c.publish(fp, tokens(50, 77), s)
        before = stat(daemon)
        bad_dtype = [(a.astype(np.float64), b) for a, b in s]
        with pytest.raises(k3cache.InvalidError, match="layer 0: conv: items are 'd'"):
            c.publish(fp, tokens(50, 78), bad_dtype)
        short = [(a, b) for a, b in s]
        short[3] = (s[3][0][:-1], s[3][1])
        with pytest.raises(k3cache.InvalidError, match="layer 3: k has"):
            c.publish(fp, tokens(50, 78), short)
        with pytest.raises(k3cache.InvalidError, match="2 layers given"):
            c.publish(fp, tokens(50, 78), s[:2])
        with pytest.raises(k3cache.InvalidError, match="layer 0"):
            c.publish(fp, tokens(50, 78), [(a.tolist(), b) for a, b in s])
        out = empty_like(s)
        out[0] = (out[0][0][:-1], out[0][1])
        with pytest.raises(k3cache.InvalidError, match="layer 0: conv has"):
            c.restore_into(key, out)
        out = empty_like(s)
        out[3] = (out[3][0], out[3][1][:-512])  # v one row short of k
        with pytest.raises(k3cache.InvalidError, match="layer 3: k holds 50 rows, v 49"):
            c.restore_into(key, out)
        ro = empty_like(s)
        ro[1][0].flags.writeable = False
        with pytest.raises(k3cache.InvalidError, match="layer 1: conv: not a writable"):
            c.restore_into(key, ro)
        strided = empty_like(s)
        wide = np.zeros(2 * len(s[0][0]), dtype=np.float32)
        strided[0] = (wide[::2], strided[0][1])
        with pytest.raises(k3cache.InvalidError, match="C-contiguous"):
            c.restore_into(key, strided)
        after = stat(daemon)
        for name in ("requests_publish", "requests_restore", "requests_lookup"):
            assert after[name] == before[name], name
        # and the client still works
        out = empty_like(s)
        assert c.restore_into(key, out) == 50
        same(s, out)


def test_a_closed_client_says_so(daemon, twin_path):
    # every call after close names the cause, not the models close let go
    c = k3cache.Client(daemon.sock)
    fp = c.put_model(twin_path)
    c.close()
    for call in (lambda: c.restore(b"\x42" * 32), lambda: c.restore_into(b"\x42" * 32, []),
                 lambda: c.lookup(fp, [1, 2, 3]), lambda: c.publish(fp, [1, 2], []),
                 lambda: c.empty_layers(10)):
        with pytest.raises(k3cache.InvalidError, match="the Client is closed"):
            call()


def test_the_keys_it_remembers_are_bounded(daemon, twin_path, monkeypatch):
    # the P of each key looked up or published is kept for the early size
    # check of a restore by key: the last few thousand, not every key a
    # long-running worker ever saw
    monkeypatch.setattr(k3cache, "_RECENT_KEYS", 4)
    spec = model_of(twin_path)
    with k3cache.Client(daemon.sock) as c:
        fp = c.put_model(twin_path)
        keys = []
        for i in range(10):
            t = tokens(20, 700000 + 100 * i)
            keys.append(c.publish(fp, t, state(spec, 20, 40 + i)))
            assert c.lookup(fp, t + [1]).key == keys[-1]
        assert len(c._p) == 4
        assert list(c._p) == keys[-4:]
        # a key forgotten still restores, checked by the library
        out = c.empty_layers(20)
        assert c.restore_into(keys[0], out) == 20
        same(state(spec, 20, 40), out)
