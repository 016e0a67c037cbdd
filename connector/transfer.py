"""How the in-process connector moves one layer of many pages between the engine's KV cache and
the host tier's slab: on the CPU with memcpy on the calling thread, on a GPU on dedicated CUDA
streams -- by the copy engines (one 2-D DMA per run of adjacent blocks and slots) where a
transfer falls in few runs, else with one gather or scatter kernel per layer (see
``csrc/copy_rows.cu``).

A page's layer ``l`` is bytes ``[l * S, (l + 1) * S)`` of the page, ``S = page_bytes /
num_layers``; an engine block's layer ``l`` is the same ``S`` bytes (see :class:`KVCacheSpec`).

Both transfers have one shape, driven by :class:`~connector.inprocess.InProcessWorker`::

    load thread:   ctx = load_context(gate, block_ids, slots)
                   for l: load_layer(ctx, l) -> (worker sets its per-layer threading.Event)
                   finish_load(ctx)                 # the bytes are in the engine's blocks
                   (with ``queue_on_caller`` -- CUDA, or an inline CPU transfer -- the engine
                   thread queues (CPU: runs) a host load's copies itself in start_load_kv;
                   the load thread only runs finish_load)
    engine thread: wait_layer(ctx, l)               # after the Event: compute may read layer l
    engine thread: buf = new_save(block_ids, slots)  # slots: reserved by store.prepare_store
                   layer by layer: begin_save_layer(l); save_layer(buf, l) per save, after
                   attention wrote l; or, where ``saves_whole_pages`` (a page-first CUDA
                   cache): save_pages(buf) once, after the last layer
                   then: mark_saved(buf) -> save thread: wait_saved(buf); store.complete_store
    engine thread: wait_for_save()                  # blocks may be overwritten after this

CUDA ordering (never blocking the engine thread on a copy):

* a load's stream first waits for the work the engine queued before ``start_load_kv`` (its
  blocks may still be read by earlier kernels), then copies layer by layer -- one DMA per run
  when its pairs fall in at most ``_DMA_LOAD_RUNS`` runs, else one scatter kernel -- and records
  an event per layer; ``wait_layer`` makes the engine's current stream wait on that event;
* a save records an event on the engine's stream after the step's last layer; the save stream
  waits on it and moves whole pages into their reserved host slots, one DMA per run of adjacent
  blocks and slots (the copy engine: no SM is taken from the compute it overlaps; many short
  runs take one copy kernel instead), then records the event that ``complete_store`` (on the
  save thread) synchronises on. A cache that is not page-first (vLLM's per-layer tensors) saves
  layer by layer: one kernel per layer with few thread blocks, after that layer's attention;
* ``wait_for_save`` makes the engine's stream wait for the save stream: later writes to the
  saved blocks are ordered after the gathers.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvstore.errors import InvalidArgument
from kvstore.ops import Spans, copy_rows, dma_2d, index_runs, save_copy_blocks

CopyFn = Callable[[Spans], None]


@dataclass(eq=False)
class SaveBuffer:
    """One bound save: engine blocks and the reserved host slots they go to (``slots[i]`` takes
    block ``block_ids[i]``), and the transfer's own state."""

    block_ids: tuple[int, ...]
    slots: tuple[int, ...]
    pending: list[Any] = field(default_factory=list)  # copy futures (CPU) / the last event (CUDA)
    state: Any = None  # the transfer's (CUDA: a _CudaSave)


