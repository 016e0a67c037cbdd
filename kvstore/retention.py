"""Retention pins: a namespace keeps a prefix (a system prompt, a shared document, an agent's
context) cached for a time, in every tier.

A pin names keys of one namespace and a time to live. Until it expires or is removed, no tier's
eviction takes a pinned page: the cleaner and a writer that needs room choose other victims (a
tier whose every page is pinned refuses writes rather than drop one). A page that is not in the
store yet is pinned once it arrives. An explicit ``delete`` still removes a pinned page, and a
page that fails its check is still a miss.

Pins are bounded: together they may hold at most ``max_pinned_fraction`` of the smallest local
tier's pages, so pins cannot starve the cache of room for everything else (a pin past the bound
is refused and changes nothing).

Like :class:`~kvstore.leases.LeaseTable`, the table is not thread-safe on its own: the store
calls it under its lock, and victim choice reads :meth:`holds` under the same lock. Expiry is
lazy, judged by the store's clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.errors import InvalidArgument

#: the share of the smallest local tier that pins may hold together (``store.max_pinned_fraction``)
DEFAULT_MAX_PINNED_FRACTION = 0.5
#: the longest time to live a pin may ask for (30 days): longer is a configuration mistake
MAX_TTL_S = 30 * 24 * 3600.0
_IDS = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Pin:
    id: int
    namespace_id: bytes
    keys: tuple[bytes, ...]
    #: the store's clock reading at which the pin lapses
    expires_at: float


class Retention:
    def __init__(self, max_pages: int, clock: Callable[[], float]) -> None:
        self.max_pages = max_pages
        self._clock = clock
        self._pins: dict[int, Pin] = {}
        self._held: Counter[bytes] = Counter()  # key -> live pins naming it
        self._heap: list[tuple[float, int]] = []

    def pin(self, namespace_id: bytes, keys: Sequence[bytes], ttl_s: float) -> Pin:
        """A new pin of ``keys`` for ``ttl_s`` seconds. InvalidArgument for a TTL out of
        (0, MAX_TTL_S] or past the bound on pinned pages (nothing changes then)."""
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or \
                not 0 < ttl_s <= MAX_TTL_S:
            raise InvalidArgument(f"a pin's ttl_s is in (0, {MAX_TTL_S:.0f}] seconds, "
                                  f"got {ttl_s!r}")
        self.expire()
        keys = tuple(dict.fromkeys(keys))
        new = sum(1 for k in keys if k not in self._held)
        if len(self._held) + new > self.max_pages:
            raise InvalidArgument(
                f"pinning {len(keys)} pages would pin {len(self._held) + new}, more than the "
                f"{self.max_pages} pins may hold (store.max_pinned_fraction of the smallest "
                "local tier)", hint="unpin what is no longer needed, or pin a shorter prefix")
        held = Pin(next(_IDS), namespace_id, keys, self._clock() + float(ttl_s))
        self._pins[held.id] = held
        self._held.update(keys)
        heapq.heappush(self._heap, (held.expires_at, held.id))
        return held

    def unpin(self, pin_id: int, namespace_id: bytes) -> bool:
        """Remove pin ``pin_id`` of ``namespace_id``; False when there is none (expired,
        removed already). InvalidArgument when it is another namespace's."""
        self.expire()
        held = self._pins.get(pin_id)
        if held is None:
            return False
        if held.namespace_id != namespace_id:
            raise InvalidArgument(f"pin {pin_id} is another namespace's")
        self._drop(held)
        return True

    def holds(self, key: bytes) -> bool:
        """Whether a live pin names ``key`` (victim choice asks, lock held; expire() first)."""
        return key in self._held

    def expire(self) -> None:
        now = self._clock()
        while self._heap and self._heap[0][0] <= now:
            _, pin_id = heapq.heappop(self._heap)
            held = self._pins.get(pin_id)
            if held is not None:
                self._drop(held)

    def pinned_keys(self, namespace_id: bytes | None = None) -> list[bytes]:
        """The keys live pins hold (of one namespace, or all)."""
        self.expire()
        if namespace_id is None:
            return list(self._held)
        return list(dict.fromkeys(k for p in self._pins.values()
                                  if p.namespace_id == namespace_id for k in p.keys))

    def __len__(self) -> int:
        return len(self._pins)

    def _drop(self, held: Pin) -> None:
        del self._pins[held.id]
        self._held.subtract(held.keys)
        for k in held.keys:
            if self._held[k] <= 0:
                del self._held[k]


__all__ = ["DEFAULT_MAX_PINNED_FRACTION", "MAX_TTL_S", "Pin", "Retention"]
