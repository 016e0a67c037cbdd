"""Per-namespace traffic counters of the store: lookup hits and misses (blocks), and reads' and
loads' misses by reason, for the admin API's per-namespace stats.

Keys do not carry their namespace (a key is a hash chained from the namespace seed), so only a
call that names its namespace is counted here: ``lookup(..., namespace_id=)``, ``get``,
``prefetch``, ``prepare_load``, and what connectors tell: their load-or-recompute declines and
their failed loads and saves by reason (:meth:`NamespaceCounts.failed`). A lookup without
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
    # blocks a connector failed to load (it recomputed them) or to save (a later miss), by
    # reason (:data:`FAILURE_REASONS`), as it told the store
    load_failed_error: int = 0
    load_failed_miss: int = 0
    load_failed_timeout: int = 0
    load_failed_lease_expired: int = 0
    load_failed_not_prefetched: int = 0
    load_failed_changed: int = 0
    load_failed_unavailable: int = 0
    save_failed_error: int = 0
    save_failed_reserve: int = 0
    save_failed_unavailable: int = 0

    def plus(self, other: NamespaceCounts) -> NamespaceCounts:
        return NamespaceCounts(*(a + b for a, b in zip(self, other)))

    def failed(self, what: str) -> dict[str, int]:
        """Blocks whose ``what`` ("load" or "save") failed, by reason (every reason, zeros too)."""
        return {r: getattr(self, f"{what}_failed_{r}") for r in FAILURE_REASONS[what]}

    @staticmethod
    def of_failure(what: str, reason: str, num_blocks: int) -> NamespaceCounts:
        """The counts of ``num_blocks`` blocks whose ``what`` failed for ``reason``. Raises
        InvalidArgument for a pair not in :data:`FAILURE_REASONS` (a client cannot add rows)."""
        if reason not in FAILURE_REASONS.get(what, ()):
            raise InvalidArgument(
                f"unknown failure {what!r}/{reason!r}",
                hint="what is one of " + "; ".join(
                    f"{w!r} (reasons {', '.join(map(repr, rs))})" for w, rs in FAILURE_REASONS.items()))
        return NamespaceCounts(**{f"{what}_failed_{reason}": num_blocks})


#: why a connector's load or save of blocks fails -- a closed set, one counter each. Loads:
#: ``error`` (an exception: the daemon gone mid-load, say), ``miss`` (absent or failed its check),
#: ``timeout`` (not in host when the prefetch timeout ran out), ``lease_expired``,
#: ``not_prefetched`` (below host under ``best_effort``), ``changed`` (replaced during the copy),
#: ``unavailable`` (the store could not be asked: the daemon unreachable). Saves: ``error``
#: (publishing failed), ``reserve`` (reserving slots raised), ``unavailable`` (as for loads).
FAILURE_REASONS: dict[str, tuple[str, ...]] = {
    "load": ("error", "miss", "timeout", "lease_expired", "not_prefetched", "changed",
             "unavailable"),
    "save": ("error", "reserve", "unavailable"),
}


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


__all__ = ["FAILURE_REASONS", "MAX_NAMESPACES", "NamespaceCounters", "NamespaceCounts", "NamespaceSnapshot"]
