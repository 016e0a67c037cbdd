"""Host tier: one slab of fixed-size page slots in host memory.

Guarantees:

* **Durability** — none; the slab lives as long as the process (or, in the daemon, the shared
  memory segment handed to the constructor as ``slab``).
* **Memory** — one contiguous slab of ``capacity_pages * page_bytes`` bytes, allocated once.
  Pinned (page-locked, DMA-able) when CUDA is available and ``pin_memory`` is not False, so
  GPU<->host copies run at PCIe speed without a bounce buffer.
* **Concurrency** — the index (key -> slot) and the free list are guarded by one lock that is
  never held during a copy. A slot being read is pinned by a reader count: deleting or replacing
  its key unlinks it at once, but the slot returns to the free list only when the last reader is
  done, so a concurrent delete can never hand a reader another page's bytes. A write fills a
  free slot first and publishes it in the index afterwards, so readers never see a half-written
  page.
* **Identity** — the tier keeps each page's :class:`BlockMeta`; a read checks the namespace asked
  for. Payloads are not checksummed here: process memory is trusted like HBM; the checksum is
  computed when a page leaves the process (see ``kvstore.record``).
"""

from __future__ import annotations

import ctypes
import functools
import operator
import os
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import takewhile

import numpy as np

from kvstore.buffers import hugepage_buffer
from kvstore.counts import take_one_each
from kvstore.errors import InvalidArgument
from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.ops import copy_choice, copy_spans
from kvstore.tiers.base import Tier
from kvstore.tiers.host_config import HostTierConfig
from kvstore.tiers.slab import SlabSlots
from kvstore.tiers.slots import SlotReads


_NAMESPACE_OF = operator.attrgetter("namespace_id")
_IS_SLOT = functools.partial(operator.is_not, None)  # index.get's miss; slot 0 is a hit


class HostTier(SlotReads, SlabSlots, Tier):
    kind = "host"
    config_model = HostTierConfig

    def __init__(
        self,
        config: HostTierConfig,
        layout: KVLayout,
        metrics: Metrics | None = None,
        *,
        slab: np.ndarray | None = None,
    ) -> None:
        """``slab``: memory to hold the pages in, mapped by the caller (the daemon's shared
        memory); None: the tier allocates its own (pinned per ``config.pin_memory``)."""
        super().__init__(config, layout, metrics)
        name, capacity_pages = self.name, self.capacity_pages
        nbytes = capacity_pages * layout.page_bytes
        pin_memory = None if config.pin_memory == "auto" else config.pin_memory
        if slab is None:
            slab, self.pinned = _allocate(name, nbytes, pin_memory)
        else:
            self.pinned = bool(pin_memory)
            if slab.dtype != np.uint8 or slab.nbytes < nbytes or not slab.flags.c_contiguous:
                raise InvalidArgument(
                    f"host slab must be a contiguous uint8 array of >= {nbytes} bytes, got "
                    f"{slab.dtype} of {slab.nbytes} bytes"
                )
        self._slab = slab.reshape(-1)[:nbytes].reshape(capacity_pages, layout.page_bytes)
        self._lock = threading.Lock()
        self._index: dict[bytes, int] = {}
        self._metas: list[BlockMeta | None] = [None] * capacity_pages
        #: slot -> loads and reads holding it (absent: none); a Counter, so a 2048-slot pin
        #: counts in one C loop
        self._readers: Counter[int] = Counter()
        self._zombies: set[int] = set()  # unlinked slots still being read
        #: namespace -> pages the index holds under it (a quota's question, answered in O(1))
        self._per_namespace: Counter[bytes] = Counter()
        self._free = list(range(capacity_pages - 1, -1, -1))
        copy_choice()  # measured now, once per process, rather than in the first put's time

    # ----------------------------------------------------------------- SlabSlots

    @property
    def slab(self) -> np.ndarray:
        return self._slab

    @property
    def slab_tensor(self):  # noqa: ANN201 - torch is imported lazily
        """The slab as a ``(capacity_pages, page_bytes)`` uint8 torch tensor sharing its memory
        (pinned when ``self.pinned``), for DMA transfers to and from the GPU."""
        import torch

        return torch.from_numpy(self._slab)

    def slot_of(self, key: bytes) -> int | None:
        """The slot index holding ``key``, or None (for tests and introspection: a copy out of
        it needs :meth:`pin_leading`)."""
        with self._lock:
            return self._index.get(key)

    def pin_leading(self, keys: Sequence[bytes], namespace_id: bytes) -> list[int]:
        # C loops where it can (a 32K-token hit pins 2048 slots before its load can start):
        # slots, then their pages' namespaces, then the counts
        with self._lock:
            out: list[int] = list(takewhile(_IS_SLOT, map(self._index.get, keys)))  # type: ignore[arg-type]
            n = len(out)
            if n:
                metas = map(self._metas.__getitem__, out)  # indexed slots hold a meta
                ns = list(map(_NAMESPACE_OF, metas))
                if ns.count(namespace_id) != n:  # another namespace's page ends the run
                    n = next(i for i, x in enumerate(ns) if x != namespace_id)
                    del out[n:]
            self._readers.update(out)
        return out

    def unpin(self, slots: Sequence[int]) -> None:
        with self._lock:
            take_one_each(self._readers, slots)
            if self._zombies:  # an unlinked slot frees when its last reader leaves
                for slot in self._zombies.intersection(slots):
                    self._after_unpin(slot)

    def reserve(self, n: int) -> list[int]:
        with self._lock:
            k = min(n, len(self._free))
            return sorted(self._free.pop() for _ in range(k))

    def publish(self, slots: Sequence[int], metas: Sequence[BlockMeta]) -> None:
        with self._lock:
            for slot, meta in zip(slots, metas):
                old = self._index.get(meta.key)
                self._index[meta.key] = slot
                if old is not None:
                    self._uncount(old)
                    self._release(old)
                self._metas[slot] = meta
                self._per_namespace[meta.namespace_id] += 1
        self._update_occupancy()

    def unreserve(self, slots: Sequence[int]) -> None:
        with self._lock:
            self._free.extend(slots)

    # ----------------------------------------------------------------- hooks

    def _copy_out(self, slots: list[int], outs: list[np.ndarray]) -> None:
        copy_spans(
            [
                (buf, self._slab[start : start + n].reshape(-1))
                for start, n, buf in _runs(slots, outs)
            ]
        )

    def _write(self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]) -> list[bool]:
        got = self.reserve(len(metas))
        n = len(got)
        copy_spans(
            [(self._slab[start : start + k].reshape(-1), buf) for start, k, buf in _runs(got, pages[:n])]
        )
        self.publish(got, metas[:n])
        return [True] * n + [False] * (len(metas) - n)

    def _delete(self, keys: Sequence[bytes]) -> int:
        n = 0
        with self._lock:
            for key in keys:
                slot = self._index.pop(key, None)
                if slot is not None:
                    self._uncount(slot)
                    self._release(slot)
                    n += 1
        return n

    def _used(self) -> int:
        # reserved and still-read (zombie) slots hold room too: what is not free is used
        return self.capacity_pages - len(self._free)

    def pages_of(self, namespace_id: bytes) -> int:
        """How many pages the tier holds under ``namespace_id`` (reserved slots not counted)."""
        with self._lock:
            return self._per_namespace.get(namespace_id, 0)

    # ----------------------------------------------------------------- slot bookkeeping (locked)

    def _uncount(self, slot: int) -> None:
        meta = self._metas[slot]
        if meta is not None:
            ns = meta.namespace_id
            self._per_namespace[ns] -= 1
            if self._per_namespace[ns] <= 0:
                del self._per_namespace[ns]

    def _release(self, slot: int) -> None:
        if self._readers[slot]:
            self._zombies.add(slot)
        else:
            self._metas[slot] = None
            self._free.append(slot)

    def _after_unpin(self, slot: int) -> None:
        if self._readers[slot] == 0 and slot in self._zombies:
            self._zombies.discard(slot)
            self._metas[slot] = None
            self._free.append(slot)


