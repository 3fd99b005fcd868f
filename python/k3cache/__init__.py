"""k3cache: the Python client of k3cached, over libk3cache.so.0 (ctypes).

    import k3cache
    with k3cache.Client() as c:                 # K3CACHE_SOCKET, else the default socket
        fp = c.put_model("shared/models/kimi-k3-0.40b-twin.json")
        r = c.lookup(fp, tokens)                 # r.prefix_len, r.key (None on a miss), r.hint
        key = c.publish(fp, tokens, layers)      # per layer (conv, recurrent) or (k, v)
        n = c.restore_into(key, layers)          # into float32 buffers, in place; returns P
        layers = c.restore(key)                  # numpy arrays (array('f') without numpy)

Every restore is validated by the library before it returns (tag, shape,
seq_len, finite values, the layer's XXH3): on an error the buffers' contents
are undefined and must not be used. Calls release the GIL; a Client is used
from one thread at a time. A call that loses the connection raises (with
.unreachable) and the next one connects again (see Client).
"""
import array
import collections
import ctypes
import functools
import json
import operator
import os

from . import _lib
from ._buffers import Held

__all__ = [
    "Client", "Direct", "LookupResult", "Error", "NotFoundError", "InvalidError", "CorruptError",
    "UnknownModelError", "TooLargeError", "BusyError", "FullError", "UnsupportedError",
    "InternalError", "ERRORS",
]


class Error(Exception):
    """A failure: .code is the protocol code's name ("NOT_FOUND", "CORRUPT",
    ...), .message what happened, .unreachable whether the daemon could not be
    reached or went away."""

    code = "INTERNAL"

    def __init__(self, message, code=None, unreachable=False):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.unreachable = unreachable

    def __str__(self):
        return f"{self.code}: {self.message}"


def _code_error(name, code, doc, *bases):
    return type(name, (Error, *bases), {"code": code, "__doc__": doc,
                                         "__module__": __name__})


# one subclass per protocol code (enum k3cache_code)
NotFoundError = _code_error("NotFoundError", "NOT_FOUND", "No such entry (or a miss).")
InvalidError = _code_error("InvalidError", "INVALID",
                           "Bad input, refused before anything was stored.", ValueError)
CorruptError = _code_error("CorruptError", "CORRUPT", "Bytes failed their checksum.")
UnknownModelError = _code_error("UnknownModelError", "UNKNOWN_MODEL",
                                "The model's spec is not stored (put_model first).")
TooLargeError = _code_error("TooLargeError", "TOO_LARGE", "Over a size limit.")
BusyError = _code_error("BusyError", "BUSY", "The daemon is busy: retry shortly.")
FullError = _code_error("FullError", "FULL", "The store is full.")
UnsupportedError = _code_error("UnsupportedError", "UNSUPPORTED", "Not supported.")
InternalError = _code_error("InternalError", "INTERNAL",
                            "An I/O or internal failure (see .unreachable).")
DeniedError = _code_error("DeniedError", "DENIED",
                          "Not allowed for this client (its uid, or its token): not its "
                          "entry, or an admin operation.", PermissionError)

# the protocol's codes (enum k3cache_code), by name
ERRORS = {cls.code: cls for cls in (NotFoundError, InvalidError, CorruptError,
                                     UnknownModelError, TooLargeError, BusyError, FullError,
                                     UnsupportedError, InternalError, DeniedError)}


def _error(err):
    name = _lib.code_name(err.code).decode()
    cls = ERRORS.get(name, Error)
    return cls(err.message.decode(errors="replace"), code=name,
               unreachable=bool(err.unreachable))


def _check(rc, err):
    if rc != 0:
        raise _error(err)


class LookupResult:
    """prefix_len: P, 0 on a miss; key: the entry's 32 bytes, None on a miss;
    hint: where to snapshot so that the next prompt hits; bytes: the entry's
    size."""

    __slots__ = ("prefix_len", "key", "hint", "bytes")

    def __init__(self, prefix_len, key, hint, nbytes):
        self.prefix_len, self.key, self.hint, self.bytes = prefix_len, key, hint, nbytes

    def __repr__(self):
        key = self.key.hex()[:16] + "..." if self.key else None
        return f"LookupResult(prefix_len={self.prefix_len}, key={key}, hint={self.hint})"


