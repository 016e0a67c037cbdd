"""Reads: ``get`` from the fastest tier holding each page, what a read teaches the policies
(hits, stale misses, ``selective`` counts), promotions, prefetch, and each tier's measured read
bandwidth. A read never waits for a write-back: its promotions and ``selective`` copies run on
the store's mover."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from kvstore.buffers import page_views
from kvstore.checks import check_keys, check_namespace
from kvstore.errors import LeaseError
from kvstore.namespace_stats import NamespaceCounts
from kvstore.results import GetResult, Lease
from kvstore.room import Room
from kvstore.store_state import StoreState
from kvstore.tiers.base import MissTally, Tier

#: background copies (promotions, selective copies) queued at most; more are skipped, counted
MAX_BACKGROUND = 64


class Reads:
    def __init__(self, state: StoreState, room: Room) -> None:
        self._st, self._room = state, room

    def get(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        out: Any,
        *,
        lease: Lease | None = None,
    ) -> GetResult:
        """:meth:`kvstore.store.TieredStore.get` (its contract is there)."""
        self._st.check_open()
        if lease is not None:
            with self._st.lock:
                if not isinstance(lease, Lease) or lease.owner != self._st.leases.owner:
                    self._st.leases.release(lease)  # raises, naming the problem
        try:
            check_keys(keys)
            check_namespace(namespace_id)
            views = page_views(out, self._st.layout, len(keys), writable=True)
            return self._get(namespace_id, list(keys), views)
        finally:
            if lease is not None:
                try:
                    with self._st.lock:
                        self._st.leases.release(lease)
                except LeaseError:
                    pass  # expired during the load: the pages were read (or missed) anyway

    def _get(self, ns: bytes, keys: list[bytes], views: list[np.ndarray]) -> GetResult:
        found: list[str | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        tally = MissTally()
        for ti, tier in enumerate(self._st.tiers):
            if not todo:
                break
            ok = self._st.timed_read(tier, ns, [keys[i] for i in todo], [views[i] for i in todo],
                                  tally)
            hit_idx = [i for i, f in zip(todo, ok) if f]
            miss_keys = [keys[i] for i, f in zip(todo, ok) if not f]
            for i in hit_idx:
                found[i] = tier.name
            self.after_read(ti, [keys[i] for i in hit_idx], miss_keys)
            if ti > 0 and hit_idx and self._st.promote_on_hit:
                self._promote_later(tier, [keys[i] for i in hit_idx], [views[i] for i in hit_idx])
            todo = [i for i, f in zip(todo, ok) if not f]
        if keys:
            self.count_reads_of(ns, len(keys) - len(todo), len(todo), tally)
        return GetResult(tuple(f is not None for f in found), tuple(found))

    def count_reads_of(self, ns: bytes, hits: int, misses: int, tally: MissTally) -> None:
        """Count a namespace's pages read (``hits``), missed, and why tiers missed them."""
        self._st.namespace_counts.add(ns, NamespaceCounts(
            load_hit=hits, load_miss=misses, corrupt=tally.corrupt, expired=tally.expired,
            timeout=tally.failed))

    def _promote_later(self, src: Tier, keys: list[bytes], views: list[np.ndarray]) -> None:
        """Copy pages just read from ``src`` into ``tiers[0]`` on the mover thread (from a
        private copy: the caller owns its buffers once the get returns)."""
        metas = [src.meta(k) for k in keys]
        pairs = [(m, v) for m, v in zip(metas, views) if m is not None]
        if not pairs:
            return
        top = self._st.tiers[0].name
        if len(self._st.mover) >= MAX_BACKGROUND:
            self._st.metrics.copies.labels("promote_skipped", top).inc(len(pairs))
            return
        bufs = self._st.scratch(len(pairs))
        for buf, (_, v) in zip(bufs, pairs):
            np.copyto(buf, v)
        self._st.metrics.copies.labels("promote", top).inc(len(pairs))
        self._st.background(self._room.store_into, 0, [m for m, _ in pairs], bufs)

    def after_read(self, ti: int, hit_keys: list[bytes], miss_keys: list[bytes]) -> None:
        """Feed a read's hits and misses to tier ``ti``'s policy; schedule ``selective``
        copies down."""
        tier, policy = self._st.tiers[ti], self._st.policies[ti]
        promote_down: list[bytes] = []
        with self._st.lock:
            retiring = self._st.retiring[ti]
            stale = [k for k in miss_keys if k in policy and k not in retiring]
            if stale and not tier.shared:
                # a miss may be stale: the page can have been written since the read missed it
                stale = [k for k, here in zip(stale, tier.contains(stale)) if not here]
            for k in stale:
                policy.remove(k)  # a failed check dropped it, a TTL expired it, another deleted it
            self._st.removals += bool(stale)
            # a local tier drops a page only when its check fails; a shared one's expire (TTL,
            # the server's own eviction, another node's delete)
            self._st.record("removed", ti, stale, [],
                            reason="expired" if tier.shared else "corrupt")
        with self._st.lock:
            if policy.tracks_all(hit_keys):  # the usual case, in bulk (a 32K-token load: 2048)
                untracked: list[bytes] = []
                policy.access_many(hit_keys)
            else:
                deleting = self._st.deleting[ti]
                untracked = [k for k in hit_keys
                             if k not in policy and k not in retiring and k not in deleting]
                if untracked and not tier.shared:
                    untracked = [k for k, here in zip(untracked, tier.contains(untracked)) if here]
                policy.access_many([k for k in hit_keys if k in policy])
            for k in untracked:
                if len(policy) + self._st.claimed[ti] < policy.capacity:
                    meta = tier.meta(k)
                    policy.insert(k, meta.parent if meta else None)
                    self._st.record("stored", ti, [k], [meta.namespace_id if meta else None])
            if self._st.write_policy == "selective" and ti + 1 < len(self._st.tiers):
                hits = self._st.hits[ti]
                for k in hit_keys:
                    count = hits.get(k, 0) + 1
                    hits[k] = count
                    if count == self._st.selective_hits:
                        promote_down.append(k)
        if promote_down:
            self._st.background(self._room.copy_down, ti, promote_down, "selective")

    def read_bandwidth(self, tier_name: str) -> float | None:
        """:meth:`kvstore.store.TieredStore.read_bandwidth` (its contract is there)."""
        self._st.check_open()
        self._st.tier_index(tier_name)  # raises InvalidArgument naming the tiers
        return self._st.bw.get(tier_name)

    def prefetch(self, namespace_id: bytes, keys: Sequence[bytes], *, to: str | None = None) -> Future[int]:
        """:meth:`kvstore.store.TieredStore.prefetch` (its contract is there)."""
        self._st.check_open()
        check_keys(keys)
        check_namespace(namespace_id)
        ti = self._st.tier_index(to)
        keys = list(keys)
        return self._st.executor.submit(self._prefetch, namespace_id, keys, ti)

    def _prefetch(self, ns: bytes, keys: list[bytes], ti: int) -> int:
        target = self._st.tiers[ti]
        missing = [k for k, here in zip(keys, target.contains(keys)) if not here]
        tally = MissTally()
        for lower in range(ti + 1, len(self._st.tiers)):
            if not missing:
                break
            src = self._st.tiers[lower]
            bufs = self._st.scratch(len(missing))
            ok = self._st.timed_read(src, ns, missing, bufs, tally)
            self.after_read(lower, [k for k, f in zip(missing, ok) if f], [k for k, f in zip(missing, ok) if not f])
            metas, views = [], []
            for k, f, buf in zip(missing, ok, bufs):
                meta = src.meta(k) if f else None
                if meta is not None:
                    metas.append(meta)
                    views.append(buf)
            if metas:
                self._st.metrics.copies.labels("prefetch", target.name).inc(len(metas))
                self._room.store_into(ti, metas, views)
            missing = [k for k, f in zip(missing, ok) if not f]
        if tally.corrupt or tally.expired or tally.failed:  # the load that follows counts the rest
            self.count_reads_of(ns, 0, 0, tally)
        return target.count_leading(keys)


__all__ = ["MAX_BACKGROUND", "Reads"]
