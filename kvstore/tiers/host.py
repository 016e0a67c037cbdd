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

import threading
from itertools import takewhile
from collections.abc import Iterator, Sequence

import numpy as np

from kvstore.errors import InvalidArgument
from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.tiers.base import Tier


class HostTier(Tier):
    kind = "host"

    def __init__(
        self,
        name: str,
        layout: KVLayout,
        capacity_pages: int,
        metrics: Metrics | None = None,
        *,
        pin_memory: bool | None = None,
        slab: np.ndarray | None = None,
    ) -> None:
        super().__init__(name, layout, capacity_pages, metrics)
        nbytes = capacity_pages * layout.page_bytes
        if slab is None:
            slab, self.pinned = _allocate(nbytes, pin_memory)
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
        self._readers = [0] * capacity_pages
        self._zombies: set[int] = set()  # unlinked slots still being read
        self._free = list(range(capacity_pages - 1, -1, -1))

    @property
    def slab_tensor(self):  # noqa: ANN201 - torch is imported lazily
        """The slab as a ``(capacity_pages, page_bytes)`` uint8 torch tensor sharing its memory
        (pinned when ``self.pinned``), for DMA transfers to and from the GPU."""
        import torch

        return torch.from_numpy(self._slab)

    def slot_of(self, key: bytes) -> int | None:
        """The slot index holding ``key``, or None. The caller must hold a lease on ``key``
        while it uses the slot (the store never evicts a leased page)."""
        with self._lock:
            return self._index.get(key)

    def slot_view(self, key: bytes) -> np.ndarray | None:
        """The slab row holding ``key`` (zero-copy), or None. For the daemon's shared-memory data
        path; the caller must hold a lease on ``key`` while it uses the view."""
        with self._lock:
            slot = self._index.get(key)
        return None if slot is None else self._slab[slot]

    # ----------------------------------------------------------------- hooks

    def _contains(self, keys: Sequence[bytes]) -> list[bool]:
        index = self._index
        return [k in index for k in keys]

    def _count_leading(self, keys: Sequence[bytes]) -> int:
        return len(list(takewhile(self._index.__contains__, keys)))

    def _read(
        self, namespace_id: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray]
    ) -> list[bool]:
        slots: list[int | None] = []
        with self._lock:
            for key in keys:
                slot = self._index.get(key)
                if slot is not None:
                    meta = self._metas[slot]
                    if meta is None or meta.namespace_id != namespace_id:
                        self.count_corrupt("namespace")
                        slot = None
                    else:
                        self._readers[slot] += 1
                slots.append(slot)
        try:
            for slot, out in zip(slots, outs):
                if slot is not None:
                    np.copyto(out, self._slab[slot])
        finally:
            with self._lock:
                for slot in slots:
                    if slot is not None:
                        self._unpin(slot)
        return [s is not None for s in slots]

    def _write(self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]) -> list[bool]:
        with self._lock:
            slots = [self._free.pop() if self._free else None for _ in metas]
        for slot, page in zip(slots, pages):
            if slot is not None:
                np.copyto(self._slab[slot], page)
        with self._lock:
            for slot, meta in zip(slots, metas):
                if slot is None:
                    continue
                old = self._index.get(meta.key)
                self._index[meta.key] = slot
                self._metas[slot] = meta
                if old is not None:
                    self._release(old)
        return [s is not None for s in slots]

    def _delete(self, keys: Sequence[bytes]) -> int:
        n = 0
        with self._lock:
            for key in keys:
                slot = self._index.pop(key, None)
                if slot is not None:
                    self._release(slot)
                    n += 1
        return n

    def _meta(self, key: bytes) -> BlockMeta | None:
        with self._lock:
            slot = self._index.get(key)
            return None if slot is None else self._metas[slot]

    def _keys(self) -> Iterator[bytes]:
        with self._lock:
            return iter(list(self._index))

    def _used(self) -> int:
        return len(self._index)

    # ----------------------------------------------------------------- slot bookkeeping (locked)

    def _release(self, slot: int) -> None:
        if self._readers[slot]:
            self._zombies.add(slot)
        else:
            self._metas[slot] = None
            self._free.append(slot)

    def _unpin(self, slot: int) -> None:
        self._readers[slot] -= 1
        if self._readers[slot] == 0 and slot in self._zombies:
            self._zombies.discard(slot)
            self._metas[slot] = None
            self._free.append(slot)


def _allocate(nbytes: int, pin_memory: bool | None) -> tuple[np.ndarray, bool]:
    import torch

    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    if pin and not torch.cuda.is_available():
        raise InvalidArgument(
            "pin_memory=True needs CUDA, and torch sees no GPU",
            hint="set the host tier's pin_memory to 'auto' or false",
        )
    # torch pins memory for us; the numpy view keeps the tensor alive through its ``base``.
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin).numpy(), pin