class Restored(list):
    """restore()'s layers, a (a, b) pair each; .prefix_len is P."""

    prefix_len = 0


def _tokens(tokens):
    if isinstance(tokens, array.array) and tokens.typecode == "I" and tokens.itemsize == 4:
        t = tokens
    else:
        try:
            t = array.array("I", tokens)
        except (TypeError, OverflowError, ValueError) as e:
            raise InvalidError(f"tokens: whole numbers from 0 to 2^32-1 ({e})") from None
    addr, n = t.buffer_info()
    return t, ctypes.cast(addr, _lib.u32p), n


def _salt(salt):
    if isinstance(salt, str):
        salt = salt.encode()
    return bytes(salt or b"")


def _key(key, what="key"):
    if not isinstance(key, (bytes, bytearray)) or len(key) != _lib.KEY_LEN:
        raise InvalidError(f"{what}: an entry key is {_lib.KEY_LEN} bytes")
    return (ctypes.c_uint8 * _lib.KEY_LEN).from_buffer_copy(key)


def _address(floats):
    """The address of a float array made by _new_floats()."""
    if isinstance(floats, array.array):
        return floats.buffer_info()[0]
    return floats.ctypes.data


def _new_floats(n):
    try:
        import numpy
        return numpy.empty(n, dtype=numpy.float32)
    except ImportError:
        return array.array("f", bytes(4 * n))


class _Model:
    def __init__(self, handle):
        self.handle = handle
        self.fp = ctypes.string_at(_lib.model_fingerprint(handle), _lib.FP_LEN)
        self.layers = []
        for i in range(_lib.model_layers(handle)):
            l = _lib.layer_t()
            _lib.model_layer(handle, i, ctypes.byref(l))
            self.layers.append((l.mixer, l.conv_len, l.recurrent_len, l.k_row, l.v_row))

    def shape(self, i, p):
        """Floats of layer i's two arrays at P (p None: MLA rows per token)."""
        mixer, conv, rec, k, v = self.layers[i]
        if mixer == _lib.MIXER_KDA:
            return conv, rec
        return (k, v) if p is None else (p * k, p * v)


class _Handle:
    """What Client and Direct share: close() (also at exit of a with block,
    and when collected) releases the library's handle and the models."""

    _models = {}

    def close(self):
        self._release()
        for m in self._models.values():
            _lib.model_free(m.handle)
        self._models = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def empty_layers(self, p, fp=None):
        """New float32 arrays (numpy.empty when importable, else zeroed
        array('f')) shaped for restore_into at prefix length p (a lookup's
        prefix_len): per layer a (conv, recurrent) pair of the model's KDA
        sizes, or a (k, v) pair of p x k_row and p x v_row floats."""
        m = self._model(fp)
        try:
            n = operator.index(p) if not isinstance(p, bool) else -1
        except TypeError:
            n = -1
        if n < 0 or n >= 1 << 32:
            raise InvalidError(f"empty_layers: p is a prefix length, 0 to 2^32-1, not {p!r}")
        p = n
        return [tuple(_new_floats(n) for n in m.shape(i, p)) for i in range(len(m.layers))]

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown, or a failed __init__
            pass


# Keys whose P (from a lookup or a publish) a Client or Direct reader keeps
# for the early size check of a restore by key: the most recent this many.
# A key forgotten is restored as well, checked by the library.
_RECENT_KEYS = 4096


class _Recent(collections.OrderedDict):
    """key -> P of the last _RECENT_KEYS keys set, so that a long-running
    worker does not keep every key it ever saw."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > _RECENT_KEYS:
            self.popitem(last=False)


def _marks_lost(method):
    """A Client's call that notes a lost connection: an error with
    .unreachable set (the library closed the connection) makes the next
    call connect again. The error is raised as it is; nothing is retried."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Error as e:
            if e.unreachable:
                self._lost = True
            raise
    return call


