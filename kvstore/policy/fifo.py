"""First-in-first-out eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from kvstore.policy.base import EvictionPolicy, IsPinned, Key, never_pinned


class FIFOPolicy(EvictionPolicy):
    """First inserted, first evicted.

    Victim order: tracked keys by the time of their first ``insert`` (since they were last
    untracked), oldest first. ``access`` and re-``insert`` of a tracked key change nothing. Pinned
    keys are skipped in place and the scan goes on to the next oldest key.

    Cost: ``insert``/``access``/``remove`` O(1); ``evict`` O(victims + pinned keys skipped).
    """

    name = "fifo"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        # Oldest first; the value is unused. An OrderedDict, not a dict: deleting from the front
        # of a plain dict leaves dummy slots that every later scan from the front walks over.
        self._order: OrderedDict[Key, None] = OrderedDict()

    def insert(self, key: Key, parent: Key | None = None) -> None:
        if key not in self._order:
            self._order[key] = None

    def access(self, key: Key) -> None:
        return None

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

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._order)
