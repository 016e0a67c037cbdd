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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.errors import InvalidArgument

#: the share of the smallest local tier that pins may hold together (``store.max_pinned_fraction``)
DEFAULT_MAX_PINNED_FRACTION = 0.5
#: the longest time to live a pin may ask for (30 days): longer is a configuration mistake
MAX_TTL_S = 30 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Pin:
    id: int
    namespace_id: bytes
    keys: tuple[bytes, ...]
    #: the store's clock reading at which the pin lapses
    expires_at: float


@dataclass(frozen=True, slots=True)
class TierRetention:
    """One namespace in one tier: what it holds, what of that its pins keep, and its budget."""
    tier: str
    used_bytes: int
    pinned_bytes: int
    #: the most it may hold there (whole pages); None: no budget
    budget_bytes: int | None


@dataclass(frozen=True, slots=True)
class RetentionInfo:
    """A namespace's retention: its live pins and, per tier, its use, pins and budget."""
    namespace_id: bytes
    pins: tuple[Pin, ...]
    tiers: tuple[TierRetention, ...]


class Retention:
    def __init__(self, max_pages: int, clock: Callable[[], float]) -> None:
        self.max_pages = max_pages
        self._clock = clock
        self._pins: dict[int, Pin] = {}
        self._held: Counter[bytes] = Counter()  # key -> live pins naming it
        self._heap: list[tuple[float, int]] = []
        self._next_id = 1
        #: bumped by every change of the pins (a saved copy is stale when older)
        self.version = 0

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
        held = Pin(self._next_id, namespace_id, keys, self._clock() + float(ttl_s))
        self._add(held)
        return held

    def restore(self, pin_id: int, namespace_id: bytes, keys: Sequence[bytes], ttl_s: float) -> Pin:
        """Re-add a saved pin under its id (a restarted store; kvstore.retention_file),
        bounded as a new one is."""
        self.pin(namespace_id, keys, ttl_s)  # checks, then takes the next id: renumber it
        fresh = self._pins.pop(self._next_id - 1)
        held = Pin(pin_id, namespace_id, fresh.keys, fresh.expires_at)
        self._pins[pin_id] = held
        self._heap = [(t, pin_id if i == fresh.id else i) for t, i in self._heap]
        heapq.heapify(self._heap)
        self._next_id = max(self._next_id, pin_id + 1)
        return held

    def _add(self, held: Pin) -> None:
        self._pins[held.id] = held
        self._next_id = max(self._next_id, held.id + 1)
        self._held.update(held.keys)
        heapq.heappush(self._heap, (held.expires_at, held.id))
        self.version += 1

    def unpin(self, pin_id: int, namespace_id: bytes) -> bool:
        """Remove pin ``pin_id`` of ``namespace_id``; False when it has none of that id
        (expired, removed already, or another namespace's: which ids other tenants hold is
        not told)."""
        self.expire()
        held = self._pins.get(pin_id)
        if held is None or held.namespace_id != namespace_id:
            return False
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

    def pins_of(self, namespace_id: bytes) -> list[Pin]:
        """The live pins of ``namespace_id``, oldest first."""
        self.expire()
        return [p for p in self._pins.values() if p.namespace_id == namespace_id]

    def __len__(self) -> int:
        return len(self._pins)

    def all_pins(self) -> list[Pin]:
        self.expire()
        return list(self._pins.values())

    def _drop(self, held: Pin) -> None:
        self.version += 1
        del self._pins[held.id]
        self._held.subtract(held.keys)
        for k in held.keys:
            if self._held[k] <= 0:
                del self._held[k]


__all__ = ["DEFAULT_MAX_PINNED_FRACTION", "MAX_TTL_S", "Pin", "Retention", "RetentionInfo",
           "TierRetention"]