class LayerTransfer(ABC):
    """Moves layer ``l`` of many pages between the engine's cache and the host slab."""

    #: Copies are queued, not run, by load_layer: the engine thread queues a host load itself
    #: (cheap, and no load thread contends for the GIL while the engine launches its kernels).
    queue_on_caller: bool = False
    #: A save moves whole pages once, after the step's last layer (:meth:`save_pages`), instead
    #: of one layer at a time (:meth:`begin_save_layer` / :meth:`save_layer`).
    saves_whole_pages: bool = False

    @abstractmethod
    def gate(self) -> Any:
        """Called on the engine thread in ``start_load_kv``: what a load must wait for before
        it overwrites engine blocks."""

    @abstractmethod
    def load_context(self, gate: Any, block_ids: Sequence[int], slots: Sequence[int]) -> Any: ...

    @abstractmethod
    def load_layer(self, ctx: Any, layer: int) -> None: ...

    @abstractmethod
    def finish_load(self, ctx: Any) -> None:
        """Block (load thread) until every layer's copy of ``ctx`` has landed."""

    @abstractmethod
    def wait_layer(self, ctx: Any, layer: int) -> None:
        """Engine thread: order the engine's later reads of layer ``layer`` after its load."""

    @abstractmethod
    def new_save(self, block_ids: Sequence[int], slots: Sequence[int]) -> SaveBuffer:
        """A save of ``block_ids`` into the host slots ``slots`` (reserved for it)."""

    def release(self, buf: SaveBuffer) -> None:
        """Save thread, once the save's copies landed: its transfer state can be dropped."""

    def begin_save_layer(self, layer: int) -> None:
        """Engine thread, once per layer before that layer's :meth:`save_layer` calls."""

    @abstractmethod
    def save_layer(self, buf: SaveBuffer, layer: int) -> None: ...

    def save_pages(self, buf: SaveBuffer) -> None:
        """Engine thread, after the step's last layer: move every layer of ``buf``'s blocks
        (only where :attr:`saves_whole_pages`)."""
        raise NotImplementedError(f"{type(self).__name__} saves layer by layer")

    @abstractmethod
    def mark_saved(self, buf: SaveBuffer) -> None:
        """Engine thread, after the last layer of ``buf`` was handed to :meth:`save_layer`."""

    @abstractmethod
    def wait_saved(self, buf: SaveBuffer) -> None:
        """Save thread: block until ``buf``'s slots hold every layer."""

    @abstractmethod
    def wait_for_save(self) -> None:
        """Engine thread: saved blocks may be overwritten by anything queued after this."""

    def close(self) -> None:
        pass


