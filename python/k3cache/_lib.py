"""ctypes bindings of libk3cache.so.0 (<k3cache/k3cache.h>) and, for direct
reads, of libk3cache-direct.so.0 (<k3cache/direct.h>).

The library is found from $K3CACHE_LIBRARY first, then the prefix the package
was installed under (make install), then the system's loader. The direct
library is loaded on first use: from $K3CACHE_DIRECT_LIBRARY, then beside the
libk3cache.so.0 loaded, then the same places. Every call through ctypes.CDLL
releases the GIL while it runs.
"""
import ctypes
import ctypes.util
import os

KEY_LEN = 32
FP_LEN = 32
MESSAGE_MAX = 256

MIXER_KDA = 1
MIXER_MLA = 2


class error_t(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_int),
        ("unreachable", ctypes.c_int),
        ("message", ctypes.c_char * MESSAGE_MAX),
    ]


class layer_t(ctypes.Structure):
    _fields_ = [
        ("mixer", ctypes.c_int),
        ("conv_len", ctypes.c_uint32),
        ("recurrent_len", ctypes.c_uint32),
        ("k_row", ctypes.c_uint32),
        ("v_row", ctypes.c_uint32),
    ]


class publish_result_t(ctypes.Structure):
    _fields_ = [
        ("key", ctypes.c_uint8 * KEY_LEN),
        ("created", ctypes.c_int),
        ("bytes", ctypes.c_uint64),
        ("evicted", ctypes.c_uint32),
        ("delta_rows", ctypes.c_uint32),
    ]


class lookup_result_t(ctypes.Structure):
    _fields_ = [
        ("prefix_len", ctypes.c_uint32),
        ("hint", ctypes.c_uint32),
        ("key", ctypes.c_uint8 * KEY_LEN),
        ("bytes", ctypes.c_uint64),
    ]


class arrays_t(ctypes.Structure):
    _fields_ = [
        ("a", ctypes.c_void_p),
        ("a_len", ctypes.c_size_t),
        ("b", ctypes.c_void_p),
        ("b_len", ctypes.c_size_t),
    ]


class arrays_out_t(ctypes.Structure):
    _fields_ = [
        ("a", ctypes.c_void_p),
        ("a_cap", ctypes.c_size_t),
        ("b", ctypes.c_void_p),
        ("b_cap", ctypes.c_size_t),
    ]


LAYER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_void_p)


def _candidates():
    env = os.environ.get("K3CACHE_LIBRARY")
    if env:
        yield env
        return  # asked for this one: no other
    try:
        from . import _install  # written by make install
        yield os.path.join(_install.LIBDIR, "libk3cache.so.0")
    except ImportError:
        pass
    yield "libk3cache.so.0"
    found = ctypes.util.find_library("k3cache")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        try:
            # absolute, so that the direct library is found beside it after a chdir
            return ctypes.CDLL(os.path.abspath(path) if os.sep in path else path)
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError(
        "k3cache: cannot load libk3cache.so.0 (set K3CACHE_LIBRARY to its path, or "
        "install it with `make install`); tried:\n  " + "\n  ".join(tried))


lib = _load()

P = ctypes.POINTER
u8p = P(ctypes.c_uint8)
u32p = P(ctypes.c_uint32)
errp = P(error_t)
vp = ctypes.c_void_p


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


code_name = _fn("k3cache_code_name", ctypes.c_char_p, ctypes.c_int)
connect = _fn("k3cache_connect", ctypes.c_int, ctypes.c_char_p, P(vp), errp)
connect_timeout = _fn("k3cache_connect_timeout", ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                      P(vp), errp)
close = _fn("k3cache_close", None, vp)
default_socket = _fn("k3cache_default_socket", ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
set_timeout = _fn("k3cache_set_timeout", None, vp, ctypes.c_int)
model_parse = _fn("k3cache_model_parse", vp, ctypes.c_char_p, ctypes.c_size_t, errp)
model_load = _fn("k3cache_model_load", vp, ctypes.c_char_p, errp)
model_free = _fn("k3cache_model_free", None, vp)
model_fingerprint = _fn("k3cache_model_fingerprint", u8p, vp)
model_layers = _fn("k3cache_model_layers", ctypes.c_uint32, vp)
model_layer = _fn("k3cache_model_layer", ctypes.c_int, vp, ctypes.c_uint32, P(layer_t))
put_model = _fn("k3cache_put_model", ctypes.c_int, vp, vp, u8p, errp)
lookup = _fn("k3cache_lookup", ctypes.c_int, vp, u8p, ctypes.c_char_p, ctypes.c_size_t, u32p,
             ctypes.c_uint32, ctypes.c_uint32, P(lookup_result_t), errp)
publish_arrays = _fn("k3cache_publish_arrays", ctypes.c_int, vp, vp, ctypes.c_char_p,
                     ctypes.c_size_t, u32p, ctypes.c_uint32, P(arrays_t), ctypes.c_uint32, u8p,
                     ctypes.c_uint32, P(publish_result_t), errp)
restore_arrays = _fn("k3cache_restore_arrays", ctypes.c_int, vp, vp, u8p, P(arrays_out_t),
                     ctypes.c_uint32, u32p, errp)
restore_each = _fn("k3cache_restore_each", ctypes.c_int, vp, vp, u8p, LAYER_FN, vp, u32p, errp)


_direct = None


def _direct_candidates():
    env = os.environ.get("K3CACHE_DIRECT_LIBRARY")
    if env:
        yield env
        return
    name = "libk3cache-direct.so.0"
    loaded = getattr(lib, "_name", "")
    if os.sep in loaded:  # beside the libk3cache.so.0 in use (a build tree, a prefix)
        yield os.path.join(os.path.dirname(loaded), name)
    try:
        from . import _install
        yield os.path.join(_install.LIBDIR, name)
    except ImportError:
        pass
    yield name


def direct():
    """libk3cache-direct.so.0, its functions typed, loaded on first use."""
    global _direct
    if _direct is not None:
        return _direct
    tried = []
    for path in _direct_candidates():
        try:
            d = ctypes.CDLL(path)
            break
        except OSError as e:
            tried.append(f"{path}: {e}")
    else:
        raise ImportError(
            "k3cache: cannot load libk3cache-direct.so.0 for direct reads (set "
            "K3CACHE_DIRECT_LIBRARY to its path, or install it with `make install`); "
            "tried:\n  " + "\n  ".join(tried))

    def fn(name, restype, *argtypes):
        f = getattr(d, name)
        f.restype = restype
        f.argtypes = list(argtypes)
        return f

    class Direct:
        open = fn("k3cache_direct_open", ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                  P(vp), errp)
        close = fn("k3cache_direct_close", None, vp)
        lookup = fn("k3cache_direct_lookup", ctypes.c_int, vp, u8p, ctypes.c_char_p,
                    ctypes.c_size_t, u32p, ctypes.c_uint32, ctypes.c_uint32,
                    P(lookup_result_t), errp)
        restore_arrays = fn("k3cache_direct_restore_arrays", ctypes.c_int, vp, vp, u8p,
                            P(arrays_out_t), ctypes.c_uint32, u32p, errp)
        path = d._name

    _direct = Direct
    return _direct
