"""TieredStore: ordered tiers, their eviction policies, write policies, promotion, leases,
prefetch.

Tiers are ordered fastest first (``tiers[0]`` is where ``put`` writes by default). Each tier
has its own :class:`EvictionPolicy`.

Invariants (``check_integrity`` asserts them):

1. ``len(policy) <= capacity``, and every key a tier's policy tracks is stored in that tier —
   except in a shared tier (Redis), where other nodes delete pages; the store learns of that
   on the next read. A tier may hold keys its policy does not track transiently (between a
   write and its ``insert``) or when another process wrote them.
2. A pinned key (held by an unexpired lease) is never chosen as a victim.
3. A page's bytes come only from a tier read of that exact key and namespace: the store never
   returns a buffer whose read reported a miss.

Write policies decide when a page is copied to the next tier down:

* ``write_through`` — as soon as it is written to a tier, into every tier below it;
* ``write_back``    — when it is evicted from a tier, into the next one;
* ``selective``     — once it has been hit ``selective_hits`` times in a tier, into the next one.

A page already present in the destination is never written again. With ``promote_on_hit``, a
page read from a lower tier is copied into ``tiers[0]``.

Read bandwidth: every tier read the store makes (gets, prefetches, copies down) that returns at
least one page updates that tier's exponentially weighted average of bytes/s of pages read
(``bandwidth_alpha`` weighs the newest sample). :meth:`read_bandwidth` reports it (None until a
first successful read); connectors weigh it against recompute speed (load-or-recompute).

Concurrency: one lock guards policies, leases and hit counts. Page copies of gets and puts run
outside it — tiers are thread-safe and a tier read of a concurrently deleted key is a miss, never
other bytes. A put that must make room chooses its victims under the lock, then writes them back
(a copy down to a slower tier: disk, Redis) *outside* it, so a save that triggers write-back
never holds up lookups, leases or gets of other threads (an engine's next step); a victim
leased meanwhile is kept, not deleted. Explicit eviction (``evict``, an engine pool reclaiming
blocks) writes back under the lock.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, cast

import numpy as np

from kvstore.buffers import aligned_pages, page_views
from kvstore.errors import InvalidArgument, LeaseError
from kvstore.keys import KEY_BYTES, BlockMeta
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.policy import EvictionPolicy, make_policy
from kvstore.results import GetResult, Lease, LookupResult, PutResult, StoreStats
from kvstore.tiers.base import Tier, check_keys
from kvstore.tiers.hbm_owner import OwnedPool

WritePolicy = Literal["write_through", "write_back", "selective"]
WRITE_POLICIES: tuple[str, ...] = ("write_through", "write_back", "selective")


class TieredStore:
    def __init__(
        self,
        layout: KVLayout,
        tiers: Sequence[Tier],
        policies: Sequence[EvictionPolicy | str] | None = None,
        *,
        write_policy: WritePolicy = "write_back",
        selective_hits: int = 2,
        promote_on_hit: bool = True,
        lease_ttl_s: float = 30.0,
        prefetch_workers: int = 2,
        bandwidth_alpha: float = 0.3,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not tiers:
            raise InvalidArgument("a store needs at least one tier")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"tier names must be unique, got {names}")
        for t in tiers:
            if t.layout != layout:
                raise InvalidArgument(f"tier {t.name!r} was built for another layout")
        if write_policy not in WRITE_POLICIES:
            raise InvalidArgument(
                f"unknown write policy {write_policy!r}", hint=f"use one of {list(WRITE_POLICIES)}"
            )
        if selective_hits < 1:
            raise InvalidArgument(f"selective_hits must be >= 1, got {selective_hits}")
        if lease_ttl_s <= 0:
            raise InvalidArgument(f"lease_ttl_s must be > 0, got {lease_ttl_s}")
        if not 0.0 < bandwidth_alpha <= 1.0:
            raise InvalidArgument(f"bandwidth_alpha must be in (0, 1], got {bandwidth_alpha!r}")
        specs: Sequence[EvictionPolicy | str] = policies or ["lru"] * len(tiers)
        if len(specs) != len(tiers):
            raise InvalidArgument(f"{len(tiers)} tiers but {len(specs)} policies")
        self.layout = layout
        self.tiers: list[Tier] = list(tiers)
        self.policies: list[EvictionPolicy] = [
            make_policy(p, t.capacity_pages) if isinstance(p, str) else p
            for p, t in zip(specs, tiers)
        ]
        self.write_policy = write_policy
        self.selective_hits = selective_hits
        self.promote_on_hit = promote_on_hit
        self.lease_ttl_s = lease_ttl_s
        self.metrics = metrics if metrics is not None else tiers[0].metrics
        self._clock = clock  # injectable so tests can expire leases without sleeping
        self._by_name = {t.name: i for i, t in enumerate(tiers)}
        self._lock = threading.RLock()
        self._pins: dict[bytes, int] = {}
        self._leases: dict[int, Lease] = {}
        self._lease_heap: list[tuple[float, int]] = []
        self._lease_ids = itertools.count(1)
        self._hits: list[dict[bytes, int]] = [{} for _ in tiers]
        self._bw_alpha = bandwidth_alpha
        self._bw: dict[str, float] = {}  # tier name -> EWMA of read bytes/s
        self._executor = ThreadPoolExecutor(prefetch_workers, thread_name_prefix="kvstore-prefetch")
        self._m_lookup_hit = self.metrics.lookups.labels("hit")
        self._m_lookup_miss = self.metrics.lookups.labels("miss")
        # Warm tiers (a disk index reopened after a restart) seed their policies.
        for tier, policy in zip(self.tiers, self.policies):
            for key in tier.keys():
                meta = tier.meta(key)
                if len(policy) < policy.capacity:
                    policy.insert(key, meta.parent if meta else None)
        # A pool an engine allocates from (hbm) evicts through the store: its policy, write-back.
        for ti, tier in enumerate(self.tiers):
            if isinstance(tier, OwnedPool):
                tier.attach(_PoolOwner(self, ti))

    # ----------------------------------------------------------------- lookup and leases

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False) -> LookupResult:
        """The longest run of leading ``keys`` held by some tier, with the fastest tier of each.

        With ``lease=True`` the hit pages are pinned (never evicted) until :meth:`release` or
        until ``lease_ttl_s`` passes, so a load that follows cannot race eviction.
        """
        check_keys(keys)
        t0 = time.perf_counter()
        tiers: list[str] = []
        pos, n = 0, len(keys)
        while pos < n:
            for ti, tier in enumerate(self.tiers):
                run = tier.count_leading(keys[pos:])
                if run:
                    if ti:  # hand back the part of the run that a faster tier also holds
                        window = keys[pos : pos + run]
                        for faster in self.tiers[:ti]:
                            there = faster.contains(window)
                            run = next((i for i, h in enumerate(there) if h), run)
                            window = window[:run]
                    tiers.extend([tier.name] * run)
                    pos += run
                    break
            else:
                break
        granted: Lease | None = None
        if lease and pos:
            granted = self._new_lease(tuple(keys[:pos]))
        self._m_lookup_hit.inc(pos)
        self._m_lookup_miss.inc(n - pos)
        self.metrics.lookup_latency.observe(time.perf_counter() - t0)
        return LookupResult(pos, tuple(tiers), granted)

    def release(self, lease: Lease | int) -> None:
        """Unpin a lease's pages. Releasing an expired or unknown lease raises LeaseError."""
        lease_id = lease if isinstance(lease, int) else lease.id
        with self._lock:
            self._expire_leases()
            held = self._leases.pop(lease_id, None)
            if held is None:
                raise LeaseError(
                    f"lease {lease_id} is unknown, released or expired",
                    hint="load within lease_ttl_s of the lookup, or raise lease_ttl_s",
                )
            self._unpin(held.keys)
            self.metrics.leases.labels("released").inc()

    def narrow(self, lease: Lease, n: int) -> Lease:
        """Keep only the first ``n`` keys of ``lease`` pinned (a caller that will load fewer
        pages than it looked up must not keep the rest from eviction). Returns the narrowed
        lease (same id and expiry). Raises LeaseError for an expired or unknown lease."""
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(lease.keys):
            raise InvalidArgument(f"n must be an int in [0, {len(lease.keys)}], got {n!r}")
        with self._lock:
            self._expire_leases()
            held = self._leases.get(lease.id)
            if held is None:
                raise LeaseError(f"lease {lease.id} is unknown, released or expired")
            narrowed = Lease(held.id, held.keys[:n], held.expires_at)
            self._unpin(held.keys[n:])
            self._leases[held.id] = narrowed
            return narrowed

    def is_pinned(self, key: bytes) -> bool:
        with self._lock:
            self._expire_leases()
            return key in self._pins

    def _new_lease(self, keys: tuple[bytes, ...]) -> Lease:
        with self._lock:
            self._expire_leases()
            held = Lease(next(self._lease_ids), keys, self._clock() + self.lease_ttl_s)
            self._leases[held.id] = held
            heapq.heappush(self._lease_heap, (held.expires_at, held.id))
            for k in keys:
                self._pins[k] = self._pins.get(k, 0) + 1
            self.metrics.leases.labels("granted").inc()
            return held

    def _expire_leases(self) -> None:
        now = self._clock()
        heap = self._lease_heap
        while heap and heap[0][0] <= now:
            _, lease_id = heapq.heappop(heap)
            held = self._leases.pop(lease_id, None)
            if held is not None:
                self._unpin(held.keys)
                self.metrics.leases.labels("expired").inc()

    def _unpin(self, keys: Sequence[bytes]) -> None:
        for k in keys:
            left = self._pins[k] - 1
            if left:
                self._pins[k] = left
            else:
                del self._pins[k]

    # ----------------------------------------------------------------- put

    def put(self, metas: Sequence[BlockMeta], pages: Any, *, tier: str | None = None) -> PutResult:
        """Store pages under their blocks' identities in ``tier`` (default: the fastest).

        ``pages``: see :func:`kvstore.buffers.page_views`. Pages whose key the tier already holds
        are not written again (they count as an access). Raises InvalidArgument before anything
        changes if an argument is malformed.
        """
        ti = self._tier_index(tier)
        _check_metas(metas, self.layout)
        views = page_views(pages, self.layout, len(metas), writable=False)
        return self._store_into(ti, list(metas), views)

    def _store_into(self, ti: int, metas: list[BlockMeta], views: list[np.ndarray]) -> PutResult:
        step = self.tiers[ti].capacity_pages
        if len(metas) <= step:
            return self._store_chunk(ti, metas, views)
        # A batch larger than the tier: later chunks evict (and write back) earlier ones.
        parts = [
            self._store_chunk(ti, metas[i : i + step], views[i : i + step])
            for i in range(0, len(metas), step)
        ]
        return PutResult(*(sum(getattr(p, f) for p in parts) for f in ("stored", "existing", "refused")))

    def _store_chunk(self, ti: int, metas: list[BlockMeta], views: list[np.ndarray]) -> PutResult:
        tier, policy = self.tiers[ti], self.policies[ti]
        present = tier.contains([m.key for m in metas]) if metas else []
        new_m, new_v = [], []
        seen: set[bytes] = set()
        with self._lock:
            for meta, view, here in zip(metas, views, present):
                if here or meta.key in seen:
                    policy.access(meta.key)
                    continue
                seen.add(meta.key)
                new_m.append(meta)
                new_v.append(view)
            victims = self._choose_victims(ti, len(new_m))
        if victims:
            self._retire(ti, victims)
        stored = tier.write(new_m, new_v) if new_m else []
        ok_m = [m for m, ok in zip(new_m, stored) if ok]
        ok_v = [v for v, ok in zip(new_v, stored) if ok]
        with self._lock:
            for meta in ok_m:
                if len(policy) >= policy.capacity:  # lost a race for room: stay within capacity
                    self._make_room(ti, 1)
                policy.insert(meta.key, meta.parent)
        if self.write_policy == "write_through" and ok_m and ti + 1 < len(self.tiers):
            self.metrics.copies.labels("write_through", self.tiers[ti + 1].name).inc(len(ok_m))
            self._store_into(ti + 1, ok_m, ok_v)
        return PutResult(len(ok_m), len(metas) - len(new_m), len(new_m) - len(ok_m))

    def _make_room(self, ti: int, n: int) -> None:
        """Evict from tier ``ti`` until ``n`` more pages fit (fewer if too much is pinned).
        Called with the lock held."""
        victims = self._choose_victims(ti, n)
        if victims:
            self._retire(ti, victims)

    def _choose_victims(self, ti: int, n: int) -> list[bytes]:
        """Take victims for ``n`` more pages out of tier ``ti``'s policy (lock held). They stay
        in the tier until :meth:`_retire` writes them back and deletes them."""
        tier, policy = self.tiers[ti], self.policies[ti]
        need = max(n - tier.free_pages, len(policy) + n - policy.capacity)
        if need <= 0:
            return []
        self._expire_leases()
        pins = self._pins
        if isinstance(tier, OwnedPool):  # blocks that running requests use are pinned too
            in_use = tier.is_in_use
            victims = cast("list[bytes]", policy.evict(need, lambda k: k in pins or in_use(k)))
        else:
            victims = cast("list[bytes]", policy.evict(need, pins.__contains__))
        hits = self._hits[ti]
        for k in victims:
            hits.pop(k, None)
        return victims

    def _retire(self, ti: int, victims: list[bytes]) -> None:
        """Write ``victims`` back (write-back policy) and delete them from tier ``ti``. Runs with
        or without the lock; the delete itself is under it, and spares a victim that a lease
        pinned since it was chosen (it goes back into the policy, if the policy has room: else
        it is deleted all the same -- a failed load is recomputed, a leaked slot never returns)."""
        tier, policy = self.tiers[ti], self.policies[ti]
        if ti + 1 < len(self.tiers) and self.write_policy == "write_back":
            self._copy_down(ti, victims, "write_back")
        with self._lock:
            self._expire_leases()
            gone = []
            for k in victims:
                meta = tier.meta(k) if k in self._pins and len(policy) < policy.capacity else None
                if meta is not None:
                    policy.insert(k, meta.parent)
                else:
                    gone.append(k)
            tier.delete(gone)
            tier.count_eviction(len(gone))

    def _copy_down(self, ti: int, keys: Sequence[bytes], reason: str) -> None:
        """Copy ``keys`` from tier ``ti`` to ``ti + 1`` where they are not already present."""
        src, dst = self.tiers[ti], self.tiers[ti + 1]
        keys = [k for k, there in zip(keys, dst.contains(list(keys))) if not there]
        metas = [m for m in (src.meta(k) for k in keys) if m is not None]
        if not metas:
            return
        bufs = _scratch(len(metas), self.layout.page_bytes)
        by_ns: dict[bytes, list[int]] = {}
        for i, m in enumerate(metas):
            by_ns.setdefault(m.namespace_id, []).append(i)
        ok_m, ok_v = [], []
        for ns, idx in by_ns.items():
            found = self._timed_read(src, ns, [metas[i].key for i in idx], [bufs[i] for i in idx])
            for i, f in zip(idx, found):
                if f:
                    ok_m.append(metas[i])
                    ok_v.append(bufs[i])
        if ok_m:
            self.metrics.copies.labels(reason, dst.name).inc(len(ok_m))
            self._store_into(ti + 1, ok_m, ok_v)

    def _adopt(self, ti: int, metas: Sequence[BlockMeta]) -> None:
        """Track pages an engine committed in pool tier ``ti`` as if they had been put there
        (write-through copies them down at once)."""
        with self._lock:
            policy = self.policies[ti]
            for meta in metas:
                if len(policy) < policy.capacity:
                    policy.insert(meta.key, meta.parent)
            if self.write_policy == "write_through" and ti + 1 < len(self.tiers):
                self._copy_down(ti, [m.key for m in metas], "write_through")

    # ----------------------------------------------------------------- get

    def get(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        out: Any,
        *,
        lease: Lease | None = None,
    ) -> GetResult:
        """Read pages into ``out`` (see :func:`kvstore.buffers.page_views`), each from the
        fastest tier that holds it. Buffers of keys reported not found hold unspecified bytes.
        With ``lease``, the lease is released afterwards (also when the read fails)."""
        try:
            check_keys(keys)
            if len(namespace_id) != KEY_BYTES:
                raise InvalidArgument(f"namespace id must be {KEY_BYTES} bytes")
            views = page_views(out, self.layout, len(keys), writable=True)
            return self._get(namespace_id, list(keys), views)
        finally:
            if lease is not None:
                try:
                    self.release(lease)
                except LeaseError:
                    pass  # expired during the load: the pages were read (or missed) anyway

    def _get(self, ns: bytes, keys: list[bytes], views: list[np.ndarray]) -> GetResult:
        found: list[str | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        for ti, tier in enumerate(self.tiers):
            if not todo:
                break
            ok = self._timed_read(tier, ns, [keys[i] for i in todo], [views[i] for i in todo])
            hit_idx = [i for i, f in zip(todo, ok) if f]
            miss_keys = [keys[i] for i, f in zip(todo, ok) if not f]
            for i in hit_idx:
                found[i] = tier.name
            self._after_read(ti, [keys[i] for i in hit_idx], miss_keys)
            if ti > 0 and hit_idx and self.promote_on_hit:
                metas = [tier.meta(keys[i]) for i in hit_idx]
                pairs = [(m, views[i]) for m, i in zip(metas, hit_idx) if m is not None]
                if pairs:
                    self.metrics.copies.labels("promote", self.tiers[0].name).inc(len(pairs))
                    self._store_into(0, [p[0] for p in pairs], [p[1] for p in pairs])
            todo = [i for i, f in zip(todo, ok) if not f]
        return GetResult(tuple(f is not None for f in found), tuple(found))

    def _after_read(self, ti: int, hit_keys: list[bytes], miss_keys: list[bytes]) -> None:
        policy = self.policies[ti]
        promote_down: list[bytes] = []
        with self._lock:
            for k in miss_keys:
                # The tier no longer holds it (a failed check dropped it, a TTL expired it).
                if k in policy:
                    policy.remove(k)
            for k in hit_keys:
                if k in policy:
                    policy.access(k)
                elif len(policy) < policy.capacity:
                    meta = self.tiers[ti].meta(k)
                    policy.insert(k, meta.parent if meta else None)
            if self.write_policy == "selective" and ti + 1 < len(self.tiers):
                hits = self._hits[ti]
                for k in hit_keys:
                    count = hits.get(k, 0) + 1
                    hits[k] = count
                    if count == self.selective_hits:
                        promote_down.append(k)
            if promote_down:
                self._copy_down(ti, promote_down, "selective")

    # ----------------------------------------------------------------- read bandwidth

    def _timed_read(
        self, tier: Tier, ns: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray]
    ) -> list[bool]:
        """``tier.read``, feeding the tier's bandwidth average when it returned pages."""
        t0 = time.perf_counter()
        found = tier.read(ns, keys, outs)
        elapsed = time.perf_counter() - t0
        hits = sum(found)
        if hits:
            sample = hits * self.layout.page_bytes / max(elapsed, 1e-9)
            with self._lock:
                old = self._bw.get(tier.name)
                a = self._bw_alpha
                self._bw[tier.name] = sample if old is None else a * sample + (1 - a) * old
        return found

    def read_bandwidth(self, tier_name: str) -> float | None:
        """Measured read bandwidth of tier ``tier_name`` in bytes/s (an exponentially weighted
        average over the store's successful reads), or None before its first one."""
        self._tier_index(tier_name)  # raises InvalidArgument naming the tiers
        with self._lock:
            return self._bw.get(tier_name)

    # ----------------------------------------------------------------- prefetch, delete

    def prefetch(self, namespace_id: bytes, keys: Sequence[bytes], *, to: str | None = None) -> Future[int]:
        """Copy ``keys`` held in slower tiers into tier ``to`` (default: the fastest) in the
        background. The future yields how many leading keys ``to`` holds when done."""
        check_keys(keys)
        ti = self._tier_index(to)
        keys = list(keys)
        return self._executor.submit(self._prefetch, namespace_id, keys, ti)

    def _prefetch(self, ns: bytes, keys: list[bytes], ti: int) -> int:
        target = self.tiers[ti]
        missing = [k for k, here in zip(keys, target.contains(keys)) if not here]
        for lower in range(ti + 1, len(self.tiers)):
            if not missing:
                break
            src = self.tiers[lower]
            bufs = _scratch(len(missing), self.layout.page_bytes)
            ok = self._timed_read(src, ns, missing, bufs)
            self._after_read(lower, [k for k, f in zip(missing, ok) if f], [k for k, f in zip(missing, ok) if not f])
            metas, views = [], []
            for k, f, buf in zip(missing, ok, bufs):
                meta = src.meta(k) if f else None
                if meta is not None:
                    metas.append(meta)
                    views.append(buf)
            if metas:
                self.metrics.copies.labels("prefetch", target.name).inc(len(metas))
                self._store_into(ti, metas, views)
            missing = [k for k, f in zip(missing, ok) if not f]
        return target.count_leading(keys)

    def delete(self, keys: Sequence[bytes]) -> int:
        """Remove keys from every tier. Returns how many tier copies were deleted."""
        check_keys(keys)
        n = 0
        with self._lock:
            for ti, tier in enumerate(self.tiers):
                for k in keys:
                    self.policies[ti].remove(k)
                    self._hits[ti].pop(k, None)
                n += tier.delete(list(keys))
        return n

    def evict(self, n: int, *, tier: str | None = None) -> int:
        """Evict up to ``n`` pages from ``tier`` by its policy (write-back applies)."""
        ti = self._tier_index(tier)
        with self._lock:
            before = self.tiers[ti].used_pages
            self._make_room(ti, self.tiers[ti].free_pages + n)
            return before - self.tiers[ti].used_pages

    # ----------------------------------------------------------------- introspection

    def stats(self) -> StoreStats:
        with self._lock:
            self._expire_leases()
            leases = len(self._leases)
        v = self.metrics.value
        copies = {
            f"{reason}->{t.name}": int(v("kvstore_copies_total", reason=reason, tier=t.name))
            for reason in ("write_through", "write_back", "selective", "promote", "prefetch")
            for t in self.tiers
        }
        return StoreStats(
            tiers=tuple(t.stats() for t in self.tiers),
            lookup_hit_blocks=int(v("kvstore_lookup_blocks_total", result="hit")),
            lookup_miss_blocks=int(v("kvstore_lookup_blocks_total", result="miss")),
            active_leases=leases,
            copies={k: c for k, c in copies.items() if c},
        )

    def check_integrity(self) -> None:
        """Assert the invariants in the module docstring. For tests and debugging."""
        with self._lock:
            self._expire_leases()
            for tier, policy in zip(self.tiers, self.policies):
                assert len(policy) <= policy.capacity, f"{tier.name}: policy over capacity"
                assert tier.used_pages <= tier.capacity_pages, f"{tier.name}: over capacity"
                if tier.shared:
                    continue  # other nodes delete its pages; the policy learns on the next read
                tracked = cast("list[bytes]", list(policy))
                held = tier.contains(tracked) if tracked else []
                lost = [k.hex() for k, h in zip(tracked, held) if not h]
                assert not lost, f"{tier.name}: policy tracks keys the tier lacks: {lost[:3]}"
            pins: dict[bytes, int] = {}
            for held_lease in self._leases.values():
                for k in held_lease.keys:
                    pins[k] = pins.get(k, 0) + 1
            assert pins == self._pins, "pin counts disagree with active leases"

    def tier(self, name: str) -> Tier:
        return self.tiers[self._tier_index(name)]

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        for t in self.tiers:
            if isinstance(t, OwnedPool):
                t.attach(None)
            t.close()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tier_index(self, name: str | None) -> int:
        if name is None:
            return 0
        try:
            return self._by_name[name]
        except KeyError:
            raise InvalidArgument(
                f"no tier named {name!r}", hint=f"tiers are {list(self._by_name)}"
            ) from None