class Client(_Handle):
    """A connection to k3cached. addr: "unix:PATH", "tcp:HOST:PORT" or a
    socket path; None: $K3CACHE_SOCKET, then the default socket (resolved
    once, here: the address .addr says). timeout_ms: for each wait on the
    socket, the connect included, not for a whole call
    (k3cache_connect_timeout); None: 60000; 0: none.

    A Client lives longer than a connection. When a call fails with
    .unreachable set (the daemon stopped or restarted, a timeout, a publish
    refused TOO_LARGE before it was all sent), the library has closed the
    connection: that call raises, and is not sent again (a publish or
    restore is never retried behind the caller's back). The next call
    connects again to the same address, with the same timeout, as this
    constructor did (a new connection asks the daemon's namespace anew, and
    sends $K3CACHE_TOKEN on TCP), then makes its request. If that connect
    fails, the call raises the library's error (unreachable, "cannot
    connect to ADDR: ..."), and the call after it tries again. Models put
    stay known to the Client, and to the daemon in its store (one started
    on an empty store refuses a publish UNKNOWN_MODEL until put_model
    again). A connect waits at most timeout_ms too (a TCP host that has gone
    silent costs that much per call)."""

    def __init__(self, addr=None, timeout_ms=None):
        self._c = ctypes.c_void_p()
        self._models = {}
        self._p = _Recent()  # key -> P, from lookups and publishes, for early size checks
        self._lost = False  # a call lost the connection: the next connects again
        if addr is None:
            buf = ctypes.create_string_buffer(4096)
            addr = _lib.default_socket(buf, len(buf))
        self._addr = os.fsencode(addr)
        self._timeout_ms = None if timeout_ms is None else int(timeout_ms)
        self._c = self._connect()

    @property
    def addr(self):
        """The address this Client connects (and connects again) to."""
        return os.fsdecode(self._addr)

    # ---- lifetime ----
    def _connect(self):
        """A new connection, set up as every connection of this Client is."""
        c, err = ctypes.c_void_p(), _lib.error_t()
        if self._timeout_ms is None:
            rc = _lib.connect(self._addr, ctypes.byref(c), ctypes.byref(err))
        else:
            rc = _lib.connect_timeout(self._addr, self._timeout_ms, ctypes.byref(c),
                                      ctypes.byref(err))
        _check(rc, err)
        return c

    def _release(self):
        if self._c:
            _lib.close(self._c)
            self._c = ctypes.c_void_p()

    def _open(self):
        if not self._c:
            raise InvalidError("the Client is closed")

    def _conn(self):
        """The connection for a call: a new one when the last was lost."""
        self._open()
        if self._lost:
            c = self._connect()  # raises, still lost: the next call tries again
            _lib.close(self._c)
            self._c, self._lost = c, False
        return self._c

    # ---- models ----
    @_marks_lost
    def put_model(self, spec):
        """Stores a model spec on the daemon (idempotent) and returns its
        32-byte fingerprint. spec: a dict in shared/models' JSON form, JSON
        text, or a path to such a file."""
        m = _load_model(spec, "put_model")
        err = _lib.error_t()
        rc = _lib.put_model(self._conn(), m.handle, None, ctypes.byref(err))
        if rc != 0:
            _lib.model_free(m.handle)
            raise _error(err)
        return _keep_model(self._models, m)

    def _model(self, fp):
        self._open()  # closed: say so (close let the models go)
        return _find_model(self._models, fp, "Client", "put_model")

    # ---- lookup ----
    @_marks_lost
    def lookup(self, fp, tokens, salt=b"", limit=None):
        """The longest stored prefix of tokens with P <= limit (None: N-1).
        A model the daemon does not know is a miss like any other."""
        return _lookup(_lib.lookup, self._conn(), self._p, fp, tokens, salt, limit)

    # ---- publish ----
    @_marks_lost
    def publish(self, fp, tokens, layers, salt=b"", base_key=None, base_rows=0):
        """Publishes the state after tokens: layers[i] is a (conv, recurrent)
        or (k, v) pair of float32 buffers, sent as they are. With base_key
        (the entry this state was restored from) and base_rows (its P), only
        the new MLA rows are sent. Returns the entry's key; self.last_publish
        then says whether it was created (or stored already), its bytes, the
        entries evicted for it and delta_rows (0: the whole state was sent,
        as when the daemon refused the base)."""
        m = self._model(fp)
        keep, tp, n = _tokens(tokens)
        s = _salt(salt)
        if len(layers) != len(m.layers):
            raise InvalidError(f"publish: {len(layers)} layers given, the model has "
                               f"{len(m.layers)}")
        arr = (_lib.arrays_t * len(layers))()
        with Held() as held:
            for i, got in enumerate(_hold_layers(held, m, layers, False)):
                want = m.shape(i, n)
                for j in range(2):
                    if got[j][1] != want[j]:
                        raise InvalidError(f"layer {i}: {_names(m, i)[j]} has {got[j][1]} "
                                           f"floats, the model's layer at P={n} has "
                                           f"{want[j]}")
                arr[i] = _lib.arrays_t(got[0][0], got[0][1], got[1][0], got[1][1])
            base = _key(base_key, "base_key") if base_key is not None else None
            res, err = _lib.publish_result_t(), _lib.error_t()
            _check(_lib.publish_arrays(self._conn(), m.handle, s, len(s), tp, n, arr,
                                       len(layers), base, int(base_rows), ctypes.byref(res),
                                       ctypes.byref(err)), err)
        key = bytes(res.key)
        self._p[key] = n
        self.last_publish = {"created": bool(res.created), "bytes": res.bytes,
                             "evicted": res.evicted, "delta_rows": res.delta_rows}
        return key

    # ---- restore ----
    @_marks_lost
    def restore_into(self, key, layers, fp=None):
        """Fills the caller's float32 buffers in place: layers[i] is a
        (conv, recurrent) or (k, v) pair. A KDA layer's two are exactly the
        model's sizes; an MLA layer's hold whole rows (k_row and v_row
        floats), at least the entry's P of them and the same number in k, v
        and every MLA layer, so an engine's buffers for its longest context
        do (the first P rows are written). empty_layers(P) makes such
        buffers. Sizes are checked before anything is sent. Returns P. On an
        error their contents must not be used."""
        return _restore_arrays(_lib.restore_arrays, self._conn(), self._model(fp), key, layers,
                               self._p.get(bytes(key)) if isinstance(key, bytes) else None)

    @_marks_lost
    def restore(self, key, fp=None):
        """The entry's layers in new one-dimensional float32 arrays (numpy
        when importable, else array('f')): a list of (a, b) pairs with
        .prefix_len P. An MLA layer's k holds P x k_row floats, row after
        row (reshape(P, k_row) for the rows)."""
        m = self._model(fp)
        kb = _key(key)
        got = Restored()
        failure = []

        def take(index, blob, length, ctx):
            try:
                mixer = m.layers[index][0]
                head = 5 if mixer == _lib.MIXER_KDA else 9
                raw = ctypes.string_at(blob, min(length, 16))
                if mixer == _lib.MIXER_MLA:
                    got.prefix_len = int.from_bytes(raw[1:5], "little")
                n0 = int.from_bytes(raw[head - 4:head], "little")
                n1 = (length - head - 4 * n0 - 4) // 4
                a, b = _new_floats(n0), _new_floats(n1)
                for dst, off, cnt in ((a, head, n0), (b, head + 4 * n0 + 4, n1)):
                    if cnt:
                        ctypes.memmove(_address(dst), blob + off, 4 * cnt)
                got.append((a, b))
                return 0
            except Exception as e:  # reported after the call
                failure.append(e)
                return 1

        cb = _lib.LAYER_FN(take)
        p, err = ctypes.c_uint32(0), _lib.error_t()
        rc = _lib.restore_each(self._conn(), m.handle, kb, cb, None, ctypes.byref(p),
                               ctypes.byref(err))
        if rc and err.unreachable:
            self._lost = True  # whichever error is raised
        if failure:
            raise failure[0]
        _check(rc, err)
        known = self._p.get(bytes(kb))
        if known is not None and p.value != known:
            raise InvalidError(f"restore: the entry restored has P={p.value}, this key's "
                               f"lookup or publish said P={known}")
        got.prefix_len = p.value
        return got


