"""The vLLM-shaped connector sketch (python/examples/vllm_connector.py) over
numpy buffers: turn 1 misses and saves; turn 2, in a new connector, loads
turn 1's state into the engine's buffers and saves a delta. A cache that
stops answering (the daemon restarted, a save refused) is a miss and a save
skipped, with one warning, and the connector goes on when it is back."""
import json
import logging
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import vllm_connector  # noqa: E402


def engine_state(spec, p, seed):
    """The engine's state after p tokens: MLA rows depend on the position
    only, so a longer prompt's state extends a shorter one's."""
    out = []
    for i, l in enumerate(spec["layers"]):
        if l["mixer"] == "kda":
            r = np.random.default_rng(seed * 100 + i)
            out.append((r.standard_normal(l["conv_len"], dtype=np.float32),
                        r.standard_normal(l["recurrent_len"], dtype=np.float32)))
        else:
            r = np.random.default_rng(i)
            k = r.standard_normal((4096, l["k_row"]), dtype=np.float32)[:p].ravel()
            v = r.standard_normal((4096, l["v_row"]), dtype=np.float32)[:p].ravel()
            out.append((k, v))
    return out


def test_two_turns(daemon, twin_path, monkeypatch):
    monkeypatch.setenv("K3CACHE_SOCKET", daemon.sock)
    spec = json.load(open(twin_path))
    names = [f"model.layers.{i}" for i in range(len(spec["layers"]))]

    def buffers(p):
        return [(np.zeros(len(a), np.float32), np.zeros(len(b), np.float32))
                for a, b in engine_state(spec, p, 0)]

    turn1 = vllm_connector.Request("r1", range(9000, 9300))
    c1 = vllm_connector.K3CacheConnector(spec, names, buffers)
    assert c1.get_num_new_matched_tokens(turn1, 0) == (0, False)
    c1.start_load_kv(turn1)
    state1 = engine_state(spec, 300, 1)  # prefilled by the engine
    for n, s in zip(names, state1):
        c1.save_kv_layer(n, s, turn1)
    key1 = c1.wait_for_save()
    c1.close()

    # turn 2: the conversation goes on, in another process
    turn2 = vllm_connector.Request("r2", list(range(9000, 9300)) + list(range(50, 170)))
    c2 = vllm_connector.K3CacheConnector(twin_path, names, buffers)
    assert c2.get_num_new_matched_tokens(turn2, 0) == (300, False)
    assert c2.get_num_new_matched_tokens(turn2, 300) == (0, False)
    c2.get_num_new_matched_tokens(turn2, 16)
    loaded = c2.start_load_kv(turn2)
    for n in names:
        c2.wait_for_layer_load(n)
    for (a, b), (x, y) in zip(state1, loaded):
        assert a.tobytes() == x.tobytes() and b.tobytes() == y.tobytes()
    state2 = engine_state(spec, 420, 2)
    for n, s in zip(names, state2):
        c2.save_kv_layer(n, s, turn2)
    key2 = c2.wait_for_save()
    assert key2 != key1
    assert c2.client.last_publish["delta_rows"] == 300  # only the new rows went
    got = c2.client.restore(key2)
    assert got.prefix_len == 420
    for (a, b), (x, y) in zip(state2, got):
        assert a.tobytes() == x.tobytes() and b.tobytes() == y.tobytes()
    c2.close()


def buffers_for(spec):
    def buffers(p):
        return [(np.zeros(len(a), np.float32), np.zeros(len(b), np.float32))
                for a, b in engine_state(spec, p, 0)]
    return buffers


def save(c, names, state, request):
    for n, s in zip(names, state):
        c.save_kv_layer(n, s, request)
    return c.wait_for_save()


def warnings(caplog):
    return [r for r in caplog.records
            if r.name == "vllm_connector" and r.levelno >= logging.WARNING]


def test_a_cache_outage_is_a_miss_and_the_connector_goes_on(new_daemon, twin_path, caplog):
    d = new_daemon("--max-bytes", "64MiB")
    spec = json.load(open(twin_path))
    names = [f"model.layers.{i}" for i in range(len(spec["layers"]))]
    c = vllm_connector.K3CacheConnector(spec, names, buffers_for(spec), addr=d.sock)
    turn1 = vllm_connector.Request("r1", range(7000, 7200))
    assert c.get_num_new_matched_tokens(turn1, 0) == (0, False)
    c.start_load_kv(turn1)
    key1 = save(c, names, engine_state(spec, 200, 1), turn1)
    assert key1 and not warnings(caplog)

    d.halt()  # the daemon restarts (SIGTERM, then the same store and socket)
    turn2 = vllm_connector.Request("r2", list(range(7000, 7200)) + list(range(10, 60)))
    for _ in range(3):  # the lost connection, then connects that fail: misses
        assert c.get_num_new_matched_tokens(turn2, 0) == (0, False)
    assert c.start_load_kv(turn2) is None  # nothing to load: the engine recomputes
    assert save(c, names, engine_state(spec, 250, 2), turn2) is None  # not saved, no crash
    w = warnings(caplog)
    assert len(w) == 1  # one per outage
    assert d.sock in w[0].getMessage()

    d.start()
    turn3 = vllm_connector.Request("r3", list(range(7000, 7200)) + list(range(10, 80)))
    assert c.get_num_new_matched_tokens(turn3, 0) == (200, False)  # turn 1's, kept
    loaded = c.start_load_kv(turn3)
    for n in names:
        c.wait_for_layer_load(n)
    for (a, b), (x, y) in zip(engine_state(spec, 200, 1), loaded):
        assert a.tobytes() == x.tobytes() and b.tobytes() == y.tobytes()
    key3 = save(c, names, engine_state(spec, 270, 3), turn3)
    assert key3 not in (None, key1)
    assert c.client.last_publish["delta_rows"] == 200
    assert len(warnings(caplog)) == 1

    d.halt()  # another outage: another warning
    assert c.get_num_new_matched_tokens(turn3, 0) == (0, False)
    assert len(warnings(caplog)) == 2
    d.start()
    assert c.get_num_new_matched_tokens(turn3, 0) == (200, False)
    c.close()