class _PoolOwner:
    """The store as the owner of pool tier ``ti`` (see kvstore.tiers.hbm_owner): victims by the
    tier's policy, written back per the write policy; commits and reuses feed the policy."""

    def __init__(self, store: TieredStore, ti: int) -> None:
        self._store, self._ti = store, ti

    def reclaim(self, num_blocks: int) -> int:
        return self._store.evict(num_blocks, tier=self._store.tiers[self._ti].name)

    def on_commit(self, metas: Sequence[BlockMeta]) -> None:
        self._store._adopt(self._ti, metas)

    def on_hit(self, keys: Sequence[bytes]) -> None:
        with self._store._lock:
            policy = self._store.policies[self._ti]
            for k in keys:
                policy.access(k)


def _scratch(n: int, page_bytes: int) -> list[np.ndarray]:
    # 4 KiB aligned, so copies through a disk tier need no bounce buffer
    return list(aligned_pages(n, page_bytes))


def _check_metas(metas: Sequence[BlockMeta], layout: KVLayout) -> None:
    for m in metas:
        if not isinstance(m, BlockMeta):
            raise InvalidArgument(
                f"put takes BlockMeta identities, got {type(m).__name__}",
                hint="use BlockChain.metas()",
            )
        if len(m.token_ids) != 4 * layout.block_size or len(m.key) != KEY_BYTES:
            raise InvalidArgument(
                f"block {m.key.hex()} has {len(m.token_ids) // 4} tokens; layout block_size is "
                f"{layout.block_size}"
            )
        if not m.verify_chain():
            raise InvalidArgument(
                f"block {m.key.hex()}: key does not hash from its parent and tokens",
                hint="build identities with Namespace.chain(); never edit BlockMeta by hand",
            )
