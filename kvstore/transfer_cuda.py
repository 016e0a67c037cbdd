"""The transfer engine on CUDA (see :mod:`kvstore.transfer` for the shape and the ordering):
:class:`CudaTransfer` moves an engine cache's layers to and from the host slab on its own
streams, and :func:`copy_pages` moves whole pages between a GPU and pinned host rows -- a
save's pages after the step's last layer, and the HBM tier's reads and writes (write-back on
eviction, promotion) -- by the copy engine, one DMA per run of adjacent rows, or by one
gather/scatter kernel where the runs are many and short."""

from __future__ import annotations

import threading
from contextlib import nullcontext
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvstore.errors import InvalidArgument
from kvstore.ops import copy_rows, dma_2d, index_runs, save_copy_blocks
from kvstore.transfer import LayerTransfer, SaveBuffer


@dataclass(eq=False)
class _CudaSave:
    block_idx: torch.Tensor  # pinned int64, read by the kernel through UVA
    slot_idx: torch.Tensor  # pinned int64: the reserved host slots


@dataclass(eq=False)
class _CudaLoad:
    dst_idx: torch.Tensor  # pinned int64, read by the kernel through UVA
    src_idx: torch.Tensor
    events: list[torch.cuda.Event]
    buffer: torch.Tensor | None = None  # the pinned buffer of both index views (None: given back)
    runs: list[tuple[int, int, int]] | None = None  # by DMA: (block, slot, count) per run


class _LoadBuffers:
    """What a load's copies need besides the pages, reused from load to load: a pinned int64
    buffer for its two index arrays and its per-layer events. Pinning fresh host memory,
    building tensors from Python ints and creating one event per layer came before a hit's
    first copy (a 32K-token hit: two arrays of 2048). Taken by ``load_context``, given back by
    ``finish_load`` once the copies that read the indices through UVA have ended (an event
    recorded again later leaves the waits already queued on it as they were)."""

    _KEEP = 8  # sets kept for reuse; more loads at once allocate more

    def __init__(self, num_layers: int) -> None:
        self._L = num_layers
        self._lock = threading.Lock()
        self._buffers: list[torch.Tensor] = []
        self._events: list[list[torch.cuda.Event]] = []

    def take(self, first: Sequence[int], second: Sequence[int]) -> _CudaLoad:
        n = len(first)
        with self._lock:
            at = next((i for i, b in enumerate(self._buffers) if b.numel() >= 2 * n), None)
            buf = self._buffers.pop(at) if at is not None else None
            events = self._events.pop() if self._events else None
        if buf is None:
            size = max(1024, 1 << (2 * n - 1).bit_length())  # few distinct sizes
            buf = torch.empty(size, dtype=torch.int64, pin_memory=True)
        if events is None:
            events = [torch.cuda.Event() for _ in range(self._L)]
        view = buf.numpy()
        view[:n] = first  # numpy converts the ints in C
        view[n: 2 * n] = second
        return _CudaLoad(buf[:n], buf[n: 2 * n], events, buf)

    def give(self, ctx: _CudaLoad) -> None:
        buf, ctx.buffer = ctx.buffer, None
        if buf is None:  # given back already
            return
        with self._lock:
            if len(self._buffers) < self._KEEP:
                self._buffers.append(buf)
            if len(self._events) < self._KEEP:
                self._events.append(ctx.events)


