"""What one Redis tier instance knows about keys without asking a server: the pages it owns
(wrote and has not deleted or seen vanish) with their TTL deadlines, a bounded cache of recently
written or verified headers for ``meta``, and the keys whose values failed verification.

Thread-safe: one lock guards all three, never held while talking to a server.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from kvstore.keys import BlockMeta

_META_CACHE = 4096  # recent headers kept for meta()


class KeyBook:
    """The owned pages, the header cache and the rejected keys of one tier instance."""

    def __init__(self, ttl_s: float | None) -> None:
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        #: pages this instance wrote and has not deleted or seen vanish -> the monotonic time by
        #: which their TTL has surely run out (inf: no TTL)
        self._owned: dict[bytes, float] = {}
        self._metas: OrderedDict[bytes, BlockMeta] = OrderedDict()
        #: Keys whose value failed verification when read (most recent last, bounded): present
        #: in Redis, but not pages — contains() answers False, so their owner's put rewrites them.
        self._rejected: OrderedDict[bytes, None] = OrderedDict()

    def owned(self) -> int:
        """Pages this instance wrote and has not deleted or seen vanish."""
        return len(self._owned)

    def wrote(self, metas: Sequence[BlockMeta]) -> None:
        """Pages just stored by this instance: owned (expiring ``ttl_s`` from now), cached."""
        deadline = time.monotonic() + self._ttl_s if self._ttl_s else math.inf
        with self._lock:
            self._owned.update(dict.fromkeys([m.key for m in metas], deadline))
        self.remember(metas)

    def remember(self, metas: Sequence[BlockMeta], *, refreshed: bool = False) -> None:
        """Headers just written or verified by a read: cached for meta(), no longer rejected.
        ``refreshed``: the read reset their TTL (GETEX), so owned pages expire later."""
        deadline = time.monotonic() + self._ttl_s if refreshed and self._ttl_s else None
        with self._lock:
            cache, owned = self._metas, self._owned
            for m in metas:
                cache[m.key] = m
                cache.move_to_end(m.key)
                self._rejected.pop(m.key, None)
                if deadline is not None and m.key in owned:
                    owned[m.key] = deadline
            while len(cache) > _META_CACHE:
                cache.popitem(last=False)

    def forget(self, keys: Sequence[bytes], *, vanished: str = "") -> int:
        """Keys deleted, or that a server answered absent to operation ``vanished``. Returns how
        many were owned pages whose TTL has surely run out by now (to count as expired)."""
        now, expired = time.monotonic(), 0
        with self._lock:
            owned, rejected = self._owned, self._rejected
            for k in keys:
                deadline = owned.pop(k, None)
                if vanished and deadline is not None and deadline <= now:
                    expired += 1
                rejected.pop(k, None)
        return expired

    def reject(self, keys: Iterable[bytes]) -> None:
        """Remember keys whose values failed verification on a read (``contains`` answers
        absent for them, so their owner's next put overwrites them)."""
        with self._lock:
            rejected = self._rejected
            for key in keys:
                rejected[key] = None
                rejected.move_to_end(key)
                self._metas.pop(key, None)
            while len(rejected) > _META_CACHE:
                rejected.popitem(last=False)

    def unrejected(self, keys: Sequence[bytes], found: list[bool]) -> list[bool]:
        """``found`` (a server's answer for ``keys``) with the rejected keys answered absent."""
        with self._lock:
            rejected = self._rejected
            if rejected:
                found = [f and k not in rejected for k, f in zip(keys, found)]
        return found

    def cached(self, key: bytes) -> tuple[bool, BlockMeta | None]:
        """``(True, meta)`` when the book answers for ``key``: its cached header, or None for a
        rejected key; ``(False, None)`` when only a server can tell."""
        with self._lock:
            if key in self._rejected:
                return True, None
            meta = self._metas.get(key)
            if meta is not None:
                self._metas.move_to_end(key)
                return True, meta
        return False, None