class CpuTransfer(LayerTransfer):
    """CPU caches: loads copy on the load thread; saves copy on one save thread (in order) --
    the layer of a host load overlaps the compute of the layer before.

    ``inline``: a load's copies run on the engine thread instead, in ``start_load_kv``, and
    the load thread only completes it. For an engine whose OpenMP runtime keeps spinning on
    every core between parallel regions (vLLM's CPU backend), where a load thread waited for a
    core while the engine waited for its copy (vLLM, a 1K-token host hit: TTFT ~200 ms with a
    load thread, ~10 ms inline). Saves stay on the save thread there: nothing waits for them
    until ``wait_for_save``, by which time they ran beside the later layers' compute (a 4K-
    token prefill into never-touched slots: ~45 ms of first-touch page faults inline, none
    seen by the engine thread from the save thread).

    Inline, a load whose blocks and slots fall in few runs (a hit saved in one go usually is
    one run) copies each run as one torch copy (``torch_layers``, ``torch_slab``: the same
    memory as torch tensors), which runs on the engine's own intra-op threads -- idle then, the
    engine waits for the copy -- instead of one memcpy per page on one thread (vLLM, a 4K-token
    hit of 127 pages of 128 KiB on 2 cores: ~2.8 ms page by page, ~0.8 ms by runs)."""

    def __init__(self, layers: list[np.ndarray], slab: np.ndarray, num_layers: int,
                 page_bytes: int, copy_fn: CopyFn, saver: ThreadPoolExecutor,
                 inline: bool = False, save_slab: np.ndarray | None = None,
                 torch_layers: list[torch.Tensor] | None = None,
                 torch_slab: torch.Tensor | None = None) -> None:
        self._layers, self._slab = layers, slab  # (num_blocks, S) per layer; (P, L, S)
        self._save_slab = slab if save_slab is None else save_slab  # (P', L, S)
        self._L, self._page_bytes = num_layers, page_bytes
        self._copy, self._saver = copy_fn, saver
        self._copies: list[Future[None]] = []
        self.queue_on_caller = inline
        # run-wise torch copies: inline only (on a load thread they would contend with the
        # engine's intra-op threads for its cores)
        self._runs_by_torch = inline and torch_layers is not None and torch_slab is not None
        self._tlayers, self._tslab = torch_layers, torch_slab  # (num_blocks, S) each; (P, L, S)

    def gate(self) -> None:
        return None

    def load_context(self, gate: Any, block_ids: Sequence[int], slots: Sequence[int]) -> Any:
        n = len(block_ids)
        if self._runs_by_torch and n >= _TORCH_RUNS_MIN_PAIRS:
            runs = index_runs(np.asarray(block_ids, np.int64), np.asarray(slots, np.int64),
                              limit=n // _TORCH_PAIRS_PER_RUN)
            if runs is not None:
                return _RunsCtx(runs)
        return list(zip(block_ids, slots))

    def load_layer(self, ctx: Any, layer: int) -> None:
        if isinstance(ctx, _RunsCtx):
            assert self._tlayers is not None and self._tslab is not None
            dst, src = self._tlayers[layer], self._tslab
            for b, s, n in ctx.runs:
                dst[b: b + n].copy_(src[s: s + n, layer])
            return
        dst_np = self._layers[layer]
        self._copy([(dst_np[b], self._slab[s, layer]) for b, s in ctx])

    def finish_load(self, ctx: Any) -> None:
        pass

    def wait_layer(self, ctx: Any, layer: int) -> None:
        pass  # the copy ran before the layer's Event was set

    def new_save(self, block_ids: Sequence[int], slots: Sequence[int]) -> SaveBuffer:
        return SaveBuffer(tuple(block_ids), tuple(slots))

    def save_layer(self, buf: SaveBuffer, layer: int) -> None:
        src, slab = self._layers[layer], self._save_slab
        spans = [(slab[s, layer], src[b]) for b, s in zip(buf.block_ids, buf.slots)]
        fut = self._saver.submit(self._copy, spans)
        buf.pending.append(fut)
        self._copies.append(fut)

    def mark_saved(self, buf: SaveBuffer) -> None:
        pass

    def wait_saved(self, buf: SaveBuffer) -> None:
        for f in buf.pending:  # submitted before the put on the same thread: already done
            f.result()

    def wait_for_save(self) -> None:
        copies, self._copies = self._copies, []
        for f in copies:
            f.result()


#: an inline CPU load copies by runs (one torch copy each) from this many pairs, when it has
#: at most one run per this many pairs; else page by page (a torch call costs several memcpy
#: calls' overhead)
_TORCH_RUNS_MIN_PAIRS = 4
_TORCH_PAIRS_PER_RUN = 4


@dataclass(frozen=True, slots=True)
class _RunsCtx:
    """An inline CPU load's context when it copies by runs: ``(block, slot, count)`` each."""

    runs: list[tuple[int, int, int]]


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
        runs = index_runs(np.asarray(buf.block_ids, np.int64), np.asarray(buf.slots, np.int64))
        assert runs is not None  # no limit
        pages, slab = self._pages, self._save_slab
        if len(runs) <= _DMA_RUNS or len(buf.block_ids) * self._page_bytes >= len(runs) * _DMA_RUN_BYTES:
            # the copy engine, one contiguous DMA per run: the prefill it overlaps keeps every SM
            with torch.cuda.stream(self._save_stream):
                for b, s, n in runs:
                    slab[s: s + n].copy_(pages[b: b + n], non_blocking=True)
        else:  # many short runs (small pages, scattered slots): one kernel, few thread blocks
            st: _CudaSave = buf.state
            copy_rows(slab, pages, st.slot_idx, st.block_idx, max_blocks=self.save_blocks,
                      stream=self._save_stream.cuda_stream)

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

# a whole-page save takes the copy engine (one DMA per run of adjacent blocks and slots) unless
# its runs are many and short: then one kernel beats hundreds of small DMAs
_DMA_RUNS = 64
_DMA_RUN_BYTES = 1 << 20


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


def make_transfer(tensors_by_layer: list[torch.Tensor], host_slab: torch.Tensor, num_layers: int,
                  page_bytes: int, copy_fn: CopyFn, saver: ThreadPoolExecutor, *,
                  cpu_inline: bool = False, save_slab: torch.Tensor | None = None) -> LayerTransfer:
    """The transfer for the engine's cache: ``tensors_by_layer`` are ``(num_blocks, S)`` uint8
    views of each layer (CPU or one GPU); ``host_slab`` the staging tier's ``(P, page_bytes)``
    slab (pinned for a CUDA cache), which loads read; ``save_slab`` the rows that saves write
    (the staging tier's ``save_slab_tensor``: over the daemon, the session's staging area;
    None: ``host_slab``). ``cpu_inline``: a CPU cache's loads copy on the engine thread (see
    :class:`CpuTransfer`)."""
    if tensors_by_layer[0].device.type == "cuda":
        return CudaTransfer(tensors_by_layer, host_slab, num_layers, page_bytes, save_slab)
    layers = [t.numpy() for t in tensors_by_layer]
    slab = host_slab.numpy().reshape(host_slab.shape[0], num_layers, -1)
    save = None if save_slab is None else save_slab.numpy().reshape(save_slab.shape[0], num_layers, -1)
    return CpuTransfer(layers, slab, num_layers, page_bytes, copy_fn, saver, inline=cpu_inline,
                       save_slab=save, torch_layers=list(tensors_by_layer),
                       torch_slab=host_slab.view(host_slab.shape[0], num_layers, -1))


__all__ = ["CpuTransfer", "CudaTransfer", "LayerTransfer", "SaveBuffer", "make_transfer"]