def _load_model(spec, what):
    """A model handle of libk3cache from spec: a dict in shared/models' JSON
    form, JSON text, or a path to such a file."""
    err = _lib.error_t()
    if isinstance(spec, dict):
        spec = json.dumps(spec)
    if isinstance(spec, (str, bytes)) and spec.lstrip()[:1] in ("{", b"{"):
        text = spec.encode() if isinstance(spec, str) else spec
        h = _lib.model_parse(text, len(text), ctypes.byref(err))
    elif isinstance(spec, (str, bytes, os.PathLike)):
        h = _lib.model_load(os.fsencode(spec), ctypes.byref(err))
    else:
        raise InvalidError(f"{what}: spec is a dict, JSON text or a file path, "
                           f"not a {type(spec).__name__}")
    if not h:
        raise _error(err)
    return _Model(h)


def _keep_model(models, m):
    """Keeps m in models under its fingerprint (freed if known already)."""
    if m.fp in models:
        _lib.model_free(m.handle)
    else:
        models[m.fp] = m
    return m.fp


def _find_model(models, fp, who, how):
    if fp is None:
        if len(models) == 1:
            return next(iter(models.values()))
        if not models:
            raise UnknownModelError(f"no model is known to this {who}: call {how}(spec) first")
        raise InvalidError(f"{len(models)} models are known to this {who}: name one with fp=")
    m = models.get(bytes(fp))
    if m is None:
        raise UnknownModelError("model %s... is not known to this %s: call %s(spec) first"
                                % (bytes(fp).hex()[:16], who, how))
    return m


