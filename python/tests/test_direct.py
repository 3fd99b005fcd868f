"""k3cache.Direct: restores from the store's own file (libk3cache-direct.so.0)
give what the daemon gives, with the same checks and errors."""
import os

import numpy as np
import pytest

import k3cache
from test_client import empty_like, model_of, same, stat, state, tokens


def test_direct_restores_what_the_daemon_stored(daemon, twin_path):
    spec = model_of(twin_path)
    db = os.path.join(daemon.dir, "db")
    with k3cache.Client(daemon.sock) as c, k3cache.Direct(db, daemon.sock) as d:
        fp = c.put_model(twin_path)
        assert d.add_model(spec) == fp
        t = tokens(300, 77000)
        s = state(spec, 300, 5)
        key = c.publish(fp, t, s)
        r = d.lookup(fp, t + [1])
        assert (r.prefix_len, r.key) == (300, key)
        assert d.lookup(fp, t + [1], salt=b"other").key is None
        out = d.empty_layers(r.prefix_len)
        assert d.restore_into(key, out) == 300
        same(s, out)
        # the daemon's restore of the same entry: the same floats
        same(c.restore(key), out)
        uses = stat(daemon)["reported_uses"]
    # the restore reached the daemon as a use when the reader closed
    assert stat(daemon)["reported_uses"] == uses + 1


def test_direct_refuses_what_the_client_refuses(daemon, twin_path):
    spec = model_of(twin_path)
    db = os.path.join(daemon.dir, "db")
    with k3cache.Client(daemon.sock) as c, k3cache.Direct(db, daemon.sock) as d:
        fp = c.put_model(spec)
        key = c.publish(fp, tokens(60, 88000), state(spec, 60, 6))
        with pytest.raises(k3cache.UnknownModelError, match="add_model"):
            d.restore_into(key, empty_like(state(spec, 60, 6)))
        d.add_model(spec)
        short = empty_like(state(spec, 60, 6))
        short[0] = (short[0][0][:-1], short[0][1])  # one float short: refused, nothing read
        with pytest.raises(k3cache.InvalidError, match="layer 0"):
            d.restore_into(key, short)
        wrong = empty_like(state(spec, 60, 6))
        wrong[1] = (wrong[1][0].astype(np.float64), wrong[1][1])
        with pytest.raises(k3cache.InvalidError, match="layer 1"):
            d.restore_into(key, wrong)
        with pytest.raises(k3cache.NotFoundError):
            d.restore_into(bytes(32), empty_like(state(spec, 60, 6)))
    d.close()  # closing twice is harmless
    with pytest.raises(k3cache.InvalidError, match="closed"):
        d.lookup(fp, tokens(61, 88000))
    with pytest.raises(k3cache.InvalidError, match="the Direct reader is closed"):
        d.restore_into(key, empty_like(state(spec, 60, 6)))


def test_direct_open_errors(daemon, tmp_path):
    with pytest.raises(k3cache.Error) as e:
        k3cache.Direct(str(tmp_path / "no-store"), daemon.sock)
    assert "no-store" in str(e.value)
    with pytest.raises(k3cache.Error) as e:
        k3cache.Direct(os.path.join(daemon.dir, "db"), "unix:" + str(tmp_path / "none.sock"))
    assert e.value.unreachable
