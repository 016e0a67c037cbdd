"""Counters over time: a background thread samples the store's metrics every ``interval_s``
and keeps an hour of samples (:data:`RETAIN_S`), from which the admin API computes windowed hit rates and the
dashboard's rates (bytes/s, evictions/s). Lookup hits and misses come from the per-namespace
counters (summed), not the store-wide lookup metric: that metric also counts the admin API's
where-is queries, so a rate from it disagreed with every namespace's (issue 35). Reads only the metrics registry, tier occupancy and
the store's per-namespace counters (their own small lock): never takes the store lock, never
does tier I/O.

Memory: a sample's per-namespace part is a shallow copy of the store's rows, which are
immutable and shared between samples while unchanged -- at the store's cap of 1024 namespaces,
about 40 KiB a sample, 18 MiB for 15 minutes at the default 2 s interval. Only the newest
15 minutes keep it (the namespaces' windows reach no further); older samples keep the tiers',
the copies' and the summed lookup counters (about 2 KiB each, 3 MiB for the other 45 minutes
at 2 s). Both parts are deques of a fixed length (``ceil(window / interval_s) + 2``), so memory
is bounded by the interval the daemon was configured with; the history route serves at most
:data:`RETAIN_S` of it."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, replace

from kvstore.namespace_stats import ZERO, NamespaceCounts, NamespaceSnapshot
from kvstore.store import COPY_REASONS, TieredStore

WINDOW_15M_S = 900.0
RETAIN_S = 3600.0  # the longest window the history route serves (the dashboard's "1 h")


@dataclass(frozen=True, slots=True)
class TierSample:
    hits: float
    misses: float
    bytes_in: float
    bytes_out: float
    evictions: float
    used_pages: int


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # unix time
    mono: float
    tiers: dict[str, TierSample]
    copies: dict[str, float]  # "reason->tier": pages
    lookup_hit: float  # blocks, summed over every namespace's counters (see the docstring)
    lookup_miss: float
    namespaces: NamespaceSnapshot


def take(store: TieredStore) -> Sample:
    v = store.metrics.value
    tiers = {}
    for t in store.tiers:
        n = t.name
        tiers[n] = TierSample(
            v("kvstore_tier_pages_total", tier=n, op="read", result="hit"),
            v("kvstore_tier_pages_total", tier=n, op="read", result="miss"),
            v("kvstore_tier_bytes_total", tier=n, direction="in"),
            v("kvstore_tier_bytes_total", tier=n, direction="out"),
            v("kvstore_tier_evictions_total", tier=n),
            t.used_pages,
        )
    copies = {f"{r}->{t.name}": v("kvstore_copies_total", reason=r, tier=t.name)
              for r in COPY_REASONS for t in store.tiers}
    ns = store.namespace_counts.snapshot()
    total = totals(ns)
    return Sample(time.time(), time.monotonic(), tiers, copies, total.lookup_hit,
                  total.lookup_miss, ns)


def totals(ns: NamespaceSnapshot) -> NamespaceCounts:
    """Every namespace's counters summed: the tracked rows and the ones past the cap."""
    out = ns.other
    for row in ns.rows.values():
        out = out.plus(row)
    return out


def ratio(hits: float, misses: float) -> float | None:
    total = hits + misses
    return hits / total if total > 0 else None


class Sampler:
    def __init__(self, store: TieredStore, interval_s: float = 2.0) -> None:
        self.store = store
        self.interval_s = interval_s
        # invariant: every sample in _old is older than every one in _recent; _recent is full
        # before anything moves to _old, which holds them without their namespaces' rows
        self._recent: deque[Sample] = deque(maxlen=math.ceil(WINDOW_15M_S / interval_s) + 2)
        self._old: deque[Sample] = deque(
            maxlen=math.ceil((RETAIN_S - WINDOW_15M_S) / interval_s) + 2)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="kvstore-admin-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.store.closed:
                return
            self.sample()

    def now(self) -> Sample:
        """The counters now, not kept: a request's sample must not take a periodic one's place
        in the fixed-length history (a dashboard polling every interval would halve the span)."""
        return take(self.store)

    def sample(self) -> Sample:
        """Take a sample and keep it (the background thread's, every ``interval_s``)."""
        s = take(self.store)
        with self._lock:
            if len(self._recent) == self._recent.maxlen:
                self._old.append(_without_namespaces(self._recent[0]))
            self._recent.append(s)
        return s

    def samples(self) -> list[Sample]:
        """Oldest first, up to :data:`RETAIN_S`; those older than 15 minutes have no
        namespaces' rows (:attr:`Sample.namespaces` is empty, its ``other`` zero)."""
        with self._lock:
            return [*self._old, *self._recent]

    def recent(self) -> list[Sample]:
        """The last 15 minutes' samples, with their namespaces' rows, oldest first."""
        with self._lock:
            return list(self._recent)

    def since(self, now: Sample, window_s: float) -> Sample:
        """The oldest sample within ``window_s`` before ``now`` (``now`` itself if none)."""
        for s in self.recent() if window_s <= WINDOW_15M_S else self.samples():
            if now.mono - s.mono <= window_s + self.interval_s / 2:
                return s
        return now


_NO_NAMESPACES = NamespaceSnapshot({}, ZERO, 0)


def _without_namespaces(s: Sample) -> Sample:
    return replace(s, namespaces=_NO_NAMESPACES)
