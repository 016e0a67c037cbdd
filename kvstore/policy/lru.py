"""Least-recently-used eviction."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence

from kvstore.policy.base import EvictionPolicy, IsPinned, Key, never_pinned


class LRUPolicy(EvictionPolicy):
    """Least recently used first.

    Victim order: tracked keys by the time of their last ``insert`` or ``access``, oldest first.
    Pinned keys are skipped in place (they keep their recency) and the scan goes on to the next
    oldest key.

    Cost: ``insert``/``access``/``remove`` O(1); ``evict`` O(victims + pinned keys skipped).
    """

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        # Oldest first; the value is unused.
        self._order: OrderedDict[Key, None] = OrderedDict()

    def insert(self, key: Key, parent: Key | None = None) -> None:
        if key in self._order:
            self._order.move_to_end(key)
        else:
            self._order[key] = None

    def access(self, key: Key) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def remove(self, key: Key) -> None:
        self._order.pop(key, None)

    def evict(self, n: int, is_pinned: IsPinned = never_pinned) -> list[Key]:
        victims: list[Key] = []
        if n <= 0:
            return victims
        for key in self._order:  # no mutation while iterating: collect, then delete
            if not is_pinned(key):
                victims.append(key)
                if len(victims) == n:
                    break
        for key in victims:
            del self._order[key]
        return victims

    def access_many(self, keys: Sequence[Key]) -> None:
        order = self._order
        try:  # every key tracked (a hit's blocks): the loop in C
            deque(map(order.move_to_end, keys), maxlen=0)
        except KeyError:  # one is not: moving the tracked ones again gives the same order
            for key in keys:
                if key in order:
                    order.move_to_end(key)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def tracks_all(self, keys: Sequence[Key]) -> bool:
        return all(map(self._order.__contains__, keys))

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._order)
