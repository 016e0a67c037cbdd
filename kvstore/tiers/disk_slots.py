"""The disk tier's slot bookkeeping: which slab slots are free, and which are being read.

Free slots are handed out lowest first: a heap of the free slots below the high-water mark
(``_hwm``); every slot at or above it is free. A slot being read is pinned (a reader count):
unlinking it (a delete, a replacement, a dropped corrupt page) frees it at once when nobody
reads it, else after its last reader, so a read never returns another page's bytes.

Not thread-safe: the tier calls every method with its ``_lock`` held. That one lock guards the
tier's in-memory index and its slots together, so publishing a page and unlinking the slot it
replaced are one step.
"""

from __future__ import annotations

import heapq


class FreeSlots:
    """Free and pinned slots of a slab of ``capacity`` slots."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[int] = []  # heap of free slots below _hwm; slots >= _hwm are all free
        self._hwm = 0
        self._readers: dict[int, int] = {}
        self._zombies: set[int] = set()  # unlinked slots still being read

    def load(self, taken: set[int]) -> None:
        """Every slot not in ``taken`` (the slots an opened index names) is free."""
        self._hwm = max(taken) + 1 if taken else 0
        self._free = [s for s in range(self._hwm) if s not in taken]
        heapq.heapify(self._free)

    def alloc(self) -> int | None:
        if self._free:
            return heapq.heappop(self._free)
        if self._hwm < self.capacity:
            self._hwm += 1
            return self._hwm - 1
        return None

    def give_back(self, slot: int) -> None:
        """Free a slot allocated to a write that was never published (nobody saw it)."""
        heapq.heappush(self._free, slot)

    def pin(self, slot: int) -> None:
        self._readers[slot] = self._readers.get(slot, 0) + 1

    def unlink(self, slot: int) -> None:
        if self._readers.get(slot):
            self._zombies.add(slot)
        else:
            heapq.heappush(self._free, slot)

    def unpin(self, slot: int) -> None:
        left = self._readers[slot] - 1
        if left:
            self._readers[slot] = left
            return
        del self._readers[slot]
        if slot in self._zombies:
            self._zombies.discard(slot)
            heapq.heappush(self._free, slot)
