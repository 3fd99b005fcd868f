"""Damaged stores, black-box: a real k3cached on a copy of a real store with
bytes flipped in its file.

Whatever the damage, the daemon either refuses the store (exit 3, naming
`k3cachectl salvage`) or serves it: it never crashes, never hands a worker
bytes other than those published, stays writable, and `verify` names every
entry it cannot serve. A refused store is salvaged, and what salvage saves is
served byte for byte.

The eight single-byte cases found by the black-box review (issue 14) are
named tests; a seeded campaign flips 1 to 8 random bytes 30 times.

Paths come from ctest: K3CACHED, K3CACHECTL, K3_SHARED_DIR, K3CACHE_LIBRARY.
"""
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
import k3cache  # noqa: E402
from lmdbpages import Store, P_OVERFLOW  # noqa: E402

DAMAGED_EXIT = 3
FLIP_RUNS = int(os.environ.get("K3_FLIP_RUNS", "30"))  # more: a longer campaign by hand


def env(name):
    v = os.environ.get(name)
    if not v:
        pytest.fail(f"${name} is not set: run these tests through `make test` (ctest)")
    return v


class Daemon:
    """k3cached on db; .refused holds its exit code when it would not start."""

    def __init__(self, db, workdir):
        self.sock = os.path.join(workdir, "k3-%d.sock" % random.randrange(1 << 30))
        self.logpath = self.sock + ".log"
        self.log = open(self.logpath, "w")
        self.proc = subprocess.Popen(
            [env("K3CACHED"), "--db", db, "--socket", self.sock, "--max-bytes", "256MiB",
             "--log-level", "warn"], stdout=self.log, stderr=subprocess.STDOUT)
        self.refused = None
        for _ in range(1000):
            if os.path.exists(self.sock):  # bound; listening once it accepts
                with socket.socket(socket.AF_UNIX) as probe:
                    if probe.connect_ex(self.sock) == 0:
                        return
            if self.proc.poll() is not None:
                self.refused = self.proc.returncode
                return
            time.sleep(0.01)
        raise AssertionError("k3cached neither started nor exited: " + self.text())

    def text(self):
        self.log.flush()
        with open(self.logpath) as f:
            return f.read()

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self.log.close()
        return self.proc.returncode


def ctl(*args):
    return subprocess.run([env("K3CACHECTL"), *args], capture_output=True, text=True,
                          timeout=300)


# ---- the store every case starts from ----

def spec():
    with open(os.path.join(env("K3_SHARED_DIR"), "models", "tiny-hybrid.json")) as f:
        return json.load(f)


def conversation(c, n):
    rng = random.Random(1000 + c)
    return [rng.randrange(1, 50000) for _ in range(n)]


def state(sp, c, tokens):
    """Per layer two float32 arrays. MLA row r depends on the conversation and
    r only, so the entries of one conversation share their rows' blocks."""
    p = len(tokens)
    out = []
    for i, l in enumerate(sp["layers"]):
        if l["mixer"] == "kda":
            rng = np.random.default_rng([c, p, i])
            out.append((rng.standard_normal(l["conv_len"], dtype=np.float32),
                        rng.standard_normal(l["recurrent_len"], dtype=np.float32)))
        else:
            rng = np.random.default_rng([c, i])
            k = rng.standard_normal((4000, l["k_row"]), dtype=np.float32)[:p]
            v = rng.standard_normal((4000, l["v_row"]), dtype=np.float32)[:p]
            out.append((k.ravel().copy(), v.ravel().copy()))
    return out


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    """A store of 46 entries: 6 conversations of 5 turns (20 to 3000 tokens,
    sharing MLA blocks, tokens and chunks on overflow pages), 16 short ones,
    half of them salted, and the entries they were made from."""
    work = str(tmp_path_factory.mktemp("golden"))
    db = os.path.join(work, "db")
    d = Daemon(db, work)
    assert d.refused is None, d.text()
    sp = spec()
    entries = []
    with k3cache.Client(d.sock) as c:
        fp = c.put_model(json.dumps(sp))
        for conv in range(6):
            salt = b"" if conv % 2 == 0 else b"tenant-%d" % conv
            for p in (20, 70, 150, 600, 3000):
                toks = conversation(conv, p)
                layers = state(sp, conv, toks)
                res = c.publish(fp, toks, layers, salt=salt)
                entries.append({"key": res, "tokens": toks, "salt": salt, "layers": layers})
        for i in range(16):
            toks = conversation(100 + i, 3 + i * 2)
            layers = state(sp, 100 + i, toks)
            salt = b"s%d" % (i % 2)
            res = c.publish(fp, toks, layers, salt=salt)
            entries.append({"key": res, "tokens": toks, "salt": salt, "layers": layers})
    assert d.stop() == 0
    for e in entries:
        e["key"] = bytes(e["key"]) if not isinstance(e["key"], (bytes, bytearray)) else e["key"]
    return {"db": db, "fp": fp, "entries": entries, "spec": sp}


