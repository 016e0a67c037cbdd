"""Native-op façade: each op has its pure reference here, with the same contract; the native
version (``csrc/``, through ``csrc.loader``, the one place that loads native code) is used when it
builds. ``KVSTORE_NATIVE=0|1`` forces either path (read by the loader)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import numpy as np

Spans = Sequence[tuple[np.ndarray, np.ndarray]]


def copy_spans_reference(spans: Spans) -> None:
    """For each ``(dst, src)`` pair of equal-sized, contiguous, non-overlapping 1-D uint8
    arrays: ``dst[:] = src``."""
    for dst, src in spans:
        np.copyto(dst, src)


_native: Callable[..., None] | None = None
_resolved = False


def _resolve() -> Callable[..., None] | None:
    global _native, _resolved
    if not _resolved:
        from csrc.loader import load

        lib = load("copy_pages")
        if lib is not None:
            fn = lib.kv_copy_spans
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
            fn.restype = None
            _native = fn
        _resolved = True
    return _native


def copy_spans(spans: Spans) -> None:
    """:func:`copy_spans_reference`, with streaming stores for large spans where the native op
    is available."""
    fn = _resolve()
    if fn is None or not spans:
        copy_spans_reference(spans)
        return
    n = len(spans)
    for dst, src in spans:
        if dst.nbytes != src.nbytes or not dst.flags.writeable:
            raise ValueError("copy_spans needs equal-sized spans and writable destinations")
    dptr = (ctypes.c_void_p * n)(*(d.ctypes.data for d, _ in spans))
    sptr = (ctypes.c_void_p * n)(*(s.ctypes.data for _, s in spans))
    sizes = (ctypes.c_size_t * n)(*(d.nbytes for d, _ in spans))
    fn(dptr, sptr, sizes, n)


def native_active() -> bool:
    return _resolve() is not None