def _lookup(call, handle, known, fp, tokens, salt, limit):
    """A lookup through call (the daemon's or the store's), the key's P kept
    in known for later size checks."""
    if not isinstance(fp, (bytes, bytearray)) or len(fp) != _lib.FP_LEN:
        raise InvalidError(f"fp: a model fingerprint is {_lib.FP_LEN} bytes")
    keep, tp, n = _tokens(tokens)
    s = _salt(salt)
    if limit is not None and not 0 < limit < 2**32:
        raise InvalidError(f"limit: None (the prompt's length - 1) or 1 to 2^32-1, "
                           f"not {limit}")
    res, err = _lib.lookup_result_t(), _lib.error_t()
    fpb = (ctypes.c_uint8 * _lib.FP_LEN).from_buffer_copy(fp)
    _check(call(handle, fpb, s, len(s), tp, n, int(limit or 0), ctypes.byref(res),
                ctypes.byref(err)), err)
    key = bytes(res.key) if res.prefix_len else None
    if key:
        known[key] = res.prefix_len
    return LookupResult(res.prefix_len, key, res.hint, res.bytes)


def _restore_arrays(call, handle, m, key, layers, known):
    """A restore into the caller's (a, b) float32 pairs through call (the
    daemon's or the store's), the sizes checked before it is made."""
    kb = _key(key)
    if len(layers) != len(m.layers):
        raise InvalidError(f"restore_into: {len(layers)} layers given, the model has "
                           f"{len(m.layers)}")
    out = (_lib.arrays_out_t * len(layers))()
    rows = None
    with Held() as held:
        for i, got in enumerate(_hold_layers(held, m, layers, True)):
            out[i] = _lib.arrays_out_t(got[0][0], got[0][1], got[1][0], got[1][1])
            rows = _check_sizes(m, i, m.shape(i, None), [got[0][1], got[1][1]], rows, known)
        p, err = ctypes.c_uint32(0), _lib.error_t()
        _check(call(handle, m.handle, kb, out, len(layers), ctypes.byref(p),
                    ctypes.byref(err)), err)
    if known is not None and p.value != known:
        # the key binds its P: another P is another entry's state
        raise InvalidError(f"restore_into: the entry restored has P={p.value}, this key's "
                           f"lookup or publish said P={known}; the buffers must not be used")
    return p.value


