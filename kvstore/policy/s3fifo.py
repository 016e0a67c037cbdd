"""S3-FIFO eviction (Yang et al., "FIFO queues are all you need for cache eviction", SOSP 2023)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from kvstore.policy.base import EvictionPolicy, IsPinned, Key, never_pinned

_MAX_FREQ = 3  # a 2-bit counter
_PROMOTE_FREQ = 2  # small -> main when freq > 1 (Algorithm 1 of the paper; libCacheSim's default)


class S3FIFOPolicy(EvictionPolicy):
    """Three FIFO queues: small ``S`` (10% of ``capacity``), main ``M`` (the rest) and a ghost
    ``G`` of keys only, holding as many entries as ``M`` may.

    * ``insert`` of a new key: into ``M`` with count 0 if it is in ``G`` (and it leaves ``G``),
      else into ``S`` with count 0.
    * ``access`` (and ``insert`` of a tracked key): count = min(count + 1, 3).
    * ``evict``, one victim at a time: take from ``M`` if ``M`` holds more than its share or ``S``
      is empty, else from ``S``; if the chosen queue has nothing evictable, from the other one.

      - from ``S``: look at its oldest key. Count >= 2: it moves to the newest end of ``M`` with
        count 0 (not a victim; look at the next). Else, unless pinned, it is the victim and its key
        enters ``G`` (the oldest ghost is forgotten beyond ``M``'s share).
      - from ``M``: look at its oldest key. Count >= 1: it moves to the newest end of ``M`` with
        count - 1 (not a victim; look at the next). Else, unless pinned, it is the victim.

    Victim order is therefore: the first key with a count of 0 (``M``) or below 2 (``S``) found by
    that sweep. Pinned keys are never victims: they keep their place and count and the sweep
    passes over them; promotions and count decrements still happen to pinned keys, exactly as they
    would unpinned. The sweep ends because each step moves a key or lowers a count.

    This follows the paper's Algorithm 1 with libCacheSim's choice of queue (``M`` when over its
    share or ``S`` empty), and keeps ``S`` -> ``M`` moves within one ``evict`` (the store, not the
    policy, bounds the total). Cost: ``insert``/``access``/``remove`` O(1); ``evict`` O(victims +
    keys moved + pinned keys skipped), amortised O(1) per victim since each key is moved at most
    three times per pass of ``M``.
    """

    name = "s3fifo"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.small_capacity = max(1, capacity // 10)
        self.main_capacity = max(1, capacity - self.small_capacity)
        self.ghost_capacity = self.main_capacity
        # Oldest first; the value is the key's count (0..3).
        self._small: OrderedDict[Key, int] = OrderedDict()
        self._main: OrderedDict[Key, int] = OrderedDict()
        self._ghost: OrderedDict[Key, None] = OrderedDict()

    def insert(self, key: Key, parent: Key | None = None) -> None:
        if key in self._small or key in self._main:
            self.access(key)
        elif key in self._ghost:
            del self._ghost[key]
            self._main[key] = 0
        else:
            self._small[key] = 0

    def access(self, key: Key) -> None:
        freq = self._small.get(key)
        if freq is not None:
            if freq < _MAX_FREQ:
                self._small[key] = freq + 1  # assigning to an existing key keeps its place
            return
        freq = self._main.get(key)
        if freq is not None and freq < _MAX_FREQ:
            self._main[key] = freq + 1

    def remove(self, key: Key) -> None:
        if self._small.pop(key, None) is None:
            self._main.pop(key, None)

    def evict(self, n: int, is_pinned: IsPinned = never_pinned) -> list[Key]:
        victims: list[Key] = []
        # Pinned keys met by the sweep, in the order met (oldest first), with their counts. They
        # leave their queue during the sweep and go back to its oldest end afterwards.
        held_small: list[tuple[Key, int]] = []
        held_main: list[tuple[Key, int]] = []
        try:
            while len(victims) < n:
                if len(self._main) + len(held_main) > self.main_capacity or not self._small:
                    victim = self._evict_main(is_pinned, held_main)
                    if victim is None:
                        victim = self._evict_small(is_pinned, held_small)
                else:
                    victim = self._evict_small(is_pinned, held_small)
                    if victim is None:
                        victim = self._evict_main(is_pinned, held_main)
                if victim is None:
                    break  # everything left is pinned
                victims.append(victim)
        finally:
            for queue, held in ((self._small, held_small), (self._main, held_main)):
                for key, freq in reversed(held):
                    queue[key] = freq
                    queue.move_to_end(key, last=False)
        return victims

    def _evict_small(self, is_pinned: IsPinned, held: list[tuple[Key, int]]) -> Key | None:
        small = self._small
        while small:
            key, freq = small.popitem(last=False)
            if freq >= _PROMOTE_FREQ:
                self._main[key] = 0
            elif is_pinned(key):
                held.append((key, freq))
            else:
                self._ghost[key] = None
                if len(self._ghost) > self.ghost_capacity:
                    self._ghost.popitem(last=False)
                return key
        return None

    def _evict_main(self, is_pinned: IsPinned, held: list[tuple[Key, int]]) -> Key | None:
        main = self._main
        while main:
            key, freq = main.popitem(last=False)
            if freq > 0:
                main[key] = freq - 1
            elif is_pinned(key):
                held.append((key, freq))
            else:
                return key
        return None

    def __contains__(self, key: object) -> bool:
        return key in self._small or key in self._main

    def __len__(self) -> int:
        return len(self._small) + len(self._main)

    def __iter__(self) -> Iterator[Key]:
        yield from self._small
        yield from self._main
