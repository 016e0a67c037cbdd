"""Per-namespace traffic counters of the store: lookup hits and misses (blocks), and reads' and
loads' misses by reason, for the admin API's per-namespace stats.

Keys do not carry their namespace (a key is a hash chained from the namespace seed), so only a
call that names its namespace is counted here: ``lookup(..., namespace_id=)``, ``get``,
``prefetch``, ``prepare_load`` and the connector's load-or-recompute declines. A lookup without
a namespace (the admin API's where-is query) counts only in the store-wide metrics.

They are plain counters in the store, not Prometheus labels: a label per namespace id is an
unbounded series count in every scraper. At most ``max_namespaces`` namespaces are tracked, in
the order they were first counted; the traffic of every later one goes to one :attr:`other`
row (and :attr:`other_calls` counts its calls), so memory and the cost of a snapshot are
bounded whatever tenants do.

Cost on the hot path: one lock and one small tuple per call (a call is one namespace), never a
loop over its keys. Rows are immutable tuples replaced on update, so a snapshot is a shallow
copy of one dict and snapshots taken over time share the rows that did not change.

Thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import NamedTuple

from kvstore.errors import InvalidArgument

#: namespaces tracked by default; the rest are summed into :attr:`NamespaceCounters.other`
MAX_NAMESPACES = 1024


class NamespaceCounts(NamedTuple):
    """One namespace's counters since the store started (blocks, or pages: one each)."""

    lookup_hit: int = 0  # blocks of the leading run a lookup found
    lookup_miss: int = 0  # blocks a lookup asked for past that run (absent)
    load_hit: int = 0  # pages a load (prepare_load) pinned, or a get read
    load_miss: int = 0  # pages a load or a get asked for and did not get
    corrupt: int = 0  # records a read dropped because they failed verification
    expired: int = 0  # pages found gone after their TTL ran out (lookups and reads)
    timeout: int = 0  # pages asked of a tier call that failed whole (timeout, unreachable)
    declined: int = 0  # matched blocks the connector recomputed instead (load-or-recompute)

    def plus(self, other: NamespaceCounts) -> NamespaceCounts:
        return NamespaceCounts(*(a + b for a, b in zip(self, other)))


ZERO = NamespaceCounts()


@dataclass(frozen=True, slots=True)
class NamespaceSnapshot:
    """The counters at one moment: ``rows`` per tracked namespace id, ``other`` for the
    namespaces past the cap (``other_calls``: how many calls they made)."""

    rows: dict[bytes, NamespaceCounts]
    other: NamespaceCounts
    other_calls: int

    def get(self, namespace_id: bytes) -> NamespaceCounts:
        return self.rows.get(namespace_id, ZERO)


class NamespaceCounters:
    def __init__(self, max_namespaces: int = MAX_NAMESPACES) -> None:
        if not isinstance(max_namespaces, int) or max_namespaces < 0:
            raise InvalidArgument(f"max_namespaces must be an int >= 0, got {max_namespaces!r}")
        self.max_namespaces = max_namespaces
        self._lock = threading.Lock()
        self._rows: dict[bytes, NamespaceCounts] = {}
        self._other = ZERO
        self._other_calls = 0

    def add(self, namespace_id: bytes, delta: NamespaceCounts) -> None:
        """Add one call's counts to ``namespace_id``'s row (or to :attr:`other` once
        ``max_namespaces`` others are tracked)."""
        with self._lock:
            rows = self._rows
            old = rows.get(namespace_id)
            if old is not None:
                rows[namespace_id] = old.plus(delta)
            elif len(rows) < self.max_namespaces:
                rows[namespace_id] = delta
            else:
                self._other = self._other.plus(delta)
                self._other_calls += 1

    def snapshot(self) -> NamespaceSnapshot:
        with self._lock:
            return NamespaceSnapshot(dict(self._rows), self._other, self._other_calls)

    def __len__(self) -> int:
        """How many namespaces are tracked (at most ``max_namespaces``)."""
        with self._lock:
            return len(self._rows)


__all__ = ["MAX_NAMESPACES", "NamespaceCounters", "NamespaceCounts", "NamespaceSnapshot"]
