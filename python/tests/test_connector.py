"""The vLLM-shaped connector sketch (python/examples/vllm_connector.py) over
numpy buffers: turn 1 misses and saves; turn 2, in a new connector, loads
turn 1's state into the engine's buffers and saves a delta."""
import json
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