def keyhex(e):
    k = e["key"]
    return k.hex() if isinstance(k, (bytes, bytearray)) else str(k)


def restored_right(c, fp, e):
    """'ok' when the entry restores byte for byte, 'missing' or 'error' when it
    does not; any other bytes fail the test."""
    try:
        got = c.restore(e["key"], fp)
    except k3cache.Error:
        return "error"
    assert len(got) == len(e["layers"])
    for (a, b), (x, y) in zip(e["layers"], got):
        assert np.asarray(x, np.float32).tobytes() == a.tobytes(), "wrong bytes restored"
        assert np.asarray(y, np.float32).tobytes() == b.tobytes(), "wrong bytes restored"
    return "ok"


def serve_all(d, g, lost=()):
    """Looks up and restores every entry; returns the keys that failed."""
    failed = set()
    with k3cache.Client(d.sock) as c:
        c.put_model(json.dumps(g["spec"]))
        for e in g["entries"]:
            try:
                hit = c.lookup(g["fp"], e["tokens"] + [7], salt=e["salt"])
            except k3cache.Error:
                hit = None
            if hit is not None and hit.prefix_len == len(e["tokens"]):
                assert bytes(hit.key).hex() == keyhex(e), "a lookup found another entry"
            if restored_right(c, g["fp"], e) != "ok":
                failed.add(keyhex(e))
            assert d.alive(), "k3cached died: " + d.text()
    return failed


def still_writable(d, g):
    """New publishes work and restore right; evicting everything works."""
    with k3cache.Client(d.sock) as c:
        c.put_model(json.dumps(g["spec"]))
        for i in range(3):
            toks = conversation(500 + i, 90 + i)
            layers = state(g["spec"], 500 + i, toks)
            key = c.publish(g["fp"], toks, layers, salt=b"after")
            e = {"key": key, "tokens": toks, "salt": b"after", "layers": layers}
            assert restored_right(c, g["fp"], e) == "ok"
    r = ctl("--socket", d.sock, "evict", "--all", "--yes")
    assert r.returncode == 0, r.stderr
    assert d.alive(), "k3cached died: " + d.text()


def named_by_verify(d):
    r = ctl("--socket", d.sock, "--json", "verify")
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    keys = {x["key"] for x in doc["entries"] if x["key"]}
    return keys, len(doc["entries"])


def check(g, mutate, work):
    """Copies the golden store, applies mutate(path of data.mdb), and holds
    the daemon and the tools to the promises above. Returns 'served' or
    'refused'."""
    db = os.path.join(work, "db")
    shutil.copytree(g["db"], db)
    for f in os.listdir(db):
        if f.startswith("running."):
            os.unlink(os.path.join(db, f))
    mutate(os.path.join(db, "data.mdb"))
    damaged = os.path.join(work, "damaged")
    shutil.copytree(db, damaged)  # as it was before the daemon saw it
    d = Daemon(db, work)
    if d.refused is not None:
        text = d.text()
        d.stop()
        assert d.refused == DAMAGED_EXIT, "k3cached exited %d: %s" % (d.refused, text)
        assert "salvage --to NEWDIR" in text, text
        r = ctl("--db", db, "verify")
        assert r.returncode == 1 and "salvage" in r.stderr, r.stdout + r.stderr
        before = open(os.path.join(db, "data.mdb"), "rb").read()
        new = os.path.join(work, "salvaged")
        r = ctl("--db", db, "--json", "salvage", "--to", new)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert open(os.path.join(db, "data.mdb"), "rb").read() == before, "salvage wrote"
        salvaged(g, rep, new, work)
        return "refused"
    failed = serve_all(d, g)
    named, problems = named_by_verify(d)
    unknown = named - {keyhex(e) for e in g["entries"]}
    for k in failed:
        assert k in named or unknown or problems > len(named), \
            "verify does not name damaged entry %s" % k
    still_writable(d, g)
    assert d.stop() == 0, "k3cached did not stop cleanly: " + d.text()
    # and salvage, from the store as it was damaged, saves what verifies
    new = os.path.join(work, "salvaged")
    r = ctl("--db", damaged, "--json", "salvage", "--to", new)
    assert r.returncode == 0, r.stderr
    salvaged(g, json.loads(r.stdout), new, work)
    return "served"


def salvaged(g, rep, new, work):
    """What salvage saved is served byte for byte, and the new store works."""
    assert rep["saved"] + len(rep["lost"]) == rep["entries"]
    s = Daemon(new, work)
    assert s.refused is None, s.text()
    failed = serve_all(s, g)
    assert len(g["entries"]) - len(failed) == rep["saved"]
    still_writable(s, g)
    assert s.stop() == 0, s.text()


