"""Float32 buffers of the caller's, held through the buffer protocol for the
length of one call: numpy arrays, array('f'), memoryviews, CPU torch tensors
through .numpy(). Nothing is copied."""
import ctypes

_PyBUF_WRITABLE = 0x0001
_PyBUF_FORMAT = 0x0004
_PyBUF_C_CONTIGUOUS = 0x0038  # PyBUF_STRIDES | 0x0020


class _Py_buffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get = ctypes.pythonapi.PyObject_GetBuffer
_get.argtypes = [ctypes.py_object, ctypes.POINTER(_Py_buffer), ctypes.c_int]
_get.restype = ctypes.c_int
_release = ctypes.pythonapi.PyBuffer_Release
_release.argtypes = [ctypes.POINTER(_Py_buffer)]
_release.restype = None

_FLOAT32 = (b"f", b"<f", b"=f", b"@f")


class Held:
    """Buffers held until release(): each gives its address and float count."""

    def __init__(self):
        self._views = []

    def take(self, obj, what, writable):
        """(address, floats) of obj, a C-contiguous float32 buffer; ValueError
        (with `what` named) when it is not one."""
        if obj is None:
            raise ValueError(f"{what}: None is not a float32 buffer")
        view = _Py_buffer()
        flags = _PyBUF_FORMAT | _PyBUF_C_CONTIGUOUS | (_PyBUF_WRITABLE if writable else 0)
        try:
            _get(obj, ctypes.byref(view), flags)
        except (BufferError, ValueError) as e:
            kind = "writable, C-contiguous" if writable else "C-contiguous"
            raise ValueError(f"{what}: not a {kind} float32 buffer ({e})") from None
        except TypeError:
            raise ValueError(f"{what}: a {type(obj).__name__} has no buffer "
                             "(numpy arrays, array('f') and memoryviews do)") from None
        self._views.append(view)
        fmt = view.format if view.format is not None else b"B"
        if fmt not in _FLOAT32 or view.itemsize != 4:
            raise ValueError(f"{what}: items are {fmt.decode()!r} of {view.itemsize} bytes, "
                             "not float32 ('f')")
        return view.buf, view.len // 4

    def release(self):
        for v in self._views:
            _release(ctypes.byref(v))
        self._views = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
