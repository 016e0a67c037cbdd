"""Adaptive Replacement Cache (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement
Cache", FAST 2003)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from kvstore.policy.base import EvictionPolicy, IsPinned, Key, never_pinned


class ARCPolicy(EvictionPolicy):
    """ARC with ``c = capacity``: resident lists ``T1`` (seen once recently) and ``T2`` (seen at
    least twice), ghost lists ``B1``/``B2`` (keys recently evicted from ``T1``/``T2``), and a
    target size ``p`` for ``T1`` that adapts, 0 <= p <= c.

    * ``access`` of a resident key (and ``insert`` of one): it moves to the MRU end of ``T2``.
    * ``insert`` of a key in ``B1``: p += max(|B2| / |B1|, 1) (capped at c); the key moves to the
      MRU end of ``T2``. In ``B2``: p -= max(|B1| / |B2|, 1) (floored at 0); MRU of ``T2``.
    * ``insert`` of a key in no list: MRU end of ``T1``. Ghosts are trimmed as in the paper's case
      IV: if |T1| + |B1| >= c the LRU key of ``B1`` is forgotten, else if all four lists hold >= 2c
      keys the LRU key of ``B2`` is.
    * ``evict``, one victim at a time (the paper's REPLACE): the LRU key of ``T1`` if
      |T1| > p, or if ``T2`` has nothing evictable; else the LRU key of ``T2``. The victim enters
      the MRU end of ``B1`` or ``B2`` respectively; ghosts beyond ``c`` (``B1`` with ``T1``) and
      ``2c`` (all four) are forgotten, oldest first.

    Victim order is therefore LRU within ``T1`` or ``T2``, the list chosen per victim by the rule
    above. Pinned keys are skipped in place (they keep their recency) and the next LRU key of the
    same list is taken; the list choice counts pinned keys in |T1|.

    One deviation, forced by the interface: the paper's REPLACE also evicts from ``T1`` when
    |T1| == p and the incoming key is a ``B2`` ghost, but the store evicts before it inserts and
    does not name the incoming key, so that tie goes to ``T2``. The store bounds |T1| + |T2|;
    nothing here assumes it is bounded.

    Cost: every operation O(1) besides ``evict``'s O(victims + pinned keys skipped).
    """

    name = "arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = 0.0
        # LRU first; values unused.
        self._t1: OrderedDict[Key, None] = OrderedDict()
        self._t2: OrderedDict[Key, None] = OrderedDict()
        self._b1: OrderedDict[Key, None] = OrderedDict()
        self._b2: OrderedDict[Key, None] = OrderedDict()

    def insert(self, key: Key, parent: Key | None = None) -> None:
        if key in self._t1 or key in self._t2:
            self.access(key)
            return
        c = self.capacity
        if key in self._b1:
            self.p = min(float(c), self.p + max(len(self._b2) / len(self._b1), 1.0))
            del self._b1[key]
            self._t2[key] = None
        elif key in self._b2:
            self.p = max(0.0, self.p - max(len(self._b1) / len(self._b2), 1.0))
            del self._b2[key]
            self._t2[key] = None
        else:
            if len(self._t1) + len(self._b1) >= c:
                if self._b1:
                    self._b1.popitem(last=False)
            elif (
                len(self._t1) + len(self._t2) + len(self._b1) + len(self._b2) >= 2 * c
                and self._b2
            ):
                self._b2.popitem(last=False)
            self._t1[key] = None

    def access(self, key: Key) -> None:
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        elif key in self._t2:
            self._t2.move_to_end(key)

    def remove(self, key: Key) -> None:
        if key in self._t1:
            del self._t1[key]
        else:
            self._t2.pop(key, None)

    def evict(self, n: int, is_pinned: IsPinned = never_pinned) -> list[Key]:
        victims: list[Key] = []
        # Pinned keys met so far, LRU first. They leave their list while the scan looks past them
        # and go back to its LRU end afterwards, in the same order.
        held1: list[Key] = []
        held2: list[Key] = []
        try:
            while len(victims) < n:
                prefer_t1 = len(self._t1) + len(held1) > self.p
                order = (True, False) if prefer_t1 else (False, True)
                for from_t1 in order:
                    if from_t1:
                        victim = self._pop_unpinned(self._t1, is_pinned, held1)
                    else:
                        victim = self._pop_unpinned(self._t2, is_pinned, held2)
                    if victim is not None:
                        self._remember(victim, self._b1 if from_t1 else self._b2)
                        victims.append(victim)
                        break
                else:
                    break  # everything left is pinned
        finally:
            for lst, held in ((self._t1, held1), (self._t2, held2)):
                for key in reversed(held):
                    lst[key] = None
                    lst.move_to_end(key, last=False)
        return victims

    @staticmethod
    def _pop_unpinned(
        lst: OrderedDict[Key, None], is_pinned: IsPinned, held: list[Key]
    ) -> Key | None:
        while lst:
            key, _ = lst.popitem(last=False)
            if not is_pinned(key):
                return key
            held.append(key)
        return None

    def _remember(self, key: Key, ghost: OrderedDict[Key, None]) -> None:
        """Put an evicted key at the MRU end of its ghost list and trim the ghosts to the
        paper's bounds: |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c."""
        ghost[key] = None
        c = self.capacity
        while self._b1 and len(self._t1) + len(self._b1) > c:
            self._b1.popitem(last=False)
        while len(self._t1) + len(self._t2) + len(self._b1) + len(self._b2) > 2 * c:
            if self._b2:
                self._b2.popitem(last=False)
            elif self._b1:
                self._b1.popitem(last=False)
            else:
                break

    def __contains__(self, key: object) -> bool:
        return key in self._t1 or key in self._t2

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __iter__(self) -> Iterator[Key]:
        yield from self._t1
        yield from self._t2
