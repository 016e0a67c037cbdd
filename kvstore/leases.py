"""Leases: a lookup that will be followed by a load pins its pages until the load completes or
the lease expires, so eviction cannot take them meanwhile.

A :class:`LeaseTable` belongs to one store. Lease ids are unique in the process (one counter for
every table), and each lease names the table that granted it, so a lease handed to another
store is refused with a clear error instead of releasing that store's unrelated lease of the
same id.

The table is not thread-safe on its own: the store calls it under the store lock (victim choice
reads :attr:`pins` under the same lock). Expiry is lazy: every call first drops leases whose
``expires_at`` has passed, judged by the injected ``clock``.

Pins are counted lazily too: a grant only records its lease, and its keys are counted into
:attr:`pins` when something next reads the pins (an eviction choosing victims). Most leases
live from a lookup to the load right after it and see no eviction meanwhile: their grant and
release then cost no per-key work at all (for a 2048-key prompt, ~0.15 ms less on the hit
path, and on every daemon lookup).

What a lease promises, and how the store keeps it
-------------------------------------------------

A page that ``TieredStore.lookup(..., lease=True)`` reports in tier T stays in T, readable
under the lease's namespace, until the lease is released or expires. Eviction never takes it;
an explicit ``delete`` and a page that fails verification (a miss, never wrong bytes) still
can. The lookup asks the tiers *without* the store lock and grants the lease under it, so the
store closes the gap between the two:

* Before asking the tiers the lookup reads the store's removal count; under the lock, if the
  count moved, it keeps only the leading pages that T's policy still tracks or that are still
  retiring there (chosen as victims, not yet deleted). For a tier only this store writes, the
  policy and the retiring set hold only pages T holds, under the lock.
* Every removal of a page from a local tier (a victim's delete in ``_retire``, ``delete``)
  bumps the count in the same hold of the lock, *after* the tier deleted the page. Bumped
  before, this interleaving leased a page already gone (issue 42; the window is wide when the
  delete waits for a disk tier's index commit)::

      evictor (lock held)                  leased lookup (no lock)
      -------------------                  -----------------------
      chooses K, writes it back
      removals += 1
                                           reads removals (the bumped value)
                                           asks T: K is there
      T.delete(K) ...                      waits for the lock
      ... releases the lock
                                           removals unchanged: no re-check, leases K
                                           get: K is in no tier it reads (or not in T)

* A victim chosen before the grant and deleted after it is spared (``_retire`` re-admits a
  pinned victim under the lock), and a victim's choice skips pinned keys: from the grant on no
  eviction takes a pinned page, in any tier.
* A put or promotion of a leased key replaces its slot in one step of the tier's index (the
  old slot stays with readers that pinned it): the key never leaves T meanwhile.

``tests/unit/test_store_interleavings.py`` stops a thread in each of these windows;
``tests/tiers/test_store_lease_stress.py`` runs them under load.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Sequence

from kvstore.counts import take_one_each
from kvstore.errors import InvalidArgument, LeaseError
from kvstore.metrics import Metrics
from kvstore.results import Lease

_LEASE_IDS = itertools.count(1)
_TABLE_IDS = itertools.count(1)


class LeaseTable:
    def __init__(self, ttl_s: float, clock: Callable[[], float], metrics: Metrics) -> None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not ttl_s > 0:
            raise InvalidArgument(f"lease_ttl_s must be a number > 0, got {ttl_s!r}")
        self.ttl_s = float(ttl_s)
        self.owner = next(_TABLE_IDS)
        self._clock = clock
        # the counters' children, looked up once (a lookup and its load grant and release one
        # lease each: on every hit's path)
        self._granted, self._released, self._expired = (
            metrics.leases.labels(event) for event in ("granted", "released", "expired"))
        #: key -> how many counted leases pin it (a Counter: a 2048-key prompt counts in one C
        #: loop); read through :attr:`pins`, which counts the leases granted since first
        self._pins: Counter[bytes] = Counter()
        #: live leases whose keys are not counted in _pins yet, by id
        self._uncounted: dict[int, Lease] = {}
        self._leases: dict[int, Lease] = {}
        self._heap: list[tuple[float, int]] = []

    def grant(self, keys: Sequence[bytes]) -> Lease:
        self.expire()
        held = Lease(next(_LEASE_IDS), tuple(keys), self._clock() + self.ttl_s, self.owner)
        self._leases[held.id] = held
        heapq.heappush(self._heap, (held.expires_at, held.id))
        self._uncounted[held.id] = held
        self._granted.inc()
        return held

    @property
    def pins(self) -> Counter[bytes]:
        """key -> how many live leases pin it: the victim filter of every eviction."""
        if self._uncounted:
            for held in self._uncounted.values():
                self._pins.update(held.keys)
            self._uncounted.clear()
        return self._pins

    def release(self, lease: Lease | int) -> Lease:
        """Unpin and forget ``lease``; returns it as held. Raises LeaseError for an unknown,
        released or expired lease, InvalidArgument for another store's lease (both change
        nothing)."""
        held = self._live(lease)
        del self._leases[held.id]
        self._unpin(held)
        self._released.inc()
        return held

    def narrow(self, lease: Lease, n: int) -> Lease:
        """Keep only the first ``n`` keys of ``lease`` pinned (same id and expiry)."""
        if not isinstance(lease, Lease):
            raise InvalidArgument(f"narrow takes a Lease, got {type(lease).__name__}")
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(lease.keys):
            raise InvalidArgument(f"n must be an int in [0, {len(lease.keys)}], got {n!r}")
        held = self._live(lease)
        narrowed = Lease(held.id, held.keys[:n], held.expires_at, held.owner)
        if held.id in self._uncounted:
            self._uncounted[held.id] = narrowed
        else:
            self._unpin_keys(held.keys[n:])
        self._leases[held.id] = narrowed
        return narrowed

    def is_live(self, lease: Lease) -> bool:
        """Whether ``lease`` (of this table) is still held and unexpired."""
        self.expire()
        return lease.owner == self.owner and lease.id in self._leases

    def __len__(self) -> int:
        self.expire()
        return len(self._leases)

    def expire(self) -> None:
        now = self._clock()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, lease_id = heapq.heappop(heap)
            held = self._leases.pop(lease_id, None)
            if held is not None:
                self._unpin(held)
                self._expired.inc()

    def check(self) -> None:
        """Assert that pin counts agree with the live leases (for check_integrity)."""
        self.expire()
        counts: dict[bytes, int] = {}
        for held in self._leases.values():
            for k in held.keys:
                counts[k] = counts.get(k, 0) + 1
        assert counts == self.pins, "pin counts disagree with active leases"
        assert not self._uncounted.keys() - self._leases.keys(), "a gone lease is uncounted"

    def _live(self, lease: Lease | int) -> Lease:
        if isinstance(lease, Lease):
            if lease.owner != self.owner:
                raise InvalidArgument(
                    f"lease {lease.id} was granted by another store",
                    hint="release a lease on the store whose lookup granted it",
                )
            lease_id = lease.id
        elif isinstance(lease, int) and not isinstance(lease, bool):
            lease_id = lease
        else:
            raise InvalidArgument(f"expected a Lease or a lease id, got {type(lease).__name__}")
        self.expire()
        held = self._leases.get(lease_id)
        if held is None:
            raise LeaseError(
                f"lease {lease_id} is unknown, released or expired",
                hint="load within lease_ttl_s of the lookup, or raise lease_ttl_s",
            )
        return held

    def _unpin(self, held: Lease) -> None:
        """Take ``held`` (gone from _leases) out of the pins: nothing to do if never counted."""
        if self._uncounted.pop(held.id, None) is None:
            self._unpin_keys(held.keys)

    def _unpin_keys(self, keys: Sequence[bytes]) -> None:
        take_one_each(self._pins, keys)


__all__ = ["LeaseTable"]