class Direct(_Handle):
    """Direct reads of the store in directory path by a worker on the
    daemon's host (libk3cache-direct.so.0): lookups and restores run in this
    process from the store's file, with the daemon's rules and every check
    of a restore. addr is the daemon serving the store (as for Client), asked
    once for this process's namespace; uses and damage are reported to it.

    Calls release the GIL; a Direct reader is used from one thread at a
    time, and the arrays of one restore must not overlap (layers of a large
    entry are copied and checked on several threads at once).

    Direct reads mean trust with the whole store: whoever may write its
    lock.mdb can read every entry of every tenant.

        with k3cache.Direct("/var/lib/k3cache") as d:
            fp = d.add_model(spec)
            r = d.lookup(fp, tokens)
            n = d.restore_into(r.key, layers)
    """

    def __init__(self, path, addr=None):
        self._lib = _lib.direct()
        self._d = ctypes.c_void_p()
        self._models = {}
        self._p = _Recent()
        err = _lib.error_t()
        a = None if addr is None else os.fsencode(addr)
        _check(self._lib.open(os.fsencode(path), a, ctypes.byref(self._d), ctypes.byref(err)),
               err)

    def _release(self):
        if self._d:
            self._lib.close(self._d)
            self._d = ctypes.c_void_p()

    def _handle(self):
        if not self._d:
            raise InvalidError("the Direct reader is closed")
        return self._d

    def add_model(self, spec):
        """Makes a model known to this reader (its layers' shapes, for
        restores; the daemon is not asked) and returns its fingerprint.
        spec: as for Client.put_model."""
        return _keep_model(self._models, _load_model(spec, "add_model"))

    def lookup(self, fp, tokens, salt=b"", limit=None):
        """Client.lookup, answered from the store itself."""
        return _lookup(self._lib.lookup, self._handle(), self._p, fp, tokens, salt, limit)

    def _model(self, fp):
        self._handle()  # closed: say so (close let the models go)
        return _find_model(self._models, fp, "Direct reader", "add_model")

    def restore_into(self, key, layers, fp=None):
        """Client.restore_into, from the store itself: each layer is copied
        straight into its two buffers and checked. Returns P."""
        m = self._model(fp)
        return _restore_arrays(self._lib.restore_arrays, self._handle(), m, key, layers,
                               self._p.get(bytes(key)) if isinstance(key, bytes) else None)


def _hold_layers(held, m, layers, writable):
    """Per layer, ((address, floats), (address, floats)) of its two buffers,
    held by held; InvalidError naming the layer and array when one is not a
    (writable) C-contiguous float32 buffer."""
    for i, pair in enumerate(layers):
        try:
            bufs = tuple(pair)
        except TypeError:
            bufs = ()
        if len(bufs) != 2:
            raise InvalidError(f"layer {i}: a (conv, recurrent) or (k, v) pair of float32 "
                               "buffers")
        got = []
        for j, buf in enumerate(bufs):
            try:
                got.append(held.take(buf, f"layer {i}: {_names(m, i)[j]}", writable))
            except ValueError as e:
                raise InvalidError(str(e)) from None
        yield got


def _names(m, i):
    return ("conv", "recurrent") if m.layers[i][0] == _lib.MIXER_KDA else ("k", "v")


def _check_sizes(m, i, per, got, rows, known):
    """The buffers of layer i against the model before anything is sent: a
    KDA layer's exactly, an MLA layer's whole rows, the same P in k, v and
    every MLA layer, and at least the P a lookup or publish gave the key."""
    names = _names(m, i)
    if m.layers[i][0] == _lib.MIXER_KDA:
        for j in range(2):
            if got[j] != per[j]:
                raise InvalidError(f"layer {i}: {names[j]} has {got[j]} floats, the model's "
                                   f"KDA layer has {per[j]}")
        return rows
    ps = []
    for j in range(2):
        if per[j] and got[j] % per[j]:
            raise InvalidError(f"layer {i}: {names[j]} has {got[j]} floats, not a whole "
                               f"number of {per[j]}-float rows")
        ps.append(got[j] // per[j] if per[j] else None)
    p = ps[0] if ps[0] is not None else ps[1]
    if ps[0] is not None and ps[1] is not None and ps[0] != ps[1]:
        raise InvalidError(f"layer {i}: k holds {ps[0]} rows, v {ps[1]}")
    if rows is not None and p != rows:
        raise InvalidError(f"layer {i}: holds {p} rows, an earlier MLA layer {rows}")
    if known is not None and p < known:
        raise InvalidError(f"layer {i}: holds {p} rows, the entry has P={known}")
    return p
