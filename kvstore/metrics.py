"""The one metrics registry (prometheus-client). The admin API exposes ``Metrics.registry``.

Each store owns a registry (not the process-global one) so that two stores in one process, as
in tests and benchmarks, never share or clash. Hot paths increment pre-bound label children.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Latency buckets from 10 us (a host hit) to 10 s (a hung remote call hitting its timeout).
_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._extra: dict[str, Counter] = {}
        self._extra_lock = threading.Lock()
        r = self.registry
        self.pages = Counter(
            "kvstore_tier_pages", "Pages by tier, operation and result.", ["tier", "op", "result"],
            registry=r,
        )
        self.bytes = Counter(
            "kvstore_tier_bytes", "Payload bytes moved by tier and direction.",
            ["tier", "direction"], registry=r,
        )
        self.evictions = Counter(
            "kvstore_tier_evictions", "Pages evicted by tier.", ["tier"], registry=r
        )
        self.errors = Counter(
            "kvstore_tier_errors", "Failed tier operations by tier and operation.",
            ["tier", "op"], registry=r,
        )
        self.corrupt = Counter(
            "kvstore_tier_corrupt_records",
            "Records that failed verification (dropped and served as misses), by reason.",
            ["tier", "reason"], registry=r,
        )
        self.expired = Counter(
            "kvstore_tier_expired_pages",
            "Pages this node stored that a read or a presence check (lookup, put) found gone "
            "after their TTL ran out (tiers with a TTL), by tier and operation.",
            ["tier", "op"], registry=r,
        )
        self.latency = Histogram(
            "kvstore_tier_op_seconds", "Tier batch operation latency.", ["tier", "op"],
            buckets=_BUCKETS, registry=r,
        )
        self.occupancy = Gauge(
            "kvstore_tier_occupancy_pages", "Pages used and capacity by tier.", ["tier", "state"],
            registry=r,
        )
        self.lookups = Counter(
            "kvstore_lookup_blocks", "Blocks asked for in lookups, by result.", ["result"],
            registry=r,
        )
        self.lookup_latency = Histogram(
            "kvstore_lookup_seconds", "Store lookup latency.", buckets=_BUCKETS, registry=r
        )
        self.copies = Counter(
            "kvstore_copies", "Pages copied between tiers, by reason and destination.",
            ["reason", "tier"], registry=r,
        )
        self.leases = Counter(
            "kvstore_leases", "Leases by outcome.", ["outcome"], registry=r
        )

    def counter(self, name: str, documentation: str, labelnames: Sequence[str]) -> Counter:
        """A counter of a component that not every store has (a disk tier's bounce copies, a
        connector's decisions), registered on this registry on first use and shared after."""
        with self._extra_lock:
            c = self._extra.get(name)
            if c is None:
                c = self._extra[name] = Counter(name, documentation, list(labelnames),
                                                registry=self.registry)
            return c

    def value(self, name: str, **labels: str) -> float:
        """Current value of one sample (``name`` as exposed, e.g. ``kvstore_tier_pages_total``)."""
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else v


@dataclass(frozen=True, slots=True)
class TierStats:
    """A snapshot of one tier's counters."""

    name: str
    kind: str
    capacity_pages: int
    used_pages: int
    page_bytes: int
    hits: int
    misses: int
    writes: int
    writes_refused: int
    deletes: int
    bytes_read: int
    bytes_written: int
    evictions: int
    errors: int
    corrupt: int


#: A circuit breaker's state (a tier spread over servers keeps one per server).
BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class ServerStats:
    """A snapshot of one server's counters, as one tier instance sees them (a tier spread over
    servers, such as Redis, reports one per server)."""

    server: str
    breaker: BreakerState
    #: Pipelined exchanges started with this server (one per call touching it, plus retries).
    exchanges: int
    #: Calls that failed (unreachable, timed out, broken stream) after their retries.
    failures: int
    #: Calls answered at once because the breaker was open.
    rejected: int
    #: Times the breaker opened.
    trips: int


@dataclass(frozen=True, slots=True)
class TierHealth:
    """Whether a tier can serve now (``Tier.health``): ``ready``, else ``detail`` says why;
    ``servers``: each server's breaker and counters, for a tier spread over servers (else
    empty)."""

    ready: bool
    detail: str = ""
    servers: tuple[ServerStats, ...] = ()


__all__ = ["BreakerState", "Metrics", "ServerStats", "TierHealth", "TierStats"]
