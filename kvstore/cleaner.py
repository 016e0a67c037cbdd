"""Eviction ahead of need: each local tier keeps a free reserve, refilled on the mover.

Without it, the writer that finds a tier full evicts there and then: it writes the victims back
to the tier below (and that tier may have to evict into the one below it), on the writer's own
thread -- an engine's scheduling thread when the writer is a connector's save or the engine's
block allocation. With it, once a tier has had to evict (it is full and in use), a cleaner
keeps between ``low`` and ``high`` pages of room free in it: when a write or an allocation
leaves less than ``low``, the tier's cleaner lane evicts by the tier's policy, write-back
included, until ``high`` pages are free. Writers then find room and evict nothing; one that
finds none (the cleaner is behind: the tier below is slower than the writes) evicts for itself
as before, counted in ``kvstore_inline_evictions_total{tier}``.

A tier only starts cleaning once a writer had to evict in it: a tier that is filling keeps every
page it was given. Shared tiers (Redis) are never cleaned: other nodes write and expire them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from typing import TYPE_CHECKING

from kvstore.errors import InvalidArgument

if TYPE_CHECKING:  # the config imports DEFAULT_RESERVE: no tier code at import time
    from kvstore.metrics import Metrics
    from kvstore.tiers.base import Tier

#: the default share of a tier's capacity kept free once it is full (``store.free_reserve``)
DEFAULT_RESERVE = 0.05
#: how long a tier's cleaner rests after a pass that found nothing to evict (every page pinned
#: by a lease or in use by a request): re-scanning such a policy on every write would hold the
#: store lock for nothing
REST_S = 0.05


def check_reserve(fraction: float) -> None:
    """InvalidArgument unless ``fraction`` is a share of capacity in [0, 0.5]."""
    if not (isinstance(fraction, (int, float)) and 0.0 <= fraction <= 0.5):
        raise InvalidArgument(f"free_reserve is a share of a tier's capacity in [0, 0.5], "
                              f"got {fraction!r}")


class Cleaner:
    """Keeps each tier's free reserve. ``room(ti)`` is the free room of tier ``ti`` (taking the
    store's lock); ``evict(ti, n)`` evicts up to ``n`` pages of it by its policy, write-back
    included, and returns how many left; ``submit(fn, *args, lane=)`` queues a job on the
    mover (False once it is closed)."""

    def __init__(
        self,
        tiers: Sequence[Tier],
        fraction: float,
        *,
        room: Callable[[int], int],
        evict: Callable[[int, int], int],
        submit: Callable[..., bool],
        metrics: Metrics,
    ) -> None:
        check_reserve(fraction)
        self._low = [0 if t.shared else int(t.capacity_pages * fraction) for t in tiers]
        self._high = [min(2 * low, t.capacity_pages // 2) for low, t in zip(self._low, tiers)]
        self._lanes = [f"clean-{t.name}" for t in tiers]
        self._pressure = [False] * len(tiers)
        self._rest_until = [0.0] * len(tiers)
        self.rest_s = REST_S
        self._queued = [False] * len(tiers)
        self._lock = threading.Lock()
        self._room, self._evict, self._submit = room, evict, submit
        self._inline = metrics.counter(
            "kvstore_inline_evictions",
            "Pages a writer or an engine's block allocation evicted itself (with their "
            "write-back, on its own thread) because the tier's free reserve was used up.",
            ["tier"])
        self._names = [t.name for t in tiers]

    def reserve(self, ti: int) -> tuple[int, int]:
        """Tier ``ti``'s (low, high) water marks in pages; (0, 0): never cleaned."""
        return self._low[ti], self._high[ti]

    def note_inline(self, ti: int, n: int) -> None:
        """A writer had to evict in tier ``ti`` itself (``n`` pages; 0 when every page was
        pinned): the tier is full and in use, so from now on it keeps its reserve."""
        self._pressure[ti] = True
        if n > 0:
            self._inline.labels(self._names[ti]).inc(n)

    def check(self, ti: int) -> None:
        """After a write or an allocation in tier ``ti``: queue its cleaning when its room fell
        below the low water mark (once; a queued cleaning covers later checks)."""
        if not self._pressure[ti] or self._queued[ti] or not self._low[ti]:
            return
        if self._rest_until[ti] and time.monotonic() < self._rest_until[ti]:
            return
        if self._room(ti) >= self._low[ti]:
            return
        with self._lock:
            if self._queued[ti]:
                return
            self._queued[ti] = True
        if not self._submit(self._clean, ti, lane=self._lanes[ti]):
            self._queued[ti] = False

    def _clean(self, ti: int) -> None:
        freed = 0
        try:
            need = self._high[ti] - self._room(ti)
            if need > 0:
                freed = self._evict(ti, need)
                self._rest_until[ti] = 0.0 if freed else time.monotonic() + self.rest_s
        finally:
            with self._lock:
                self._queued[ti] = False
        if freed:  # writers may have used the room meanwhile; nothing freed: all pinned, stop
            self.check(ti)


__all__ = ["DEFAULT_RESERVE", "REST_S", "Cleaner", "check_reserve"]