class CudaTransfer(LayerTransfer):
    """CUDA caches: one kernel per layer on a load stream and a save stream, ordered against
    the engine's stream by events (see the module docstring). ``slab``: the host tier's pinned
    slab as a ``(P, page_bytes)`` uint8 tensor.

    Loads: where the load's (block, slot) pairs fall in at most ``_DMA_LOAD_RUNS`` runs of
    adjacent pairs (the usual case: a prefix saved in one go sits in adjacent slots, and is
    loaded into blocks allocated together), one 2-D DMA per run and layer (rows of a layer's
    ``S`` bytes at the page pitch) on the copy engine; else one scatter kernel per layer reads
    the host slab through UVA with a few thread blocks. The kernel's thread blocks take SMs
    from the layers that compute beside the load: on the H200 a 4K-token Llama-3-8B layer-wise
    host hit took 13.9 ms with the kernel and 12.3 ms by DMA, whatever the kernel's block count
    (16: 13.7, 66: 14.6, 132: 16.6 ms). Saves go straight into the host slots the
    store reserved (``prepare_store``), with no staging copy. Of a page-first cache, whole
    pages after the step's last layer, by DMA (see the module docstring): a save's kernel,
    however few its thread blocks, slowed the prefill it overlapped (H200, 4K-token prompts:
    the store's no-reuse TTFT 0.955 of none with the kernel). Of per-layer caches, per layer
    with the same kernel as loads and fewer thread blocks (``kvstore.ops.save_copy_blocks``).
    (A gather into GPU scratch plus one 2-D DMA of 64 KiB rows at a 2 MiB pitch per layer
    reached only 0.87 of the link: whole pages are one contiguous DMA per run.)"""

    queue_on_caller = True

    def __init__(self, layers: list[torch.Tensor], slab: torch.Tensor, num_layers: int,
                 page_bytes: int, save_slab: torch.Tensor | None = None) -> None:
        save_slab = slab if save_slab is None else save_slab
        if not (slab.is_pinned() and save_slab.is_pinned()):
            raise InvalidArgument(
                "a CUDA KV cache needs a pinned host tier (DMA target), this one is pageable",
                hint="leave the host tier's pin_memory on 'auto' (pinned when CUDA is present)",
            )
        self.device = layers[0].device
        self._L, self._page_bytes = num_layers, page_bytes
        self._layers = layers  # (num_blocks, S) uint8 views per layer, on the GPU
        S = page_bytes // num_layers
        self._slab, self._save_slab = slab, save_slab  # loads read the one, saves write the other
        self._slab_layers = [slab.view(-1, num_layers, S)[:, lyr] for lyr in range(num_layers)]
        self._save_layers = [save_slab.view(-1, num_layers, S)[:, lyr] for lyr in range(num_layers)]
        self._pages = _whole_pages(layers, page_bytes)
        self.saves_whole_pages = self._pages is not None
        # loads gate the layers waiting for them, and their copy kernels share the SMs with the
        # step's compute: a high-priority stream gets their thread blocks scheduled first
        self._load_stream = torch.cuda.Stream(self.device, priority=-1)
        self._loads = _LoadBuffers(num_layers)
        # by DMA: per layer (engine-side base, its row pitch, slab-side base, its row pitch)
        self._dma = dma_2d() if all(t.stride(1) == 1 for t in layers) else None
        self._dma_rows = [(d.data_ptr(), d.stride(0), h.data_ptr(), h.stride(0))
                          for d, h in zip(layers, self._slab_layers)]
        self._row_bytes = S
        self._save_stream = torch.cuda.Stream(self.device)
        self.save_blocks = save_copy_blocks(self.device)

    @staticmethod
    def _pinned(ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.int64).pin_memory()

    def gate(self) -> torch.cuda.Event:
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def load_context(self, gate: Any, block_ids: Sequence[int], slots: Sequence[int]) -> _CudaLoad:
        self._load_stream.wait_event(gate)
        ctx = self._loads.take(block_ids, slots)
        if self._dma is not None:
            ctx.runs = index_runs(ctx.dst_idx.numpy(), ctx.src_idx.numpy(), _DMA_LOAD_RUNS)
        return ctx

    def load_layer(self, ctx: _CudaLoad, layer: int) -> None:
        stream = self._load_stream.cuda_stream
        if ctx.runs is not None:
            assert self._dma is not None
            dst, dpitch, src, spitch = self._dma_rows[layer]
            width = self._row_bytes
            for b, s, n in ctx.runs:
                self._dma(dst + b * dpitch, dpitch, src + s * spitch, spitch, width, n, stream)
        else:
            copy_rows(self._layers[layer], self._slab_layers[layer], ctx.dst_idx, ctx.src_idx,
                      stream=stream)
        ctx.events[layer].record(self._load_stream)

    def finish_load(self, ctx: _CudaLoad) -> None:
        ctx.events[-1].synchronize()  # one stream, in order: the last layer ends the load
        self._loads.give(ctx)  # no kernel reads its indices any more

    def wait_layer(self, ctx: _CudaLoad, layer: int) -> None:
        torch.cuda.current_stream(self.device).wait_event(ctx.events[layer])

    def new_save(self, block_ids: Sequence[int], slots: Sequence[int]) -> SaveBuffer:
        return SaveBuffer(tuple(block_ids), tuple(slots),
                          state=_CudaSave(self._pinned(block_ids), self._pinned(slots)))

    def release(self, buf: SaveBuffer) -> None:
        buf.state = None

    def begin_save_layer(self, layer: int) -> None:
        ready = torch.cuda.Event()  # the layer's attention has been queued: save after it
        ready.record(torch.cuda.current_stream(self.device))
        self._save_stream.wait_event(ready)

    def save_layer(self, buf: SaveBuffer, layer: int) -> None:
        if not buf.block_ids:
            return
        st: _CudaSave = buf.state
        copy_rows(self._save_layers[layer], self._layers[layer], st.slot_idx, st.block_idx,
                  max_blocks=self.save_blocks, stream=self._save_stream.cuda_stream)

    def save_pages(self, buf: SaveBuffer) -> None:
        if not buf.block_ids:
            return
        assert self._pages is not None
        self.begin_save_layer(self._L - 1)  # after the last layer's writes
        st: _CudaSave = buf.state
        # the copy engine where it can: the prefill the save overlaps keeps every SM
        copy_pages(self._save_slab, self._pages, st.slot_idx, st.block_idx,
                   stream=self._save_stream, max_blocks=self.save_blocks)

    def mark_saved(self, buf: SaveBuffer) -> None:
        ev = torch.cuda.Event()
        ev.record(self._save_stream)
        buf.pending.append(ev)

    def wait_saved(self, buf: SaveBuffer) -> None:
        for ev in buf.pending:
            ev.synchronize()

    def wait_for_save(self) -> None:
        torch.cuda.current_stream(self.device).wait_stream(self._save_stream)