def flip(path, off, value=None, xor=None):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)[0]
        f.seek(off)
        f.write(bytes([value if value is not None else b ^ xor]))


@pytest.fixture
def work(tmp_path):
    return str(tmp_path)


# ---- the eight single-byte cases of the review ----

def test_lru_node_data_size(golden, work):
    """A node's data size in the lru database, 0x00 -> 0x8f: LMDB crashed in
    mdb_cursor_del at every start."""
    def m(path):
        s = Store(path)
        n = s.table("lru")[0]
        flip(path, n["node_off"] + 2, value=0x8f)  # mn_hi: the size's high half
    assert check(golden, m, work) == "refused"


def test_meta_root_page(golden, work):
    """The main database's root page number in the live meta page: SIGSEGV."""
    def m(path):
        s = Store(path)
        flip(path, s.main_root_off() + 2, xor=0x01)
    assert check(golden, m, work) == "refused"


def test_meta_root_on_overflow_page(golden, work):
    """The root page number aimed at an overflow page: SIGABRT in mdb_node_add."""
    def m(path):
        s = Store(path)
        ov = s.pages_of_kind(P_OVERFLOW)[0]
        with open(path, "r+b") as f:
            f.seek(s.main_root_off())
            f.write(struct.pack("<Q", ov))
    assert check(golden, m, work) == "refused"


def test_chunk_overflow_page_count(golden, work):
    """A chunk's overflow run claiming three times its pages: freeing it handed
    out pages still in use, and every later publish aborted."""
    def m(path):
        s = Store(path)
        big = [n for n in s.table("chunks") if n["nflags"] & 1]
        off = s.overflow_header(big[-1])
        (pages,) = struct.unpack_from("<I", s.data, off)
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(struct.pack("<I", pages * 3))
    assert check(golden, m, work) == "refused"


def record_of(s, salted):
    for n in s.table("entries"):
        v = s.value_off(n)
        (salt_len,) = struct.unpack_from("<I", s.data, v + 120)
        if (salt_len > 0) == salted:
            return n, v
    raise AssertionError("no such record")


def test_record_fingerprint(golden, work):
    """A record's fingerprint: the entry sat unreachable, verify saw nothing."""
    def m(path):
        s = Store(path)
        _, v = record_of(s, False)
        flip(path, v + 36, xor=0x20)
    assert check(golden, m, work) == "served"


def test_record_salt(golden, work):
    def m(path):
        s = Store(path)
        _, v = record_of(s, True)
        flip(path, v + 124, xor=0x01)
    assert check(golden, m, work) == "served"


def test_tokens_inline(golden, work):
    def m(path):
        s = Store(path)
        n = [n for n in s.table("tokens") if not n["nflags"] & 1][0]
        flip(path, s.value_off(n) + 4, xor=0x10)
    assert check(golden, m, work) == "served"


def test_tokens_on_overflow_pages(golden, work):
    def m(path):
        s = Store(path)
        n = [n for n in s.table("tokens") if n["nflags"] & 1][0]
        flip(path, s.value_off(n) + 4000, xor=0x10)
    assert check(golden, m, work) == "served"


def test_model_spec(golden, work):
    """A byte of the stored model spec: a put of the same spec (which every
    worker makes first) replaces the damaged one, and everything is served."""
    def m(path):
        s = Store(path)
        n = s.table("models")[0]
        flip(path, s.value_off(n) + 40, xor=0x41)
    assert check(golden, m, work) == "served"


# ---- the campaign ----

@pytest.mark.parametrize("seed", range(1, FLIP_RUNS + 1))
def test_random_flips(golden, work, seed):
    """1 to 8 random bytes of the pages in use, each XORed with a random
    nonzero value: half of them in the bytes in use of the meta, branch and
    leaf pages, which hold the structure (most of the file is overflow data,
    which has its own checksums)."""
    def m(path):
        s = Store(path)
        end = min(len(s.data), (s.last_page() + 1) * s.psize)
        tree = [0, 1] + s.pages_of_kind(1) + s.pages_of_kind(2)
        rng = random.Random(seed)
        for _ in range(rng.randint(1, 8)):
            if rng.random() < 0.5:  # a used byte: header, node offsets or nodes
                pg = rng.choice(tree)
                base, _, lower, upper = s.page(pg)
                if pg < 2:
                    lower, upper = 160, s.psize
                used = list(range(lower)) + list(range(upper, s.psize))
                off = base + rng.choice(used)
            else:
                off = rng.randrange(end)
            flip(path, off, xor=rng.randrange(1, 256))
    OUTCOMES.append(check(golden, m, work))


OUTCOMES = []


def test_campaign_reached_both_ways():
    """The campaign is only worth its name if it made the daemon refuse some
    stores and serve others."""
    if len(OUTCOMES) == FLIP_RUNS:
        assert "refused" in OUTCOMES and "served" in OUTCOMES, OUTCOMES
