"""Lookups and leases: the longest run of leading keys some tier holds, with the fastest tier
of each and the estimated seconds to load each run; a leased lookup pins what it reports until
the load (or the lease's expiry). The protocol that keeps a lease's promise while evictions run
is in :mod:`kvstore.leases`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from concurrent.futures import Future

from kvstore.checks import check_keys, check_namespace
from kvstore.namespace_stats import NamespaceCounts
from kvstore.results import Lease, LookupResult, load_estimates, merge_runs
from kvstore.store_state import StoreState
from kvstore.tiers.base import MissTally, Tier


class Lookups:
    def __init__(self, state: StoreState) -> None:
        self._st = state
        self._m_lookup_hit = state.metrics.lookups.labels("hit")
        self._m_lookup_miss = state.metrics.lookups.labels("miss")

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False,
               local_only: bool = False, namespace_id: bytes | None = None) -> LookupResult:
        """:meth:`kvstore.store.TieredStore.lookup` (its contract is there)."""
        self._st.check_open()
        check_keys(keys)
        if namespace_id is not None:
            check_namespace(namespace_id)
        tally = MissTally() if namespace_id is not None else None
        t0 = time.perf_counter()
        runs: list[tuple[Tier, int]] = []  # the hit as runs of one tier
        removals = self._st.removals  # read before the tiers are asked (see _still_held)
        asked = [t for t in self._st.tiers if not (local_only and t.shared)]
        pos, n = 0, len(keys)
        while pos < n:
            for ti, tier in enumerate(asked):
                run = tier.count_leading_checked(keys[pos:], tally)
                if run:
                    if ti:  # hand back the part of the run that a faster tier also holds
                        # (the whole run of checked keys passes as it is: no copy, no check)
                        window = keys if pos == 0 and run == n else keys[pos : pos + run]
                        for faster in asked[:ti]:
                            there = faster.contains(window)
                            if True in there:  # scanned in C
                                run = there.index(True)
                                window = window[:run]
                    runs.append((tier, run))
                    pos += run
                    break
            else:
                break
        granted: Lease | None = None
        if lease and pos:
            with self._st.lock:
                # The run was found without the lock: a page evicted since is not leased. Under
                # the lock a local tier's policy tracks exactly its pages (retiring victims
                # included), and from the grant on no eviction takes them. No page left any
                # policy since the tiers were asked: every page found is still there.
                if self._st.removals != removals or self._st.deletes_in_flight:
                    pos = self._still_held(keys, runs, pos)
                granted = self._st.leases.grant(keys[:pos]) if pos else None
        if len(runs) == 1:  # the usual hit, in one tier: one C-speed repeat
            tiers: Sequence[str] = (runs[0][0].name,) * pos
        else:
            tiers = list(itertools.chain.from_iterable(itertools.repeat(t.name, n) for t, n in runs))
            del tiers[pos:]
        self._m_lookup_hit.inc(pos)
        self._m_lookup_miss.inc(n - pos)
        if namespace_id is not None:
            assert tally is not None
            self._st.namespace_counts.add(namespace_id, NamespaceCounts(
                lookup_hit=pos, lookup_miss=n - pos, expired=tally.expired, timeout=tally.failed))
        self._st.metrics.lookup_latency.observe(time.perf_counter() - t0)
        load_s = load_estimates(merge_runs(((t.name, k) for t, k in runs), pos),
                                self._st.layout.page_bytes, self._st.bw.get) if pos else ()
        return LookupResult(pos, tuple(tiers), granted, load_s)

    def _still_held(self, keys: Sequence[bytes], runs: list[tuple[Tier, int]], pos: int) -> int:
        """How many of the first ``pos`` keys (found in ``runs`` of one tier each) their local
        tier still holds (lock held); a shared tier's pages are taken as found (other nodes
        delete them anyway: a later miss)."""
        start = 0
        for tier, n in runs:
            ti = self._st.by_name[tier.name]
            policy, run = self._st.policies[ti], keys[start:start + n]
            # the usual answer, all still held, at C speed; key by key only when one is gone
            if not tier.shared and not policy.tracks_all(run):
                retiring = self._st.retiring[ti]
                for i, k in enumerate(run):
                    if k not in policy and k not in retiring:
                        return start + i
            start += n
        return pos

    def lookup_async(self, keys: Sequence[bytes], *, lease: bool = False,
                     namespace_id: bytes | None = None) -> Future[LookupResult]:
        """:meth:`kvstore.store.TieredStore.lookup_async` (its contract is there)."""
        self._st.check_open()
        check_keys(keys)
        if namespace_id is not None:
            check_namespace(namespace_id)
        return self._st.executor.submit(self.lookup, list(keys), lease=lease,
                                     namespace_id=namespace_id)

    def release(self, lease: Lease | int, *, namespace_id: bytes | None = None) -> None:
        """:meth:`kvstore.store.TieredStore.release` (its contract is there)."""
        self._st.check_open()
        with self._st.lock:
            self._st.leases.release(lease)

    def narrow(self, lease: Lease, n: int, *, namespace_id: bytes | None = None) -> Lease:
        """:meth:`kvstore.store.TieredStore.narrow` (its contract is there)."""
        self._st.check_open()
        with self._st.lock:
            return self._st.leases.narrow(lease, n)

    def is_pinned(self, key: bytes) -> bool:
        self._st.check_open()
        with self._st.lock:
            self._st.leases.expire()
            return key in self._st.leases.pins


__all__ = ["Lookups"]
