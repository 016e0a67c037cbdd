"""Reads for tiers that keep pages in numbered in-memory slots (host, hbm).

A read pins each hit slot (a reader count) under the tier's lock, copies outside the lock, then
unpins. Deleting or replacing a key unlinks it at once, but the tier must not reuse a slot while
it has readers — so a concurrent delete can never hand a reader another page's bytes. The
tier decides what happens when the last reader leaves (``_after_unpin``).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, MutableSequence, Sequence
from itertools import takewhile

import numpy as np

from kvstore.keys import BlockMeta


class SlotReads:
    """Mixin implementing ``_meta``, ``_keys``, ``_contains``, ``_count_leading`` and ``_read`` of
    a Tier over: ``_lock``, ``_index`` (key -> slot), ``_metas`` (slot -> BlockMeta | None),
    ``_readers`` (slot -> count), ``_copy_out(slots, outs)`` and ``_after_unpin(slot)`` (called
    locked)."""

    _lock: threading.Lock
    _index: dict[bytes, int]
    _metas: list[BlockMeta | None]
    _readers: MutableSequence[int] | Counter[int]  # slot -> count: a list, or a Counter

    count_corrupt: Callable[[str], None]  # provided by Tier (annotation only: no shadowing)

    def _copy_out(self, slots: list[int], outs: list[np.ndarray]) -> None:
        raise NotImplementedError

    def _after_unpin(self, slot: int) -> None:
        raise NotImplementedError

    def _meta(self, key: bytes) -> BlockMeta | None:
        with self._lock:
            slot = self._index.get(key)
            return None if slot is None else self._metas[slot]

    def _keys(self) -> Iterator[bytes]:
        with self._lock:
            return iter(list(self._index))

    def _contains(self, keys: Sequence[bytes]) -> list[bool]:
        return list(map(self._index.__contains__, keys))  # in C: a lookup asks of 2K keys

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
            hits = [(s, out) for s, out in zip(slots, outs) if s is not None]
            if hits:
                self._copy_out([s for s, _ in hits], [o for _, o in hits])
        finally:
            with self._lock:
                for slot in slots:
                    if slot is not None:
                        self._readers[slot] -= 1
                        self._after_unpin(slot)
        return [s is not None for s in slots]
