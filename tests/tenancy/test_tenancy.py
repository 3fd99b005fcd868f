"""Tenancy against the real daemon (issue 14, item 4): on the Unix socket a
peer's uid is its namespace; on TCP, the name of its token.

The suite runs as root (CI does) and forks children that take other uids
with setuid, as separate services' workers would be. Paths come from ctest:
K3CACHED, K3CACHECTL, K3_SHARED_DIR, K3CACHE_LIBRARY.
"""
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import k3cache  # noqa: E402

A, B, C = 65534, 65533, 65532  # uids with no other use here
NOGROUP = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to setuid children")


def env(name):
    v = os.environ.get(name)
    if not v:
        pytest.fail(f"${name} is not set: run these tests through `make test` (ctest)")
    return v


class Daemon:
    def __init__(self, *flags, tcp=False):
        self.dir = tempfile.mkdtemp(prefix="k3ten-")
        os.chmod(self.dir, 0o755)  # the children must reach the socket
        self.sock = os.path.join(self.dir, "k3.sock")
        self.port = None
        args = [env("K3CACHED"), "--db", os.path.join(self.dir, "db"), "--socket", self.sock,
                "--log-level", "warn", *flags]
        if tcp:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            args += ["--listen", "127.0.0.1:%d" % self.port]
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(500):
            if os.path.exists(self.sock):
                with socket.socket(socket.AF_UNIX) as probe:
                    if probe.connect_ex(self.sock) == 0:
                        break
            assert self.proc.poll() is None, open(self.log.name).read()
            time.sleep(0.01)
        os.chmod(self.sock, 0o666)

    def tcp(self):
        return "tcp:127.0.0.1:%d" % self.port

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0
        self.log.close()
        subprocess.run(["rm", "-rf", self.dir], check=False)


def ctl(*args, uid=None, gid=None, extra_env=None):
    def drop():
        if gid is not None:
            os.setgroups([])
            os.setgid(gid)
        if uid is not None:
            os.setuid(uid)
    e = dict(os.environ, **(extra_env or {}))
    return subprocess.run([env("K3CACHECTL"), *args], capture_output=True, text=True,
                          timeout=60, preexec_fn=drop, env=e)


