"""TieredStore: ordered tiers, their eviction policies, write policies, promotion, leases,
prefetch, and the staging path connectors load and save through.

Tiers are ordered fastest first (``tiers[0]`` is where ``put`` writes by default). Each tier
has its own :class:`EvictionPolicy`.

Invariants (``check_integrity`` asserts them, between operations):

1. ``len(policy) <= capacity``; in a tier that only this store writes (not ``shared``), the
   policy tracks exactly the pages the tier holds. A shared tier (Redis) is written and purged
   by other nodes too: its policy is this node's budget, corrected on the next read.
2. A pinned key (held by an unexpired lease) is never deleted by eviction: a victim that a
   lease pinned after it was chosen is kept (the write that wanted its room is refused
   instead). A leased lookup leases only pages that, under the lock, its tiers still hold:
   each page it reports stays in the tier it reported until the lease ends (the protocol is
   in :mod:`kvstore.leases`).
3. A page's bytes come only from a tier read of that exact key and namespace: the store never
   returns a buffer whose read reported a miss.

Write policies decide when a page is copied to the next tier down:

* ``write_through`` — as soon as it is written to a tier, into every tier below it;
* ``write_back``    — when it is evicted from a tier, into the next one;
* ``selective``     — once it has been hit ``selective_hits`` times in a tier, into the next one
  (in the background).

A page already present in the destination is never written again. With ``promote_on_hit``, a
page read from a lower tier is copied into ``tiers[0]`` in the background.

Concurrency: one lock guards policies, leases, room accounting and hit counts; it is never held
during a page copy or tier I/O (local index checks excepted). A writer *claims* room under the
lock (choosing victims), writes the victims back and deletes them outside it, then writes its
pages and publishes them to the policy under the lock again. Victims between choice and delete
are *retiring*: a read hit does not re-admit them, a lease taken meanwhile spares them. A
``get`` never waits for a write-back: its promotions and ``selective`` copies run on the
store's background mover thread (:meth:`drain` waits for them).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, cast

import numpy as np

from kvstore.api import StoreAPI
from kvstore.bandwidth import BandwidthMeter
from kvstore.buffers import aligned_pages, page_views
from kvstore.checks import check_count, check_keys, check_metas, check_namespace
from kvstore.errors import InvalidArgument, LeaseError, StoreClosed
from kvstore.events import Listener, Listeners
from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.leases import LeaseTable
from kvstore.metrics import Metrics
from kvstore.mover import Mover
from kvstore.namespace_labels import NamespaceLabels, check_label
from kvstore.namespace_stats import NamespaceCounters, NamespaceCounts
from kvstore.policy import EvictionPolicy, make_policy
from kvstore.results import (
    GetResult,
    Lease,
    LookupResult,
    PutResult,
    StoreStats,
    load_estimates,
    merge_runs,
)
from kvstore.staging import LoadHandle, StoreHandle
from kvstore.staging_path import StagingPath
from kvstore.tiers.base import MissTally, Tier
from kvstore.tiers.hbm_owner import OwnedPool
from kvstore.tiers.slab import SlabSlots

log = logging.getLogger("kvstore.store")

WritePolicy = Literal["write_through", "write_back", "selective"]
WRITE_POLICIES: tuple[str, ...] = ("write_through", "write_back", "selective")
COPY_REASONS = ("write_through", "write_back", "selective", "promote", "promote_skipped", "prefetch")
#: background copies (promotions, selective copies) queued at most; more are skipped, counted
MAX_BACKGROUND = 64


class TieredStore(StagingPath):
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
        check_count("selective_hits", selective_hits, 1)
        check_count("prefetch_workers", prefetch_workers, 1)
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
        self.metrics = metrics if metrics is not None else tiers[0].metrics
        self._leases = LeaseTable(lease_ttl_s, clock, self.metrics)
        self.lease_ttl_s = self._leases.ttl_s
        self._bw = BandwidthMeter(bandwidth_alpha)
        self._by_name = {t.name: i for i, t in enumerate(tiers)}
        self._lock = threading.RLock()
        self._hits: list[dict[bytes, int]] = [{} for _ in tiers]
        self._claimed = [0] * len(tiers)  # room claimed by writers that have not published yet
        self._retiring: list[set[bytes]] = [set() for _ in tiers]  # chosen, not yet deleted
        #: keys a tier is deleting outside the lock (untracked already; counted per delete in
        #: flight), and how many such deletes run (see _begin_delete)
        self._deleting: list[Counter[bytes]] = [Counter() for _ in tiers]
        self._deletes_in_flight = 0
        #: bumped (lock held) whenever a page leaves a tier's policy or retiring set, and only
        #: once the tier has deleted it (same hold of the lock): a leased lookup reads it before
        #: asking the tiers, and one that sees no bump when it leases skips re-checking its run
        #: (see kvstore.leases, "What a lease promises")
        self._removals = 0
        self._loads: dict[int, LoadHandle] = {}
        self._stores: dict[int, StoreHandle] = {}
        self._writing: list[set[bytes]] = [set() for _ in tiers]  # keys of open store handles
        self._handle_ids = iter(range(1, 1 << 62))
        self._closed = False
        self._listeners = Listeners()
        self._executor = ThreadPoolExecutor(prefetch_workers, thread_name_prefix="kvstore-prefetch")
        self._mover = Mover()
        self._m_lookup_hit = self.metrics.lookups.labels("hit")
        self._m_lookup_miss = self.metrics.lookups.labels("miss")
        #: lookups, loads and misses per namespace, of the calls that name one (see
        #: :mod:`kvstore.namespace_stats`)
        self.namespace_counts = NamespaceCounters()
        #: who each namespace id is, as its users registered it (:meth:`label_namespace`)
        self.namespace_labels = NamespaceLabels()
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

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False,
               local_only: bool = False, namespace_id: bytes | None = None) -> LookupResult:
        """The longest run of leading ``keys`` held by some tier, with the fastest tier of each.

        With ``lease=True`` the hit pages are pinned (never evicted) until :meth:`release` or
        until ``lease_ttl_s`` passes, so a load that follows cannot race eviction. With
        ``local_only`` the shared (network) tiers are not asked: the answer never waits on a
        remote server (a scheduler thread's lookup; see :meth:`lookup_async` and
        :attr:`has_remote_tiers`). ``namespace_id``: whose lookup this is (the keys do not
        tell); its hits, misses and expired pages are counted in :attr:`namespace_counts`.
        """
        self._check_open()
        check_keys(keys)
        if namespace_id is not None:
            check_namespace(namespace_id)
        tally = MissTally() if namespace_id is not None else None
        t0 = time.perf_counter()
        runs: list[tuple[Tier, int]] = []  # the hit as runs of one tier
        removals = self._removals  # read before the tiers are asked (see _still_held)
        asked = [t for t in self.tiers if not (local_only and t.shared)]
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
            with self._lock:
                # The run was found without the lock: a page evicted since is not leased. Under
                # the lock a local tier's policy tracks exactly its pages (retiring victims
                # included), and from the grant on no eviction takes them. No page left any
                # policy since the tiers were asked: every page found is still there.
                if self._removals != removals or self._deletes_in_flight:
                    pos = self._still_held(keys, runs, pos)
                granted = self._leases.grant(keys[:pos]) if pos else None
        if len(runs) == 1:  # the usual hit, in one tier: one C-speed repeat
            tiers: Sequence[str] = (runs[0][0].name,) * pos
        else:
            tiers = list(itertools.chain.from_iterable(itertools.repeat(t.name, n) for t, n in runs))
            del tiers[pos:]
        self._m_lookup_hit.inc(pos)
        self._m_lookup_miss.inc(n - pos)
        if namespace_id is not None:
            assert tally is not None
            self.namespace_counts.add(namespace_id, NamespaceCounts(
                lookup_hit=pos, lookup_miss=n - pos, expired=tally.expired, timeout=tally.failed))
        self.metrics.lookup_latency.observe(time.perf_counter() - t0)
        load_s = load_estimates(merge_runs(((t.name, k) for t, k in runs), pos),
                                self.layout.page_bytes, self._bw.get) if pos else ()
        return LookupResult(pos, tuple(tiers), granted, load_s)

    def _still_held(self, keys: Sequence[bytes], runs: list[tuple[Tier, int]], pos: int) -> int:
        """How many of the first ``pos`` keys (found in ``runs`` of one tier each) their local
        tier still holds (lock held); a shared tier's pages are taken as found (other nodes
        delete them anyway: a later miss)."""
        start = 0
        for tier, n in runs:
            ti = self._by_name[tier.name]
            policy, run = self.policies[ti], keys[start:start + n]
            # the usual answer, all still held, at C speed; key by key only when one is gone
            if not tier.shared and not policy.tracks_all(run):
                retiring = self._retiring[ti]
                for i, k in enumerate(run):
                    if k not in policy and k not in retiring:
                        return start + i
            start += n
        return pos

    def lookup_async(self, keys: Sequence[bytes], *, lease: bool = False,
                     namespace_id: bytes | None = None) -> Future[LookupResult]:
        """:meth:`lookup` of every tier on the store's prefetch threads. A caller that drops
        the future before it is done must release the lease it carries (``add_done_callback``).
        Raises what :meth:`lookup` raises for bad keys, at once."""
        self._check_open()
        check_keys(keys)
        if namespace_id is not None:
            check_namespace(namespace_id)
        return self._executor.submit(self.lookup, list(keys), lease=lease,
                                     namespace_id=namespace_id)

    def count_declined(self, namespace_id: bytes, num_blocks: int) -> None:
        """Count ``num_blocks`` matched blocks of ``namespace_id`` that a connector recomputes
        instead of loading (load-or-recompute), in :attr:`namespace_counts`."""
        self._check_open()
        check_namespace(namespace_id)
        check_count("num_blocks", num_blocks, 0)
        if num_blocks:
            self.namespace_counts.add(namespace_id, NamespaceCounts(declined=num_blocks))

    def count_failed(self, namespace_id: bytes, what: str, reason: str, num_blocks: int) -> None:
        """Count ``num_blocks`` blocks of ``namespace_id`` whose ``what`` ("load": recomputed;
        "save": a later miss) failed in a connector for ``reason`` (one of
        :data:`~kvstore.namespace_stats.FAILURE_REASONS`), in :attr:`namespace_counts`.
        InvalidArgument for another pair."""
        self._check_open()
        check_namespace(namespace_id)
        check_count("num_blocks", num_blocks, 0)
        delta = NamespaceCounts.of_failure(what, reason, num_blocks)
        if num_blocks:
            self.namespace_counts.add(namespace_id, delta)

    def label_namespace(self, namespace_id: bytes, label: str) -> None:
        """Record ``label`` (:attr:`Namespace.label <kvstore.keys.Namespace.label>`) as the
        human name of ``namespace_id`` in :attr:`namespace_labels`, for stats; once per
        namespace is enough. Past the cap of labelled namespaces (1024) it is not kept. Raises
        InvalidArgument for a bad id or label (see :func:`kvstore.namespace_labels.check_label`)."""
        check_namespace(namespace_id)
        self.namespace_labels.set(namespace_id, check_label(label))

    @property
    def tier_names(self) -> tuple[str, ...]:
        """The tiers' names, fastest first."""
        return tuple(t.name for t in self.tiers)

    @property
    def commits_pool_itself(self) -> bool:
        """Write-through over an engine pool this store owns: the store copies the pool's
        committed pages down itself, so a connector need not save them."""
        return self.write_policy == "write_through" and any(
            isinstance(t, OwnedPool) for t in self.tiers)

    @property
    def has_remote_tiers(self) -> bool:
        """Whether some tier is shared over the network (a lookup of it may wait on a server)."""
        return any(t.shared for t in self.tiers)

    def release(self, lease: Lease | int, *, namespace_id: bytes | None = None) -> None:
        """Unpin a lease's pages. Raises LeaseError for an expired, released or unknown lease
        and InvalidArgument for another store's lease; neither changes anything.
        (``namespace_id``: the face's; a lease of this store is its caller's alone.)"""
        self._check_open()
        with self._lock:
            self._leases.release(lease)

    def narrow(self, lease: Lease, n: int, *, namespace_id: bytes | None = None) -> Lease:
        """Keep only the first ``n`` keys of ``lease`` pinned (a caller that will load fewer
        pages than it looked up must not keep the rest from eviction). Returns the narrowed
        lease (same id and expiry). Raises LeaseError for an expired or unknown lease."""
        self._check_open()
        with self._lock:
            return self._leases.narrow(lease, n)

    def is_pinned(self, key: bytes) -> bool:
        self._check_open()
        with self._lock:
            self._leases.expire()
            return key in self._leases.pins

    # ----------------------------------------------------------------- put

    def put(self, metas: Sequence[BlockMeta], pages: Any, *, tier: str | None = None) -> PutResult:
        """Store pages under their blocks' identities in ``tier`` (default: the fastest).

        ``pages``: see :func:`kvstore.buffers.page_views`. Pages whose key the tier already holds
        are not written again (they count as an access). ``refused`` counts pages the tier (or,
        under write-through, a tier below) could not take. Raises InvalidArgument before
        anything changes if an argument is malformed.
        """
        self._check_open()
        ti = self._tier_index(tier)
        check_metas(metas, self.layout)
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
        busy = 0  # pages of keys the tier is deleting now: refused (a write could land first)
        with self._lock:
            writing, deleting = self._writing[ti], self._deleting[ti]
            for meta, view, here in zip(metas, views, present):
                if deleting and meta.key in deleting:
                    busy += 1
                    continue
                if here or meta.key in seen or meta.key in writing:
                    policy.access(meta.key)
                    continue
                seen.add(meta.key)
                new_m.append(meta)
                new_v.append(view)
            victims, claim = self._claim(ti, len(new_m))
        if victims:
            claim = self._retire(ti, victims, claim)
        write_m, write_v = new_m[:claim], new_v[:claim]
        try:
            stored = tier.write(write_m, write_v) if write_m else []
        finally:
            with self._lock:
                self._claimed[ti] -= claim
        ok_m = [m for m, ok in zip(write_m, stored) if ok]
        ok_v = [v for v, ok in zip(write_v, stored) if ok]
        self._admit(ti, ok_m)
        refused = len(new_m) - len(ok_m) + busy
        if self.write_policy == "write_through" and ok_m and ti + 1 < len(self.tiers):
            self.metrics.copies.labels("write_through", self.tiers[ti + 1].name).inc(len(ok_m))
            refused += self._store_into(ti + 1, ok_m, ok_v).refused
        return PutResult(len(ok_m), len(metas) - len(new_m) - busy, refused)

    def _admit(self, ti: int, metas: Sequence[BlockMeta]) -> None:
        """Track pages just written to tier ``ti`` (their room was claimed)."""
        if not metas:
            return
        tier, policy = self.tiers[ti], self.policies[ti]
        with self._lock:
            if not tier.shared:
                # an eviction may have taken a page between its write and now: track only what
                # the tier still holds (a local index check)
                metas = [m for m, held in zip(metas, tier.contains([m.key for m in metas])) if held]
                deleting = self._deleting[ti]
                if deleting:  # a delete in flight may still remove it: _end_delete decides
                    metas = [m for m in metas if m.key not in deleting]
            for meta in metas:
                if meta.key in policy:
                    policy.access(meta.key)
                elif len(policy) < policy.capacity:
                    policy.insert(meta.key, meta.parent)
        if self._listeners and metas:
            self._listeners.emit("stored", tier.name, [m.key for m in metas],
                                 [m.namespace_id for m in metas])

    def _claim(self, ti: int, n: int) -> tuple[list[bytes], int]:
        """Claim room for ``n`` more pages in tier ``ti`` (lock held): choose the victims whose
        deletion makes it, and return them with the number of pages claimed (fewer than ``n``
        when pinned pages leave no more to evict). The caller retires the victims outside the
        lock and gives the claim back once it has admitted what it wrote."""
        if n <= 0:
            return [], 0
        tier, policy = self.tiers[ti], self.policies[ti]
        claimed, retiring = self._claimed[ti], self._retiring[ti]
        need = max(claimed + n - tier.free_pages - len(retiring) - len(self._deleting[ti]),
                   len(policy) + claimed + n - policy.capacity)
        victims: list[bytes] = []
        if need > 0:
            victims = self._choose_victims(ti, need)
        claim = max(0, min(n, policy.capacity - len(policy) - claimed))
        self._claimed[ti] += claim
        return victims, claim

    def _choose_victims(self, ti: int, n: int) -> list[bytes]:
        """Take up to ``n`` victims out of tier ``ti``'s policy (lock held); they are retiring
        until :meth:`_retire` deletes them."""
        tier, policy = self.tiers[ti], self.policies[ti]
        self._leases.expire()
        pins = self._leases.pins
        if isinstance(tier, OwnedPool):  # blocks that running requests use are pinned too
            in_use = tier.is_in_use
            victims = cast("list[bytes]", policy.evict(n, lambda k: k in pins or in_use(k)))
        else:
            victims = cast("list[bytes]", policy.evict(n, pins.__contains__))
        hits = self._hits[ti]
        for k in victims:
            hits.pop(k, None)
        self._retiring[ti].update(victims)
        self._removals += 1
        return victims

    def _retire(self, ti: int, victims: list[bytes], claim: int = 0) -> int:
        """Write ``victims`` back (write-back policy) and delete them from tier ``ti``. Called
        without the lock. A victim that a lease pinned since it was chosen is kept and goes back
        into the policy; the room it would have freed is taken off ``claim``, whose remainder
        is returned (the writer that claimed it writes that many pages)."""
        tier, policy = self.tiers[ti], self.policies[ti]
        if ti + 1 < len(self.tiers) and self.write_policy == "write_back":
            try:
                self._copy_down(ti, victims, "write_back")
            except Exception:  # noqa: BLE001 - a failed write-back loses a copy, not the tier
                log.exception("write-back from tier %r failed", tier.name)
        with self._lock:
            self._leases.expire()
            pins, retiring = self._leases.pins, self._retiring[ti]
            gone, spared = [], 0
            for k in victims:
                retiring.discard(k)
                if k in policy:
                    continue  # re-admitted meanwhile by a write of the same key: it stays
                meta = tier.meta(k) if k in pins else None
                if meta is not None:
                    policy.insert(k, meta.parent)
                    spared += 1
                else:
                    gone.append(k)
            give_up = min(spared, claim)
            self._claimed[ti] -= give_up
            spaces = self._namespaces_of(tier, gone)
            slow = bool(gone) and self._deletes_slowly(tier)
            if slow:
                self._begin_delete(ti, gone)
            elif gone and not tier.shared:
                tier.delete(gone)
            # after the delete, never before it: see _removals
            self._removals += 1
        if slow:
            self._delete_off_lock(ti, gone)
        if tier.shared:  # network I/O: outside the lock (its policy is a budget, see above)
            tier.delete(gone)
        tier.count_eviction(len(gone))
        if self._listeners:
            self._listeners.emit("removed", tier.name, gone, spaces)
        return claim - give_up

    @staticmethod
    def _deletes_slowly(tier: Tier) -> bool:
        """A local tier whose delete is I/O (a disk index transaction that may wait on an
        fsync): it runs outside the lock. A slab tier's delete is an in-memory index update and
        stays under it (its staging path relies on that)."""
        return not tier.shared and not isinstance(tier, SlabSlots)

    def _begin_delete(self, ti: int, keys: Sequence[bytes]) -> None:
        """Mark ``keys`` (untracked already) as being deleted from tier ``ti`` outside the lock
        (lock held): until :meth:`_end_delete`, writers refuse them, admissions skip them, and a
        leased lookup re-checks its run (a page found there is not leased: it is going)."""
        self._deleting[ti].update(keys)
        self._deletes_in_flight += 1
        self._removals += 1

    def _delete_off_lock(self, ti: int, keys: Sequence[bytes]) -> int:
        tier = self.tiers[ti]
        try:
            return tier.delete(keys)
        finally:
            with self._lock:
                self._end_delete(ti, keys)

    def _end_delete(self, ti: int, keys: Sequence[bytes]) -> None:
        """The delete of ``keys`` from tier ``ti`` ended (lock held). A key a writer wrote
        after the delete ran is the tier's again: tracked, as its admission would have."""
        deleting, tier, policy = self._deleting[ti], self.tiers[ti], self.policies[ti]
        deleting.subtract(keys)
        done = [k for k in dict.fromkeys(keys) if deleting[k] <= 0]
        for k in done:
            del deleting[k]
        self._deletes_in_flight -= 1
        self._removals += 1  # after the delete: see _removals
        back = [k for k, here in zip(done, tier.contains(done)) if here] if done else []
        for k in back:
            if k in policy or k in self._retiring[ti]:
                continue
            if len(policy) < policy.capacity:  # the tier holds it: the policy has its room
                meta = tier.meta(k)
                policy.insert(k, meta.parent if meta else None)
            else:  # never leave a page no policy tracks (not expected: a guard)
                tier.delete([k])

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
        (write-through copies them down, in the background)."""
        with self._lock:
            policy = self.policies[ti]
            for meta in metas:
                if meta.key not in policy and len(policy) < policy.capacity:
                    policy.insert(meta.key, meta.parent)
        if self._listeners:
            self._listeners.emit("stored", self.tiers[ti].name, [m.key for m in metas],
                                 [m.namespace_id for m in metas])
        if self.write_policy == "write_through" and ti + 1 < len(self.tiers):
            self._background(self._copy_down, ti, [m.key for m in metas], "write_through")

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
        With ``lease``, the lease is released afterwards (also when the read fails); a lease of
        another store is refused before anything is read. Promotions and ``selective`` copies
        the read causes run in the background: a get never waits for a write-back."""
        self._check_open()
        if lease is not None:
            with self._lock:
                if not isinstance(lease, Lease) or lease.owner != self._leases.owner:
                    self._leases.release(lease)  # raises, naming the problem
        try:
            check_keys(keys)
            check_namespace(namespace_id)
            views = page_views(out, self.layout, len(keys), writable=True)
            return self._get(namespace_id, list(keys), views)
        finally:
            if lease is not None:
                try:
                    with self._lock:
                        self._leases.release(lease)
                except LeaseError:
                    pass  # expired during the load: the pages were read (or missed) anyway

    def _get(self, ns: bytes, keys: list[bytes], views: list[np.ndarray]) -> GetResult:
        found: list[str | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        tally = MissTally()
        for ti, tier in enumerate(self.tiers):
            if not todo:
                break
            ok = self._timed_read(tier, ns, [keys[i] for i in todo], [views[i] for i in todo],
                                  tally)
            hit_idx = [i for i, f in zip(todo, ok) if f]
            miss_keys = [keys[i] for i, f in zip(todo, ok) if not f]
            for i in hit_idx:
                found[i] = tier.name
            self._after_read(ti, [keys[i] for i in hit_idx], miss_keys)
            if ti > 0 and hit_idx and self.promote_on_hit:
                self._promote_later(tier, [keys[i] for i in hit_idx], [views[i] for i in hit_idx])
            todo = [i for i, f in zip(todo, ok) if not f]
        if keys:
            self._count_reads_of(ns, len(keys) - len(todo), len(todo), tally)
        return GetResult(tuple(f is not None for f in found), tuple(found))

    def _count_reads_of(self, ns: bytes, hits: int, misses: int, tally: MissTally) -> None:
        """Count a namespace's pages read (``hits``), missed, and why tiers missed them."""
        self.namespace_counts.add(ns, NamespaceCounts(
            load_hit=hits, load_miss=misses, corrupt=tally.corrupt, expired=tally.expired,
            timeout=tally.failed))

    def _promote_later(self, src: Tier, keys: list[bytes], views: list[np.ndarray]) -> None:
        """Copy pages just read from ``src`` into ``tiers[0]`` on the mover thread (from a
        private copy: the caller owns its buffers once the get returns)."""
        metas = [src.meta(k) for k in keys]
        pairs = [(m, v) for m, v in zip(metas, views) if m is not None]
        if not pairs:
            return
        top = self.tiers[0].name
        if len(self._mover) >= MAX_BACKGROUND:
            self.metrics.copies.labels("promote_skipped", top).inc(len(pairs))
            return
        bufs = _scratch(len(pairs), self.layout.page_bytes)
        for buf, (_, v) in zip(bufs, pairs):
            np.copyto(buf, v)
        self.metrics.copies.labels("promote", top).inc(len(pairs))
        self._background(self._store_into, 0, [m for m, _ in pairs], bufs)

    def _after_read(self, ti: int, hit_keys: list[bytes], miss_keys: list[bytes]) -> None:
        """Feed a read's hits and misses to tier ``ti``'s policy; schedule ``selective``
        copies down."""
        tier, policy = self.tiers[ti], self.policies[ti]
        promote_down: list[bytes] = []
        with self._lock:
            retiring = self._retiring[ti]
            stale = [k for k in miss_keys if k in policy and k not in retiring]
            if stale and not tier.shared:
                # a miss may be stale: the page can have been written since the read missed it
                stale = [k for k, here in zip(stale, tier.contains(stale)) if not here]
            for k in stale:
                policy.remove(k)  # a failed check dropped it, a TTL expired it, another deleted it
            self._removals += bool(stale)
        if stale and self._listeners:
            self._listeners.emit("removed", tier.name, stale, [None] * len(stale))
        with self._lock:
            if policy.tracks_all(hit_keys):  # the usual case, in bulk (a 32K-token load: 2048)
                untracked: list[bytes] = []
                policy.access_many(hit_keys)
            else:
                deleting = self._deleting[ti]
                untracked = [k for k in hit_keys
                             if k not in policy and k not in retiring and k not in deleting]
                if untracked and not tier.shared:
                    untracked = [k for k, here in zip(untracked, tier.contains(untracked)) if here]
                policy.access_many([k for k in hit_keys if k in policy])
            for k in untracked:
                if len(policy) + self._claimed[ti] < policy.capacity:
                    meta = tier.meta(k)
                    policy.insert(k, meta.parent if meta else None)
            if self.write_policy == "selective" and ti + 1 < len(self.tiers):
                hits = self._hits[ti]
                for k in hit_keys:
                    count = hits.get(k, 0) + 1
                    hits[k] = count
                    if count == self.selective_hits:
                        promote_down.append(k)
        if promote_down:
            self._background(self._copy_down, ti, promote_down, "selective")

    # ----------------------------------------------------------------- background copies

    def _background(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the mover thread (in submission order)."""
        if not self._closed:
            self._mover.submit(fn, *args)

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until the background copies queued so far (promotions, ``selective`` and
        write-through copies down) have run. Returns False if ``timeout_s`` passed first."""
        return self._mover.drain(timeout_s)

    # ----------------------------------------------------------------- read bandwidth

    def _timed_read(
        self, tier: Tier, ns: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray],
        tally: MissTally | None = None,
    ) -> list[bool]:
        """``tier.read``, feeding the tier's bandwidth average when it returned pages."""
        t0 = time.perf_counter()
        found = tier.read(ns, keys, outs, tally)
        self._bw.sample(tier.name, sum(found) * self.layout.page_bytes, time.perf_counter() - t0)
        return found

    def read_bandwidth(self, tier_name: str) -> float | None:
        """Measured read bandwidth of tier ``tier_name`` in bytes/s (an exponentially weighted
        average over the store's successful reads), or None before its first one."""
        self._check_open()
        self._tier_index(tier_name)  # raises InvalidArgument naming the tiers
        return self._bw.get(tier_name)

    # ----------------------------------------------------------------- prefetch, delete

    def prefetch(self, namespace_id: bytes, keys: Sequence[bytes], *, to: str | None = None) -> Future[int]:
        """Copy ``keys`` held in slower tiers into tier ``to`` (default: the fastest) in the
        background. The future yields how many leading keys ``to`` holds when done."""
        self._check_open()
        check_keys(keys)
        check_namespace(namespace_id)
        ti = self._tier_index(to)
        keys = list(keys)
        return self._executor.submit(self._prefetch, namespace_id, keys, ti)

    def _prefetch(self, ns: bytes, keys: list[bytes], ti: int) -> int:
        target = self.tiers[ti]
        missing = [k for k, here in zip(keys, target.contains(keys)) if not here]
        tally = MissTally()
        for lower in range(ti + 1, len(self.tiers)):
            if not missing:
                break
            src = self.tiers[lower]
            bufs = _scratch(len(missing), self.layout.page_bytes)
            ok = self._timed_read(src, ns, missing, bufs, tally)
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
        if tally.corrupt or tally.expired or tally.failed:  # the load that follows counts the rest
            self._count_reads_of(ns, 0, 0, tally)
        return target.count_leading(keys)

    def delete(self, keys: Sequence[bytes], *, namespace_id: bytes | None = None) -> int:
        """Remove keys from every tier. Returns how many tier copies were deleted. With
        ``namespace_id``, a key a local tier holds under another namespace is refused
        (InvalidArgument) and nothing is deleted: one tenant cannot delete another's pages."""
        self._check_open()
        check_keys(keys)
        keys = list(keys)
        if namespace_id is not None:
            check_namespace(namespace_id)
            for k in keys:
                holder = self.namespace_of(k)
                if holder is not None and holder != namespace_id:
                    raise InvalidArgument(f"key {k.hex()} is held under another namespace; "
                                          "nothing was deleted")
        n = 0
        shared, slow = [], []
        removed: list[tuple[str, list[bytes], list[bytes | None]]] = []
        with self._lock:
            for ti, tier in enumerate(self.tiers):
                for k in keys:
                    self.policies[ti].remove(k)
                    self._hits[ti].pop(k, None)
                if tier.shared:
                    shared.append(tier)
                    continue
                if self._listeners:  # which of them it held, and whose they were
                    held = [k for k, here in zip(keys, tier.contains(keys)) if here]
                    removed.append((tier.name, held, self._namespaces_of(tier, held)))
                if self._deletes_slowly(tier):
                    self._begin_delete(ti, keys)
                    slow.append(ti)
                else:
                    n += tier.delete(keys)  # an in-memory index update: policy == tier
            self._removals += 1  # after the deletes (see _removals)
        for ti in slow:  # I/O outside the lock
            n += self._delete_off_lock(ti, keys)
        for tier in shared:  # network I/O outside the lock
            n += tier.delete(keys)
            removed.append((tier.name, keys, [None] * len(keys)))
        for name, gone, spaces in removed:
            self._listeners.emit("removed", name, gone, spaces)
        return n

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(StoreEvent)`` for every page stored in or removed from a tier (see
        :mod:`kvstore.events`): puts, staging saves, engine commits, evictions, deletes."""
        self._check_open()
        self._listeners.add(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def namespace_of(self, key: bytes) -> bytes | None:
        """The namespace a local tier holds ``key`` under, or None (shared tiers are not asked:
        that would be a network call)."""
        for t in self.tiers:
            if not t.shared:
                meta = t.meta(key)
                if meta is not None:
                    return meta.namespace_id
        return None

    def _namespaces_of(self, tier: Tier, keys: Sequence[bytes]) -> list[bytes | None]:
        """The namespace of each of ``keys`` in ``tier`` when someone listens and the tier can
        tell cheaply (not a shared tier: that would be a network call)."""
        if not self._listeners or not keys:
            return []
        if tier.shared:
            return [None] * len(keys)
        metas = [tier.meta(k) for k in keys]
        return [m.namespace_id if m is not None else None for m in metas]

    def evict(self, n: int, *, tier: str | None = None) -> int:
        """Evict up to ``n`` pages from ``tier`` by its policy (write-back applies, outside the
        store lock). Returns how many pages left the tier."""
        self._check_open()
        check_count("n", n, 0)
        ti = self._tier_index(tier)
        with self._lock:
            victims = self._choose_victims(ti, n)
        if not victims:
            return 0
        before = self.tiers[ti].used_pages
        self._retire(ti, victims)
        return max(0, before - self.tiers[ti].used_pages)

    def set_policy(self, tier: str, spec: str) -> EvictionPolicy:
        """Switch ``tier``'s eviction policy at run time to a new one built from ``spec`` (a
        registered name or an import path, see :func:`kvstore.policy.make_policy`). The new
        policy starts with every key the old one tracks (as inserts, in the old one's
        iteration order: recency and frequency history are not carried over). The tier's pages
        are not touched. Raises InvalidArgument / UnknownComponent before anything changes."""
        self._check_open()
        ti = self._tier_index(tier)
        t = self.tiers[ti]
        policy = make_policy(spec, t.capacity_pages)
        with self._lock:
            keys = cast("list[bytes]", list(self.policies[ti]))
        # parents (a lineage policy needs them) outside the lock: a shared tier's meta is I/O
        parents = {k: m.parent if (m := t.meta(k)) is not None else None for k in keys}
        with self._lock:
            for k in cast("list[bytes]", list(self.policies[ti])):  # keys admitted meanwhile too
                if len(policy) < policy.capacity:
                    policy.insert(k, parents.get(k))
            self.policies[ti] = policy
        return policy

    # ----------------------------------------------------------------- introspection

    def stats(self) -> StoreStats:
        self._check_open()
        with self._lock:
            leases = len(self._leases)
        v = self.metrics.value
        copies = {
            f"{reason}->{t.name}": int(v("kvstore_copies_total", reason=reason, tier=t.name))
            for reason in COPY_REASONS
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
        """Assert the invariants in the module docstring (between operations: a put or staging
        handle in flight holds room it has not published); waits for background copies first.
        For tests and debugging."""
        self._check_open()
        self.drain()
        with self._lock:
            self._leases.check()
            for ti, (tier, policy) in enumerate(zip(self.tiers, self.policies)):
                assert len(policy) <= policy.capacity, f"{tier.name}: policy over capacity"
                assert tier.used_pages <= tier.capacity_pages, f"{tier.name}: over capacity"
                assert not self._retiring[ti], f"{tier.name}: victims left retiring"
                assert not self._deleting[ti], f"{tier.name}: deletes left in flight"
                if tier.shared:
                    continue  # other nodes delete its pages; the policy learns on the next read
                tracked = cast("list[bytes]", list(policy))
                held = tier.contains(tracked) if tracked else []
                lost = [k.hex() for k, h in zip(tracked, held) if not h]
                assert not lost, f"{tier.name}: policy tracks keys the tier lacks: {lost[:3]}"
                if not isinstance(tier, OwnedPool):  # an engine's pool holds blocks it computes
                    known = set(tracked)
                    stray = [k.hex() for k in tier.keys() if k not in known]
                    assert not stray, f"{tier.name}: pages no policy tracks: {stray[:3]}"

    def tier(self, name: str) -> Tier:
        return self.tiers[self._tier_index(name)]

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def open_store_handles(self) -> int:
        """Saves prepared (:meth:`prepare_store`) and not yet completed or aborted: a writer's
        pages in flight, not visible to readers yet."""
        with self._lock:
            return len(self._stores)

    def close(self) -> None:
        """Finish background copies, stop the store's threads and close every tier. Every later
        call raises StoreClosed, but those that tear down or look (``drain``, which has nothing
        left to wait for, ``remove_listener``, ``tier``, ``closed``). Idempotent."""
        if self._closed:
            return
        self.drain()
        self._closed = True
        self._executor.shutdown(wait=True)
        self._mover.close()
        for t in self.tiers:
            if isinstance(t, OwnedPool):
                t.attach(None)
            t.close()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed()

    def _tier_index(self, name: str | None) -> int:
        if name is None:
            return 0
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise InvalidArgument(
                f"no tier named {name!r}", hint=f"tiers are {list(self._by_name)}"
            ) from None


class _PoolOwner:
    """The store as the owner of pool tier ``ti`` (see kvstore.tiers.hbm_owner): victims by the
    tier's policy, written back per the write policy (outside the store lock); commits and
    reuses feed the policy."""

    def __init__(self, store: TieredStore, ti: int) -> None:
        self._store, self._ti = store, ti

    def reclaim(self, num_blocks: int) -> int:
        return self._store.evict(num_blocks, tier=self._store.tiers[self._ti].name)

    def on_commit(self, metas: Sequence[BlockMeta]) -> None:
        self._store._adopt(self._ti, metas)

    def on_hit(self, keys: Sequence[bytes]) -> None:
        with self._store._lock:
            self._store.policies[self._ti].access_many(keys)


def _scratch(n: int, page_bytes: int) -> list[np.ndarray]:
    # 4 KiB aligned, so copies through a disk tier need no bounce buffer
    return list(aligned_pages(n, page_bytes))


#: the face, checked by mypy: TieredStore is a StoreAPI
_FACE: type[StoreAPI] = TieredStore
