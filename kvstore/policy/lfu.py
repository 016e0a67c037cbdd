"""Least-frequently-used eviction, LRU among equal frequencies."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from kvstore.policy.base import EvictionPolicy, IsPinned, Key, never_pinned


class _Bucket:
    """The keys that share one frequency, least recently used first. Buckets form a doubly
    linked list in increasing frequency; only non-empty buckets are linked."""

    __slots__ = ("freq", "keys", "prev", "next")

    def __init__(self, freq: int) -> None:
        self.freq = freq
        self.keys: OrderedDict[Key, None] = OrderedDict()
        self.prev: _Bucket | None = None
        self.next: _Bucket | None = None


class LFUPolicy(EvictionPolicy):
    """Least frequently used first; least recently used first among equal frequencies.

    A key's frequency is 1 when it is inserted and grows by 1 on every ``access`` (and on every
    ``insert`` of the already tracked key). Counts never decay and are forgotten when the key stops
    being tracked.

    Victim order: increasing frequency; within one frequency, by the time the key reached that
    frequency (its last hit), oldest first. Pinned keys are skipped in place and keep their count.

    Cost: ``insert``/``access``/``remove`` O(1) (the constant-time LFU of Shah, Mitra & Matani,
    2010: a linked list of frequency buckets); ``evict`` O(victims + pinned keys skipped).
    """

    name = "lfu"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._bucket_of: dict[Key, _Bucket] = {}
        self._head: _Bucket | None = None  # lowest frequency

    # -- bucket list -----------------------------------------------------------------------
    def _link_after(self, bucket: _Bucket, prev: _Bucket | None) -> None:
        """Link ``bucket`` after ``prev`` (at the head when ``prev`` is None)."""
        nxt = self._head if prev is None else prev.next
        bucket.prev = prev
        bucket.next = nxt
        if prev is None:
            self._head = bucket
        else:
            prev.next = bucket
        if nxt is not None:
            nxt.prev = bucket

    def _unlink(self, bucket: _Bucket) -> None:
        if bucket.prev is None:
            self._head = bucket.next
        else:
            bucket.prev.next = bucket.next
        if bucket.next is not None:
            bucket.next.prev = bucket.prev

    def _drop(self, key: Key, bucket: _Bucket) -> None:
        del bucket.keys[key]
        if not bucket.keys:
            self._unlink(bucket)

    # -- contract --------------------------------------------------------------------------
    def insert(self, key: Key, parent: Key | None = None) -> None:
        if key in self._bucket_of:
            self.access(key)
            return
        head = self._head
        if head is None or head.freq != 1:
            head = _Bucket(1)
            self._link_after(head, None)
        head.keys[key] = None
        self._bucket_of[key] = head

    def access(self, key: Key) -> None:
        bucket = self._bucket_of.get(key)
        if bucket is None:
            return
        target = bucket.next
        if target is None or target.freq != bucket.freq + 1:
            target = _Bucket(bucket.freq + 1)
            self._link_after(target, bucket)
        target.keys[key] = None
        self._bucket_of[key] = target
        self._drop(key, bucket)  # after linking target, so ``bucket`` is still its neighbour

    def remove(self, key: Key) -> None:
        bucket = self._bucket_of.pop(key, None)
        if bucket is not None:
            self._drop(key, bucket)

    def evict(self, n: int, is_pinned: IsPinned = never_pinned) -> list[Key]:
        victims: list[Key] = []
        bucket = self._head
        while bucket is not None and len(victims) < n:
            for key in bucket.keys:  # no mutation while iterating: collect, then delete
                if not is_pinned(key):
                    victims.append(key)
                    if len(victims) == n:
                        break
            bucket = bucket.next
        for key in victims:
            self.remove(key)
        return victims

    def frequency(self, key: Key) -> int:
        """The key's current count (0 when untracked); for tests and debugging."""
        bucket = self._bucket_of.get(key)
        return 0 if bucket is None else bucket.freq

    def __contains__(self, key: object) -> bool:
        return key in self._bucket_of

    def __len__(self) -> int:
        return len(self._bucket_of)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._bucket_of)