def as_uid(uid, fn, gid=None):
    """Runs fn() in a child that has become uid; returns what it returns
    (JSON-able), or raises what it raised, as text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(gid if gid is not None else uid)
            os.setuid(uid)
            out = {"ok": fn()}
        except Exception as e:  # reported to the parent
            out = {"error": type(e).__name__, "message": str(e)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def spec():
    with open(os.path.join(env("K3_SHARED_DIR"), "models", "tiny-hybrid.json")) as f:
        return json.load(f)


def state(sp, p, seed):
    rng = np.random.default_rng(seed)
    out = []
    for l in sp["layers"]:
        n0, n1 = ((l["conv_len"], l["recurrent_len"]) if l["mixer"] == "kda"
                  else (p * l["k_row"], p * l["v_row"]))
        out.append((rng.standard_normal(n0, dtype=np.float32),
                    rng.standard_normal(n1, dtype=np.float32)))
    return out


TOKENS = list(range(100, 180))


def publish(addr, salt=b"", seed=1):
    with k3cache.Client(addr) as c:
        fp = c.put_model(json.dumps(spec()))
        return c.publish(fp, TOKENS, state(spec(), len(TOKENS), seed), salt=salt).hex()


def lookup(addr, salt=b""):
    with k3cache.Client(addr) as c:
        fp = c.put_model(json.dumps(spec()))
        hit = c.lookup(fp, TOKENS + [1], salt=salt)
        return hit.key.hex() if hit.key else None


def restore(addr, key):
    with k3cache.Client(addr) as c:
        fp = c.put_model(json.dumps(spec()))
        got = c.restore(bytes.fromhex(key), fp)
        return got.prefix_len


@pytest.fixture
def model_added():
    """A daemon whose store holds the model (added by root, an admin)."""
    d = Daemon()
    with k3cache.Client(d.sock) as c:
        c.put_model(json.dumps(spec()))
    yield d
    d.stop()


def test_uids_never_see_each_other(model_added):
    d = model_added
    key_a = as_uid(A, lambda: publish(d.sock))["ok"]
    # A finds its own entry; B, with the same tokens and salt, does not
    assert as_uid(A, lambda: lookup(d.sock))["ok"] == key_a
    assert as_uid(B, lambda: lookup(d.sock))["ok"] is None
    # nor can B restore it by key: to B it does not exist
    got = as_uid(B, lambda: restore(d.sock, key_a))
    assert got.get("error") == "NotFoundError", got
    absent = as_uid(B, lambda: restore(d.sock, "ab" * 32))
    assert got["message"] == absent["message"], "a tenant can tell that the key exists"
    assert as_uid(A, lambda: restore(d.sock, key_a))["ok"] == len(TOKENS)
    # B publishes the same prompt: its own entry, under another key
    key_b = as_uid(B, lambda: publish(d.sock, seed=2))["ok"]
    assert key_b != key_a
    assert as_uid(B, lambda: lookup(d.sock))["ok"] == key_b
    # root (an admin, with no namespace) does not find them by lookup either
    assert lookup(d.sock) is None
    # but lists both; B may not list anything
    r = ctl("--socket", d.sock, "--json", "ls")
    assert r.returncode == 0, r.stderr
    keys = {e["key"] for e in json.loads(r.stdout)["entries"]}
    assert {key_a, key_b} <= keys
    for cmd in (["ls"], ["inspect", key_a[:16]], ["verify"], ["evict", "--all", "--yes"],
                ["export", key_a[:16], "-o", "/dev/null"]):
        r = ctl("--socket", d.sock, *cmd, uid=B, gid=B)
        assert r.returncode == 1, (cmd, r.stdout, r.stderr)
        assert "DENIED" in r.stderr and "admin" in r.stderr, r.stderr
    # stat stays open to everyone
    r = ctl("--socket", d.sock, "stat", uid=B, gid=B)
    assert r.returncode == 0, r.stderr


def test_new_model_needs_an_admin():
    d = Daemon()
    try:
        got = as_uid(A, lambda: publish(d.sock))
        assert got.get("error") == "DeniedError", got
        assert "model add" in got["message"]
        with k3cache.Client(d.sock) as c:  # root adds it
            c.put_model(json.dumps(spec()))
        assert len(as_uid(A, lambda: publish(d.sock))["ok"]) == 64
    finally:
        d.stop()


def test_share_uids_join_namespaces():
    d = Daemon("--share-uids", "%d,%d" % (A, B))
    try:
        with k3cache.Client(d.sock) as c:
            c.put_model(json.dumps(spec()))
        key = as_uid(A, lambda: publish(d.sock))["ok"]
        assert as_uid(B, lambda: lookup(d.sock))["ok"] == key
        assert as_uid(C, lambda: lookup(d.sock))["ok"] is None
    finally:
        d.stop()


def test_admin_group():
    d = Daemon("--admin-group", "nogroup")
    try:
        r = ctl("--socket", d.sock, "ls", uid=C, gid=NOGROUP)
        assert r.returncode == 0, r.stderr
        r = ctl("--socket", d.sock, "ls", uid=C, gid=C)
        assert r.returncode == 1 and "DENIED" in r.stderr
    finally:
        d.stop()


def test_tcp_tokens(tmp_path):
    tokens = tmp_path / "tokens"
    alice, bob, ops = ("%032x" % random.getrandbits(128) for _ in range(3))
    tokens.write_text("# name token [admin]\nalice %s\nbob %s\n\nops %s admin\n" %
                      (alice, bob, ops))
    d = Daemon("--token-file", str(tokens), tcp=True)
    try:
        with k3cache.Client(d.sock) as c:
            c.put_model(json.dumps(spec()))
        # no token: Hello (ping) answers, nothing else does
        r = ctl("--socket", d.tcp(), "ping", extra_env={"K3CACHE_TOKEN": ""})
        assert r.returncode == 0, r.stderr
        r = ctl("--socket", d.tcp(), "stat", extra_env={"K3CACHE_TOKEN": ""})
        assert r.returncode == 1 and "DENIED" in r.stderr and "token" in r.stderr
        # a wrong token: refused at connect; k3cachectl says DENIED and exits 1
        # (an error answer), not 3 (no daemon), so a health check tells them apart
        r = ctl("--socket", d.tcp(), "stat", extra_env={"K3CACHE_TOKEN": "x" * 32})
        assert r.returncode == 1 and "DENIED" in r.stderr and "--socket" not in r.stderr, r
        os.environ["K3CACHE_TOKEN"] = "x" * 32
        with pytest.raises(k3cache.DeniedError):
            k3cache.Client(d.tcp()).lookup(b"\0" * 32, [1, 2])
        # alice publishes; bob does not see it; alice does
        os.environ["K3CACHE_TOKEN"] = alice
        key = publish(d.tcp())
        assert lookup(d.tcp()) == key
        r = ctl("--socket", d.tcp(), "ls")
        assert r.returncode == 1 and "DENIED" in r.stderr
        os.environ["K3CACHE_TOKEN"] = bob
        assert lookup(d.tcp()) is None
        with pytest.raises(k3cache.NotFoundError):
            restore(d.tcp(), key)
        # an admin token lists everything
        r = ctl("--socket", d.tcp(), "--json", "ls", extra_env={"K3CACHE_TOKEN": ops})
        assert r.returncode == 0, r.stderr
        assert key in {e["key"] for e in json.loads(r.stdout)["entries"]}
        # and nobody on the Unix socket shares alice's namespace
        assert as_uid(A, lambda: lookup(d.sock))["ok"] is None
        # before its Hello a TCP peer may announce a header of 64 KiB at most:
        # a larger one is refused at its length, before any of it is held
        with socket.create_connection(("127.0.0.1", d.port), timeout=5) as s:
            s.sendall(struct.pack("<I", 1 << 20) + b"\0" * 1024)
            got = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                got += b
        assert b"before a Hello with a valid token" in got, got
        r = ctl("--socket", d.sock, "--json", "stat")
        assert json.loads(r.stdout)["errors_denied"] >= 1, r.stdout
    finally:
        os.environ.pop("K3CACHE_TOKEN", None)
        d.stop()


def test_bad_tenancy_flags(tmp_path):
    """A token file with a malformed line, or a share list of one uid, keeps
    the daemon from starting, with the reason."""
    tokens = tmp_path / "tokens"
    tokens.write_text("alice %s\nbob short\n" % ("a" * 32))
    db, sock = str(tmp_path / "db"), str(tmp_path / "k3.sock")
    r = subprocess.run([env("K3CACHED"), "--db", db, "--socket", sock, "--token-file",
                        str(tokens), "--insecure-tcp", "--listen", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "tokens:2: expected NAME TOKEN [admin]" in r.stderr, r.stderr
    # a line longer than the reader's buffer is refused whole: its tail is
    # not read as a line of its own (here a comment's tail that looks like
    # a token line, which would have let "mallory" in)
    tokens.write_text("#" + " " * 600 + "mallory %s\nalice %s\n" % ("m" * 32, "a" * 32))
    r = subprocess.run([env("K3CACHED"), "--db", db, "--socket", sock, "--token-file",
                        str(tokens), "--insecure-tcp", "--listen", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=5)
    assert r.returncode == 1 and "tokens:1: a line longer than" in r.stderr, r.stderr
    # one token on two lines names two tenants (and maybe an admin): which
    # one a client became was the first line's, silently
    tokens.write_text("alice %s\nops %s admin\n" % ("a" * 32, "a" * 32))
    r = subprocess.run([env("K3CACHED"), "--db", db, "--socket", sock, "--token-file",
                        str(tokens), "--insecure-tcp", "--listen", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=5)
    assert r.returncode == 1 and "tokens:2: the token of line 1 again" in r.stderr, r.stderr
    r = subprocess.run([env("K3CACHED"), "--db", db, "--socket", sock, "--share-uids", "1000"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "two or more uids" in r.stderr, r.stderr
    # a uid in two lists (or twice in one) would keep only the last list's
    # namespace, silently parting it from the first list's uids: refused
    for lists in (["1000,1001", "1001,1002"], ["1000,1001,1000"]):
        args = [a for l in lists for a in ("--share-uids", l)]
        r = subprocess.run([env("K3CACHED"), "--db", db, "--socket", sock, *args],
                           capture_output=True, text=True, timeout=5)
        assert r.returncode == 2 and "uid 1" in r.stderr and "one list" in r.stderr, (lists, r)


def test_one_tenant_holds_at_most_its_share_of_restores():
    """--max-restores 3, --max-restores-per-tenant 2: uid A keeps two restores
    of a 20 MB entry streaming (it reads nothing), and its third is BUSY,
    counted; root, another tenant, is still served. Before, A could hold all
    three and leave everyone else BUSY."""
    with open(os.path.join(env("K3_SHARED_DIR"), "models", "kimi-k3-0.40b-twin.json")) as f:
        twin = json.load(f)
    d = Daemon("--max-restores", "3", "--max-restores-per-tenant", "2")
    try:
        with k3cache.Client(d.sock) as c:
            fp = c.put_model(json.dumps(twin))
            mine = c.publish(fp, list(range(1, 501)), state(twin, 500, 4))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # uid A: two restores held, a third asked
            os.close(r)
            try:
                os.setgroups([])
                os.setgid(A)
                os.setuid(A)
                with k3cache.Client(d.sock) as c:
                    c.put_model(json.dumps(twin))  # stored: answered as before
                    key = c.publish(fp, list(range(1, 2001)), state(twin, 2000, 5))
                hdr = b"\x08\x01\x72\x22\x0a\x20" + key  # Request{id 1, Restore{key}}
                held = []
                for _ in range(3):
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(d.sock)
                    s.sendall(struct.pack("<I", len(hdr)) + hdr)
                    held.append(s)
                time.sleep(0.5)
                s = held[2]
                s.settimeout(5)
                n = struct.unpack("<I", s.recv(4, socket.MSG_WAITALL))[0]
                out = s.recv(n, socket.MSG_WAITALL).decode("latin-1")
            except Exception as e:  # reported to the parent
                out = "error: %r" % e
            os.write(w, out.encode("latin-1") + b"\n")
            time.sleep(30)  # holding its two; the parent kills it
            os._exit(0)
        os.close(w)
        third = b""
        while not third.endswith(b"\n"):
            chunk = os.read(r, 65536)
            if not chunk:
                break
            third += chunk
        try:
            assert b"--max-restores-per-tenant" in third and b"uid %d" % A in third, third
            # root's own entry: its restore is served meanwhile
            with k3cache.Client(d.sock) as c:
                c.put_model(json.dumps(twin))
                assert c.restore(mine).prefix_len == 500
                stat = {}
                r2 = ctl("--socket", d.sock, "--json", "stat")
                stat = json.loads(r2.stdout)
            assert stat.get("restores_tenant_busy") == 1, r2.stdout
            assert stat.get("max_restores") == 3 and stat.get("max_restores_per_tenant") == 2
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
    finally:
        d.stop()
