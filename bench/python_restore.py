#!/usr/bin/env python3
"""bench/python_restore: the Python client's restore_into of a K3-shape
snapshot (69 KDA x 6.5625 MiB + 24 MLA at 4,096 tokens, ~669 MiB) into numpy
arrays, against the C client's k3cache_restore_into of the same entry into
blob buffers and its k3cache_restore_arrays into the same arrays, in the same
process and run, the three in turn (BENCH_ROUNDS, default 9); the ratios are
medians over paired rounds.

usage: bench/python_restore.py BUILD_DIR [--quick]
(uses BUILD_DIR/daemon/k3cached and BUILD_DIR/client/libk3cache.so.0)
"""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time

build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
quick = "--quick" in sys.argv
os.environ.setdefault("K3CACHE_LIBRARY", os.path.join(build, "client", "libk3cache.so.0"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import numpy as np  # noqa: E402

import k3cache  # noqa: E402
from k3cache import _lib  # noqa: E402

P = 4096
N_KDA, N_MLA = (9, 3) if quick else (69, 24)
layers = []
kda = mla = 0
for i in range(N_KDA + N_MLA):  # as bench/k3shape.h: the MLA last in each block of four
    if (i % 4 == 3 and mla < N_MLA) or kda == N_KDA:
        layers.append({"mixer": "mla", "k_row": 512, "v_row": 64})
        mla += 1
    else:
        layers.append({"mixer": "kda", "conv_len": 147456, "recurrent_len": 1572864})
        kda += 1
spec = {"name": "k3-pybench", "revision": "bench", "state_layout": "bench", "layers": layers}

tmp = tempfile.mkdtemp(prefix="k3pybench-")
sock = os.path.join(tmp, "s.sock")
daemon = subprocess.Popen([os.path.join(build, "daemon", "k3cached"), "--db",
                           os.path.join(tmp, "db"), "--socket", sock, "--max-bytes", "4GiB"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(500):
        if os.path.exists(sock):
            break
        time.sleep(0.01)
    c = k3cache.Client(sock)
    fp = c.put_model(spec)
    rng = np.random.default_rng(1)

    def arrays():
        out = []
        for l in layers:
            if l["mixer"] == "kda":
                out.append((l["conv_len"], l["recurrent_len"]))
            else:
                out.append((P * l["k_row"], P * l["v_row"]))
        return out

    state = [(rng.standard_normal(a, dtype=np.float32), rng.standard_normal(b, dtype=np.float32))
             for a, b in arrays()]
    total = sum(a.nbytes + b.nbytes for a, b in state)
    key = c.publish(fp, list(range(1, P + 1)), state)
    # the Python side's destination: numpy arrays, pre-touched
    dst = [(np.ones(a, np.float32), np.ones(b, np.float32)) for a, b in arrays()]
    # the C client's: one blob buffer per layer, pre-touched, through ctypes
    m = c._model(fp)
    n = len(layers)
    sizes = [5 + 4 * a + 4 + 4 * b if l["mixer"] == "kda" else 9 + 4 * a + 4 + 4 * b
             for l, (a, b) in zip(layers, arrays())]
    blobs = [np.ones(s, np.uint8) for s in sizes]
    bufs = (ctypes.c_void_p * n)(*[b.ctypes.data for b in blobs])
    caps = (ctypes.c_size_t * n)(*sizes)
    lens = (ctypes.c_size_t * n)()
    restore_into = _lib.lib.k3cache_restore_into
    restore_into.restype = ctypes.c_int
    restore_into.argtypes = [ctypes.c_void_p, ctypes.c_void_p, _lib.u8p, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_void_p, _lib.u32p, _lib.errp]
    kb = (ctypes.c_uint8 * 32).from_buffer_copy(key)
    # the call Python's restore_into makes, from C: the same arrays
    out = (_lib.arrays_out_t * n)()
    for i, (x, y) in enumerate(dst):
        out[i] = _lib.arrays_out_t(x.ctypes.data, x.size, y.ctypes.data, y.size)
    names = ("C client k3cache_restore_into (blobs)", "Python Client.restore_into (numpy arrays)",
             "C client k3cache_restore_arrays (same arrays)")
    times, cpu = ([], [], []), ([], [], [])
    n_rounds = int(os.environ.get("BENCH_ROUNDS", "9"))
    for r in range(n_rounds):
        for side in ((0, 1, 2), (1, 2, 0), (2, 0, 1))[r % 3]:
            # touch the destination first, untimed: this VM takes back memory
            # left idle (kdamond), and the restore would pay the faults
            for arr in (blobs if side == 0 else [x for pair in dst for x in pair]):
                arr.fill(1)
            p, err = ctypes.c_uint32(), _lib.error_t()
            c0, t0 = time.process_time(), time.perf_counter()
            if side == 0:
                rc = restore_into(c._conn(), m.handle, kb, bufs, caps, lens, ctypes.byref(p),
                                  ctypes.byref(err))
            elif side == 1:
                rc = 0 if c.restore_into(key, dst) == P else 1
            else:
                rc = _lib.restore_arrays(c._conn(), m.handle, kb, out, n, ctypes.byref(p),
                                         ctypes.byref(err))
            times[side].append(time.perf_counter() - t0)
            cpu[side].append(time.process_time() - c0)
            if rc != 0:
                sys.exit(f"{names[side]}: " + err.message.decode())
    for (a, b), (x, y) in zip(state, dst):
        if a.tobytes() != x.tobytes() or b.tobytes() != y.tobytes():
            sys.exit("restore_into: the arrays differ from what was published")
    c.close()
    gb = total / 1e9

    def median(v):
        v = sorted(v)
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    print(f"bench/python_restore{' (quick)' if quick else ''}: {n} layers, "
          f"{total / 1048576:.1f} MiB, {n_rounds} rounds, the three in turn")
    for side in range(3):
        best = min(times[side])
        print(f"{names[side]:<46} best {best * 1e3:7.1f} ms {gb / best:5.2f} GB/s; median "
              f"{median(times[side]) * 1e3:7.1f} ms")
        print("  rounds, ms: " + " ".join(f"{x * 1e3:.0f}" for x in times[side]) +
              f"; this process's CPU, median {median(cpu[side]) * 1e3:.0f} ms")
    # This VM's rounds swing 3-4x from one second to the next, so the ratios
    # are medians over rounds of each pair measured next to each other
    for base in (0, 2):
        ratio = median([b / py for b, py in zip(times[base], times[1])])
        print(f"Python restore_into vs {names[base]}: {ratio:.2f}x (median of "
              f"{n_rounds} paired rounds; best of each: {min(times[base]) / min(times[1]):.2f}x)")
    ratio = median([b / py for b, py in zip(times[0], times[1])])
    print(f"target: Python restore_into >= 0.9x the C client: "
          f"{'met' if ratio >= 0.9 else 'NOT met'} ({ratio:.2f}x)")
finally:
    daemon.terminate()
    daemon.wait(30)
    shutil.rmtree(tmp, ignore_errors=True)
