"""Native-op façade: each op has its pure reference here, with the same contract; the native
version (``csrc/``, through ``csrc.loader``, the one place that loads native code) is used when it
builds. ``KVSTORE_NATIVE=0|1`` forces either path (read by the loader)."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported lazily: CPU-only tiers never need it
    import torch

Spans = Sequence[tuple[np.ndarray, np.ndarray]]


def copy_spans_reference(spans: Spans) -> None:
    """For each ``(dst, src)`` pair of equal-sized, contiguous, non-overlapping 1-D uint8
    arrays: ``dst[:] = src``."""
    for dst, src in spans:
        np.copyto(dst, src)


_native: Callable[..., None] | None = None
_resolved = False
#: Spans of at least this many bytes are "large" for the copy choice (a 2 MiB page is; a
#: 256 KiB one is not).
LARGE_SPAN = 1 << 20
#: Which implementation copies small and large spans: decided by :func:`copy_choice`.
_choice: dict[str, str] | None = None
_choice_lock = threading.Lock()


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


def copy_spans_native(spans: Spans) -> None:
    """:func:`copy_spans_reference` by the native op (streaming stores for spans from 64 KiB),
    whatever :func:`copy_choice` picked; RuntimeError where it did not build."""
    fn = _resolve()
    if fn is None:
        raise RuntimeError("the native copy_pages op is not built (no C compiler, or "
                           "KVSTORE_NATIVE=0)")
    _copy_native(fn, spans)


def _copy_native(fn: Callable[..., None], spans: Spans) -> None:
    n = len(spans)
    if not n:
        return
    for dst, src in spans:
        if dst.nbytes != src.nbytes or not dst.flags.writeable:
            raise ValueError("copy_spans needs equal-sized spans and writable destinations")
    dptr = (ctypes.c_void_p * n)(*(d.ctypes.data for d, _ in spans))
    sptr = (ctypes.c_void_p * n)(*(s.ctypes.data for _, s in spans))
    sizes = (ctypes.c_size_t * n)(*(d.nbytes for d, _ in spans))
    fn(dptr, sptr, sizes, n)


def copy_choice() -> dict[str, str]:
    """``{"small": impl, "large": impl}`` with impl "native" or "numpy": which one copies spans
    under / from :data:`LARGE_SPAN` bytes in this process.

    Decided once, by measurement, on first use: which is faster *on this machine* depends on
    the CPU (streaming stores vs glibc's memcpy), on whether the destination is backed by
    transparent huge pages, and on the cache size, so neither is assumed. Both copy spans of
    each class, from ordinary memory into a huge-page-advised anonymous mapping (the host
    tier's slab) and back, twice the largest cache's bytes per round (the tier's pages are
    not in cache; a working set that fits favours ``np.copyto``, which leaves it there); the
    median of 3 interleaved rounds decides, numpy only when at least 5 % faster (0.2-0.4 s,
    once per process: the host tier asks when it is built). ``KVSTORE_NATIVE=0`` or ``1``
    forces the choice (1: the native op, failing loudly where it does not build); with no
    native op it is numpy."""
    global _choice
    with _choice_lock:
        if _choice is None:
            from csrc.loader import native_mode

            fn = _resolve()
            mode = native_mode()
            if fn is None or mode == "0":
                _choice = {"small": "numpy", "large": "numpy"}
            elif mode == "1":
                _choice = {"small": "native", "large": "native"}
            else:
                from kvstore.buffers import hugepage_buffer

                # one pair of buffers for both classes: the probe's memory is 2 x _cold_bytes()
                cold = _cold_bytes()
                plain = np.full(cold, 7, dtype=np.uint8)
                huge = hugepage_buffer(cold)
                huge[:] = 0  # fault it in
                _choice = {
                    "small": _faster(fn, plain, huge, LARGE_SPAN // 4),
                    "large": _faster(fn, plain, huge, 2 * LARGE_SPAN),
                }
        return _choice


#: Bytes each round of :func:`copy_choice` copies per direction: twice the last-level cache
#: where Linux says how big it is (``_cold_bytes``), within these bounds.
_MIN_COLD_BYTES = 32 << 20
_MAX_COLD_BYTES = 128 << 20
#: How much faster (a fraction) np.copyto must copy to be chosen over the native op.
_NUMPY_MARGIN = 0.05


def _cold_bytes() -> int:
    """A working set twice the largest CPU cache (within [32 MiB, 128 MiB]). Measured on the
    2-core machine (32 MiB L3), 48 MiB a round: the native op copied 256 KiB spans in 7.4-12.2
    ms against numpy's 13.0-16.2, 2 MiB spans in 5.5-5.6 against 7.8-8.2; with the 2 MiB and
    16 MiB working sets used before, numpy won the small spans 2-3 fold and, best of 5, the
    large ones one time in six."""
    from pathlib import Path

    largest = 0
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()  # e.g. "32768K"
            unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            largest = max(largest, int(text.rstrip("KM")) * unit)
        except (OSError, ValueError):
            continue
    return min(_MAX_COLD_BYTES, max(_MIN_COLD_BYTES, 2 * largest))


def _faster(
    fn: Callable[..., None], plain: np.ndarray, huge: np.ndarray, span_bytes: int, rounds: int = 3
) -> str:
    """Which copies ``span_bytes`` spans faster from ``plain`` into ``huge`` (a huge-page
    mapping of the same size) and back."""
    import statistics
    import time

    count = plain.nbytes // span_bytes
    ins = [(huge[i * span_bytes : (i + 1) * span_bytes], plain[i * span_bytes : (i + 1) * span_bytes])
           for i in range(count)]
    outs = [(s, d) for d, s in ins]
    took: dict[str, list[float]] = {"native": [], "numpy": []}
    impls = {"native": lambda sp: _copy_native(fn, sp), "numpy": copy_spans_reference}
    for r in range(rounds):
        for name in (("native", "numpy") if r % 2 else ("numpy", "native")):
            t0 = time.perf_counter()
            impls[name](ins)
            impls[name](outs)
            took[name].append(time.perf_counter() - t0)
    return _pick(statistics.median(took["native"]), statistics.median(took["numpy"]))


def _pick(native_s: float, numpy_s: float) -> str:
    """The copy to use given each one's time. np.copyto only when clearly faster: the native
    op's streaming stores leave the cache to the engine, and on the 2-core machine the two
    came within 5 % of each other for 2 MiB spans often enough (memory bandwidth there varies
    minute to minute) that a plain comparison flipped between processes."""
    return "numpy" if numpy_s < (1 - _NUMPY_MARGIN) * native_s else "native"


def copy_spans(spans: Spans) -> None:
    """:func:`copy_spans_reference`, by whichever of numpy and the native op (streaming
    stores) :func:`copy_choice` measured faster for spans of this size."""
    if not spans:
        return
    choice = _choice or copy_choice()
    impl = choice["large" if spans[0][0].nbytes >= LARGE_SPAN else "small"]
    fn = _native
    if impl == "numpy" or fn is None:
        copy_spans_reference(spans)
    else:
        _copy_native(fn, spans)


def native_active() -> bool:
    """Whether the native copy op built (whether it is *used* is :func:`copy_choice`'s)."""
    return _resolve() is not None


# ----------------------------------------------------------------------------- copy_rows


def copy_rows_reference(
    dst: torch.Tensor, src: torch.Tensor, dst_idx: torch.Tensor, src_idx: torch.Tensor
) -> None:
    """For each ``i``: ``dst[dst_idx[i]] = src[src_idx[i]]``. ``dst`` and ``src`` are 2-D uint8
    tensors ``(rows, nbytes)`` whose rows are contiguous (any row stride, any devices); the
    index tensors are 1-D int64 of equal length. One ``copy_`` per row, ``non_blocking`` on the
    current stream (asynchronous between pinned host memory and a GPU) -- what an engine does
    without a gather kernel."""
    for d, s in zip(dst_idx.tolist(), src_idx.tolist()):
        dst[d].copy_(src[s], non_blocking=True)


@dataclass(frozen=True, slots=True)
class _CudaOps:
    """The entry points of ``csrc/copy_rows.cu``, typed for ctypes."""

    copy_rows: Callable[..., int]
    copy_2d: Callable[..., int]
    error_string: Callable[[int], bytes]

    def check(self, rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"{what} failed: {self.error_string(rc).decode()}")


_cuda_ops: _CudaOps | None = None
_cuda_resolved = False
_cuda_lock = threading.Lock()


def _resolve_cuda() -> _CudaOps | None:
    global _cuda_ops, _cuda_resolved
    with _cuda_lock:
        if not _cuda_resolved:
            from csrc.loader import load

            lib = load("copy_rows")
            if lib is not None:
                lib.kv_copy_rows.argtypes = (
                    [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 5 + [ctypes.c_void_p])
                lib.kv_copy_2d.argtypes = [
                    ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                    ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
                lib.kv_error_string.argtypes = [ctypes.c_int]
                for fn in (lib.kv_copy_rows, lib.kv_copy_2d):
                    fn.restype = ctypes.c_int
                lib.kv_error_string.restype = ctypes.c_char_p
                _cuda_ops = _CudaOps(lib.kv_copy_rows, lib.kv_copy_2d, lib.kv_error_string)
            _cuda_resolved = True
    return _cuda_ops


def _device_ok(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" or t.is_pinned()


def copy_rows_blocks(device: torch.device) -> int:
    """Thread blocks one copy_rows launch uses on ``device``: ``KVSTORE_COPY_BLOCKS``, else a
    quarter of its SMs (at least 8) -- enough to fill PCIe, few enough to leave the compute
    kernels a copy overlaps with most of the GPU (see csrc/copy_rows.cu)."""
    import torch

    from csrc.loader import copy_blocks_override

    override = copy_blocks_override()
    if override is not None:
        return override
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(8, sms // 4)


def save_copy_blocks(device: torch.device) -> int:
    """Thread blocks of a save's copy_rows launch: ``KVSTORE_SAVE_BLOCKS``, else a sixteenth of
    the SMs (at least 4). A save overlaps a prefill whose every SM it slows: it only has to keep
    pace with compute (a 32K Llama-3-8B prefill makes 4 GiB of KV in ~1.4 s), not fill PCIe."""
    import torch

    from csrc.loader import copy_blocks_override

    override = copy_blocks_override("KVSTORE_SAVE_BLOCKS")
    if override is not None:
        return override
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(4, sms // 16)


def copy_rows(
    dst: torch.Tensor, src: torch.Tensor, dst_idx: torch.Tensor, src_idx: torch.Tensor,
    *, max_blocks: int | None = None, stream: int | None = None,
) -> bool:
    """:func:`copy_rows_reference`, as one kernel launch (``csrc/copy_rows.cu``) on the current
    CUDA stream when one side is a GPU tensor, the other is on that GPU or in pinned host memory,
    the index tensors are pinned (or on the GPU), and every address, row stride and row size is
    a multiple of 16 bytes. Returns True when the kernel ran, False when the reference did.

    The copy is asynchronous on the GPU: the caller keeps ``dst``, ``src`` and both index
    tensors alive (and unmodified) until the stream has passed it (record an event).
    ``max_blocks``: thread blocks of the launch (default :func:`copy_rows_blocks`); ``stream``:
    a raw ``cudaStream_t`` to launch on instead of the current stream (saves a lookup per call
    on hot paths)."""
    if dst.dim() != 2 or src.dim() != 2 or dst.dtype != src.dtype or dst.shape[1] != src.shape[1]:
        raise ValueError(f"copy_rows needs 2-D tensors of equal row size, got {tuple(dst.shape)} "
                         f"and {tuple(src.shape)}")
    if dst_idx.shape != src_idx.shape or dst_idx.dim() != 1:
        raise ValueError("copy_rows needs two 1-D index tensors of equal length")
    if not len(dst_idx):
        return True
    cuda = dst if dst.device.type == "cuda" else src
    ops = _resolve_cuda() if cuda.device.type == "cuda" else None
    nbytes = dst.shape[1] * dst.element_size()
    aligned = all(v % 16 == 0 for v in (
        dst.data_ptr(), src.data_ptr(), nbytes,
        dst.stride(0) * dst.element_size(), src.stride(0) * src.element_size()))
    if (
        ops is None or not aligned or dst.stride(1) != 1 or src.stride(1) != 1
        or dst_idx.dtype != src_idx.dtype or dst_idx.dtype.itemsize != 8
        or not all(map(_device_ok, (dst, src, dst_idx, src_idx)))
    ):
        copy_rows_reference(dst, src, dst_idx, src_idx)
        return False
    import torch

    if stream is None:
        stream = torch.cuda.current_stream(cuda.device).cuda_stream
    blocks = max_blocks if max_blocks is not None else _blocks_for(cuda.device)
    ops.check(ops.copy_rows(
        dst.data_ptr(), src.data_ptr(), dst_idx.data_ptr(), src_idx.data_ptr(), len(dst_idx),
        dst.stride(0) * dst.element_size(), src.stride(0) * src.element_size(), nbytes, blocks,
        stream), "copy_rows kernel launch")
    return True


def copy_2d(dst: torch.Tensor, src: torch.Tensor, *, stream: int | None = None) -> bool:
    """``dst[:] = src`` for two 2-D uint8 tensors of one shape whose rows are contiguous (any
    row pitch), between a GPU and pinned host memory or within a GPU: one asynchronous
    ``cudaMemcpy2DAsync`` on the current stream, run by the copy engines (no SMs). Falls back to
    one ``copy_`` per row (returns False) where the native library is unavailable. The caller
    keeps both alive until the stream has passed the copy. ``stream``: as for :func:`copy_rows`."""
    if dst.shape != src.shape or dst.dim() != 2 or dst.dtype != src.dtype:
        raise ValueError(f"copy_2d needs 2-D tensors of one shape, got {tuple(dst.shape)} and "
                         f"{tuple(src.shape)}")
    cuda = dst if dst.device.type == "cuda" else src
    ops = _resolve_cuda() if cuda.device.type == "cuda" else None
    if ops is None or dst.stride(1) != 1 or src.stride(1) != 1 or not all(
            map(_device_ok, (dst, src))):
        for d, s in zip(dst, src):
            d.copy_(s, non_blocking=True)
        return False
    import torch

    if stream is None:
        stream = torch.cuda.current_stream(cuda.device).cuda_stream
    es = dst.element_size()
    ops.check(ops.copy_2d(dst.data_ptr(), dst.stride(0) * es, src.data_ptr(),
                          src.stride(0) * es, dst.shape[1] * es, dst.shape[0], stream), "copy_2d")
    return True


def dma_2d() -> Callable[[int, int, int, int, int, int, int], None] | None:
    """The raw form of :func:`copy_2d` for hot loops, or None without the native library:
    ``fn(dst_ptr, dst_pitch, src_ptr, src_pitch, width, height, stream)`` queues one
    ``cudaMemcpy2DAsync`` (raises RuntimeError naming CUDA's error). Pointers and pitches in
    bytes; the caller guarantees they are valid for the copy and stay alive until the stream
    has passed it."""
    ops = _resolve_cuda()
    if ops is None:
        return None

    def copy(dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
             stream: int) -> None:
        rc = ops.copy_2d(dst, dpitch, src, spitch, width, height, stream)
        if rc:
            ops.check(rc, "copy_2d")

    return copy


_blocks_cache: dict[Any, int] = {}


def _blocks_for(device: torch.device) -> int:
    b = _blocks_cache.get(device)
    if b is None:
        b = _blocks_cache[device] = copy_rows_blocks(device)
    return b


def copy_rows_native_active() -> bool:
    """Whether the CUDA gather/scatter kernel built and loaded (only attempted with CUDA)."""
    return _resolve_cuda() is not None


def index_runs(first: np.ndarray, second: np.ndarray, limit: int | None = None
               ) -> list[tuple[int, int, int]] | None:
    """(first, second, length) of each maximal run of pairs of two equal-length int64 arrays
    (block ids and slots) where both advance by one, in order, computed in numpy; None when
    there are more than ``limit`` runs."""
    n = len(first)
    if n == 0:
        return []
    breaks = np.flatnonzero((np.diff(first) != 1) | (np.diff(second) != 1)) + 1
    if limit is not None and len(breaks) >= limit:
        return None
    starts = np.concatenate(([0], breaks))
    counts = np.diff(np.append(starts, n))
    return list(zip(first[starts].tolist(), second[starts].tolist(), counts.tolist()))