# a load by DMA queues one copy per run and layer on the engine thread (a few µs each): beyond
# this many runs the scatter kernel, one launch per layer, costs less
_DMA_LOAD_RUNS = 16

# whole pages take the copy engine (one DMA per run of adjacent rows) unless their runs are many
# and short: then one kernel beats hundreds of small DMAs
_DMA_RUNS = 64
_DMA_RUN_BYTES = 1 << 20


def copy_pages(dst: torch.Tensor, src: torch.Tensor, dst_idx: torch.Tensor, src_idx: torch.Tensor,
               *, stream: torch.cuda.Stream | None = None, max_blocks: int | None = None) -> None:
    """``dst[dst_idx[i]] = src[src_idx[i]]``: whole ``(rows, page_bytes)`` uint8 pages between a
    GPU and pinned host memory, queued on ``stream`` (None: the current stream; on the CPU the
    copies run now). One DMA per run of pairs where both rows advance by one (the copy engine,
    no SM taken from compute), unless the runs are more than ``_DMA_RUNS`` and shorter than
    ``_DMA_RUN_BYTES`` on average: then one :func:`~kvstore.ops.copy_rows` kernel of
    ``max_blocks`` thread blocks. ``dst_idx`` / ``src_idx``: int64 CPU tensors, pinned for the
    kernel (it reads them through UVA); the caller keeps every tensor alive until ``stream`` has
    passed the copy."""
    runs = index_runs(dst_idx.numpy(), src_idx.numpy())
    assert runs is not None  # no limit
    if len(runs) <= _DMA_RUNS or len(dst_idx) * dst.shape[1] >= len(runs) * _DMA_RUN_BYTES:
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            for d, s, n in runs:
                dst[d: d + n].copy_(src[s: s + n], non_blocking=True)
        return
    copy_rows(dst, src, dst_idx, src_idx, max_blocks=max_blocks,
              stream=None if stream is None else stream.cuda_stream)



def _whole_pages(layers: list[torch.Tensor], page_bytes: int) -> torch.Tensor | None:
    """``(num_blocks, page_bytes)``: the blocks as whole pages, when the per-layer views are
    the layers of one page-first buffer (layer ``l`` of block ``b`` at ``b * page_bytes + l *
    S``); else None (per-layer caches, as vLLM allocates them, save layer by layer)."""
    first = layers[0]
    S = page_bytes // len(layers)
    if first.dim() != 2 or first.stride() != (page_bytes, 1) or first.shape[1] != S:
        return None
    base = first.data_ptr()
    for lyr, t in enumerate(layers):
        if t.stride() != first.stride() or t.shape != first.shape or t.data_ptr() != base + lyr * S:
            return None
    return first.as_strided((first.shape[0], page_bytes), (page_bytes, 1))



__all__ = ["CudaTransfer", "copy_pages"]
