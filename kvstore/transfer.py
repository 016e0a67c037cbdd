"""The transfer engine: how pages move between an engine's KV cache and the host tier's slab, one
layer at a time (the in-process connector's loads and saves): on the CPU with memcpy on the
calling thread, on a GPU on dedicated CUDA streams -- by the copy engines (one 2-D DMA per run of
adjacent blocks and slots) where a transfer falls in few runs, else with one gather or scatter
kernel per layer (see ``csrc/copy_rows.cu``). The CUDA half is :mod:`kvstore.transfer_cuda`,
whose :func:`~kvstore.transfer_cuda.copy_pages` also moves the HBM tier's pages (write-back,
promotion): one GPU copy path for loads, saves and eviction alike.

A page's layer ``l`` is bytes ``[l * S, (l + 1) * S)`` of the page, ``S = page_bytes /
num_layers``; an engine block's layer ``l`` is the same ``S`` bytes (see :class:`KVCacheSpec`).

Both transfers have one shape, driven by the connector's in-process worker::

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

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvstore.ops import Spans, index_runs

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
        from kvstore.transfer_cuda import CudaTransfer

        return CudaTransfer(tensors_by_layer, host_slab, num_layers, page_bytes, save_slab)
    layers = [t.numpy() for t in tensors_by_layer]
    slab = host_slab.numpy().reshape(host_slab.shape[0], num_layers, -1)
    save = None if save_slab is None else save_slab.numpy().reshape(save_slab.shape[0], num_layers, -1)
    return CpuTransfer(layers, slab, num_layers, page_bytes, copy_fn, saver, inline=cpu_inline,
                       save_slab=save, torch_layers=list(tensors_by_layer),
                       torch_slab=host_slab.view(host_slab.shape[0], num_layers, -1))


__all__ = ["CopyFn", "CpuTransfer", "LayerTransfer", "SaveBuffer", "make_transfer"]
