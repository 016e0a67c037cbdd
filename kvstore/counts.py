"""Reference counts kept in a dict (item -> count; absent: 0), taken down in bulk: the lease
table's pins (key -> leases) and the host tier's readers (slot -> loads) both release a
2048-item prompt at a time, on the hit path."""

from __future__ import annotations

import operator
from collections import Counter, deque
from collections.abc import Hashable, Sequence
from itertools import compress, repeat
from typing import TypeVar

T = TypeVar("T", bound=Hashable)


def take_one_each(counts: dict[T, int], items: Sequence[T]) -> None:
    """Take one count off each of ``items`` (an item may repeat: one per occurrence), deleting
    those that reach zero. Every item must be counted in ``counts``."""
    # The usual case -- each item held once, by this holder alone -- pops every count as 1: one
    # C loop (~5x cheaper than counting and subtracting for a 2048-item prompt)
    popped = list(map(counts.pop, items, repeat(0)))
    if popped.count(1) == len(popped):
        return
    dict.update(counts, compress(zip(items, popped), popped))  # put them back
    # C loops still: count the items, subtract, store what is left, delete what reached zero
    drop = Counter(items)
    left = list(map(operator.sub, map(counts.__getitem__, drop), drop.values()))
    dict.update(counts, zip(drop, left))
    deque(map(dict.__delitem__, repeat(counts), compress(drop, map(operator.not_, left))),
          maxlen=0)


__all__ = ["take_one_each"]