def _runs(
    slots: Sequence[int], bufs: Sequence[np.ndarray]
) -> Iterator[tuple[int, int, np.ndarray]]:
    """Group (slot, buffer) pairs into runs of consecutive slots whose buffers are also adjacent
    in memory, yielding (first slot, count, one flat view over the run's buffers): one large
    copy per run instead of one per page. A batch put from one tensor into a fresh slab is a
    single run, and large copies run faster (glibc switches to non-temporal stores)."""
    i, n = 0, len(slots)
    while i < n:
        j = i + 1
        nbytes = bufs[i].nbytes
        base = _address(bufs[i])
        while (
            j < n
            and slots[j] == slots[i] + (j - i)
            and bufs[j].flags.writeable == bufs[i].flags.writeable
            and _address(bufs[j]) == base + (j - i) * nbytes
        ):
            j += 1
        if j - i == 1:
            yield slots[i], 1, bufs[i]
        else:
            yield slots[i], j - i, _span(bufs[i], (j - i) * nbytes)
        i = j


def _address(buf: np.ndarray) -> int:
    """``buf.ctypes.data``, a quarter of its cost where the buffer is writable (``ctypes.data``
    builds an object per call: ~1 us, 10 % of a batch of 256 KiB pages' copy)."""
    if buf.flags.writeable:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))  # type: ignore[arg-type]
    return int(buf.ctypes.data)


def _span(first: np.ndarray, nbytes: int) -> np.ndarray:
    """A flat uint8 view of ``nbytes`` starting at ``first``'s data, when the buffers that
    follow it are adjacent in memory (checked by the caller). It shares their memory."""
    return np.lib.stride_tricks.as_strided(
        first, shape=(nbytes,), strides=(1,), writeable=first.flags.writeable
    )


def _allocate(name: str, nbytes: int, pin_memory: bool | None) -> tuple[np.ndarray, bool]:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if nbytes > ram:
        raise InvalidArgument(
            f"host tier {name!r} asks for {_gib(nbytes)} of memory; this machine has {_gib(ram)}",
            hint="lower the host tier's capacity (it is one slab in RAM)",
        )
    try:
        return _map(nbytes, pin_memory)
    except (OSError, MemoryError, RuntimeError) as exc:
        raise InvalidArgument(
            f"host tier {name!r}: cannot allocate {_gib(nbytes)} ({type(exc).__name__}: {exc})",
            hint="lower the host tier's capacity, or raise the memlock limit for a pinned slab",
        ) from None


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB"


def _map(nbytes: int, pin_memory: bool | None) -> tuple[np.ndarray, bool]:
    import torch

    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    if pin and not torch.cuda.is_available():
        raise InvalidArgument(
            "pin_memory=True needs CUDA, and torch sees no GPU",
            hint="set the host tier's pin_memory to 'auto' or false",
        )
    if pin:
        # CUDA's host allocator page-locks (and page-aligns) the slab; the numpy view keeps the
        # tensor alive through its ``base``.
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy(), True
    # Page-aligned (O_DIRECT without a bounce copy) and on huge pages where the kernel allows.
    return hugepage_buffer(nbytes), False