def test_a_daemon_started_on_an_empty_store_is_given_the_model_again(new_daemon, twin_path,
                                                                      caplog):
    """A daemon that comes back on an empty store (a host replaced, a store
    wiped) knows no model: the connector puts it again and saves. Before,
    every save after was refused UNKNOWN_MODEL, warned once, then skipped for
    good at debug level."""
    import shutil
    d = new_daemon("--max-bytes", "64MiB")
    spec = json.load(open(twin_path))
    names = [f"model.layers.{i}" for i in range(len(spec["layers"]))]
    c = vllm_connector.K3CacheConnector(spec, names, buffers_for(spec), addr=d.sock)
    turn1 = vllm_connector.Request("r1", range(8000, 8200))
    c.start_load_kv(turn1)
    assert save(c, names, engine_state(spec, 200, 1), turn1)
    d.halt()
    shutil.rmtree(os.path.join(d.dir, "db"))
    d.start()
    turn2 = vllm_connector.Request("r2", list(range(8000, 8200)) + list(range(10, 60)))
    assert c.get_num_new_matched_tokens(turn2, 0) == (0, False)  # the store is empty
    c.start_load_kv(turn2)
    key2 = save(c, names, engine_state(spec, 250, 2), turn2)
    assert key2 is not None
    turn3 = vllm_connector.Request("r3", list(range(8000, 8200)) + list(range(10, 80)))
    assert c.get_num_new_matched_tokens(turn3, 0) == (250, False)
    c.close()


def test_a_save_refused_too_large_does_not_stop_the_engine(new_daemon, twin_path, caplog):
    d = new_daemon("--max-bytes", "1MiB")  # a 2000-token state is 20 MB
    spec = json.load(open(twin_path))
    names = [f"model.layers.{i}" for i in range(len(spec["layers"]))]
    c = vllm_connector.K3CacheConnector(twin_path, names, buffers_for(spec), addr=d.sock)
    long = vllm_connector.Request("long", range(2000))
    assert c.get_num_new_matched_tokens(long, 0) == (0, False)
    c.start_load_kv(long)
    assert save(c, names, engine_state(spec, 2000, 1), long) is None
    w = warnings(caplog)
    assert len(w) == 1 and "TOO_LARGE" in w[0].getMessage()
    # the connection the refusal closed is made again by the next call
    short = vllm_connector.Request("short", range(5000, 5020))
    assert c.get_num_new_matched_tokens(short, 0) == (0, False)
    c.start_load_kv(short)
    key = save(c, names, engine_state(spec, 20, 2), short)
    assert key is not None
    more = vllm_connector.Request("more", list(range(5000, 5020)) + [1, 2, 3])
    assert c.get_num_new_matched_tokens(more, 0) == (20, False)
    assert len(warnings(caplog)) == 1
    c.close()


def test_an_engine_starts_while_the_daemon_is_down(new_daemon, twin_path, caplog):
    """The daemon is down when the engine starts: the connector is made all
    the same (before, its constructor connected and put the model, and raised
    into the engine), serves misses and skips saves with one warning, and
    uses the cache (the model put then) once the daemon is up."""
    d = new_daemon("--max-bytes", "64MiB")
    d.halt()
    spec = json.load(open(twin_path))
    names = [f"model.layers.{i}" for i in range(len(spec["layers"]))]
    c = vllm_connector.K3CacheConnector(spec, names, buffers_for(spec), addr=d.sock)
    turn1 = vllm_connector.Request("r1", range(6000, 6200))
    for _ in range(3):
        assert c.get_num_new_matched_tokens(turn1, 0) == (0, False)
    assert c.start_load_kv(turn1) is None
    assert save(c, names, engine_state(spec, 200, 1), turn1) is None
    w = warnings(caplog)
    assert len(w) == 1  # one for the outage, not one per call
    assert d.sock in w[0].getMessage()

    d.start()  # on an empty store: it knows no model until the connector puts it
    assert c.get_num_new_matched_tokens(turn1, 0) == (0, False)
    c.start_load_kv(turn1)
    key1 = save(c, names, engine_state(spec, 200, 1), turn1)
    assert key1 is not None
    turn2 = vllm_connector.Request("r2", list(range(6000, 6200)) + list(range(10, 60)))
    assert c.get_num_new_matched_tokens(turn2, 0) == (200, False)
    loaded = c.start_load_kv(turn2)
    for n in names:
        c.wait_for_layer_load(n)
    for (a, b), (x, y) in zip(engine_state(spec, 200, 1), loaded):
        assert a.tobytes() == x.tobytes() and b.tobytes() == y.tobytes()
    assert len(warnings(caplog)) == 1
    c.close()
