"""The eviction-policy seam.

A policy orders the keys of one tier for eviction. It sees keys and events, never bytes or
tensors, so it is tested in microseconds and replayed from traces (``bench/policies.py``).

Contract shared by every implementation:

* Keys are opaque hashable values (16-byte ``bytes`` in the store). The policy tracks exactly
  the keys inserted and not yet removed or evicted; ``len(policy)`` is that count.
* ``insert(key, parent)`` starts tracking ``key``. ``parent`` is the key of the previous block of
  the same prefix (``None`` for a first block); only lineage-aware policies use it. Inserting a
  key that is already tracked counts as an access.
* ``access(key)`` records a hit; accessing an untracked key is a no-op.
* ``remove(key)`` stops tracking ``key`` (the store deleted it for a reason other than eviction);
  removing an untracked key is a no-op.
* ``evict(n, is_pinned)`` chooses up to ``n`` victims in the policy's victim order, stops tracking
  them and returns them, in order. Keys for which ``is_pinned(key)`` is true are never returned
  and stay tracked. Fewer than ``n`` keys come back when fewer are evictable.
* ``capacity`` is the number of pages the tier holds; adaptive policies (ARC, S3-FIFO) size
  their queues and ghost lists from it. The store never lets ``len(policy)`` exceed it.

Policies are not thread-safe: the store calls them under its own lock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

Key = Hashable
IsPinned = Callable[[Any], bool]


def never_pinned(_key: Any) -> bool:
    return False


class EvictionPolicy(ABC):
    """Orders one tier's keys for eviction. See the module docstring for the contract."""

    #: The name under which the registry knows this policy (``"lru"``, ``"s3fifo"``, ...).
    name: str = ""

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"policy capacity must be an int >= 1 page, got {capacity!r:.40}")
        self.capacity = capacity

    @abstractmethod
    def insert(self, key: Key, parent: Key | None = None) -> None: ...

    @abstractmethod
    def access(self, key: Key) -> None: ...

    def access_many(self, keys: Sequence[Key]) -> None:
        """:meth:`access` of each key, in order (a hit on a long prefix touches every block;
        a policy may do it in bulk)."""
        for k in keys:
            self.access(k)

    @abstractmethod
    def remove(self, key: Key) -> None: ...

    @abstractmethod
    def evict(self, n: int, is_pinned: IsPinned = never_pinned) -> list[Key]: ...

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    def tracks_all(self, keys: Sequence[Key]) -> bool:
        """Whether every key of ``keys`` is tracked (a policy with a dict of its keys answers
        without a Python call per key)."""
        return all(map(self.__contains__, keys))

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Key]:
        """The tracked keys, in no promised order."""
