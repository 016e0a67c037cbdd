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
* ``write_back``    — when it is evicted from a tier, into the next one, unless its copy has
  reached that tier once already (it is *clean*: see ``StoreState.clean``);
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
store's mover (:meth:`drain` waits for them). Once a tier is full, its cleaner
(:mod:`kvstore.cleaner`) evicts ahead of need on the mover, so writers find room and do not
write back on their own threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Literal, cast

from kvstore.api import LocalStagingSlab, StoreAPI
from kvstore.bandwidth import BandwidthMeter
from kvstore.buffers import page_views
from kvstore.checks import check_count, check_keys, check_metas, check_namespace
from kvstore.cleaner import DEFAULT_RESERVE, check_reserve
from kvstore.errors import InvalidArgument
from kvstore.event_log import DEFAULT_EVENT_LOG_EVENTS, EventBatch, Snapshot
from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.leases import LeaseTable
from kvstore.lookups import Lookups
from kvstore.metrics import Metrics
from kvstore.mover import DEFAULT_SWITCH_INTERVAL_MS
from kvstore.namespace_labels import NamespaceLabels, check_label
from kvstore.namespace_stats import NamespaceCounters, NamespaceCounts
from kvstore.policy import EvictionPolicy, make_policy
from kvstore.reads import Reads
from kvstore.retention import DEFAULT_MAX_PINNED_FRACTION, Pin, Retention, RetentionInfo
from kvstore.results import GetResult, Lease, LookupResult, PutResult, StoreStats
from kvstore.room import Room
from kvstore.store_pool_owner import StorePoolOwner
from kvstore.staging import LoadHandle, StoreHandle
from kvstore.staging_path import StagingPath
from kvstore.store_events import StoreEvents
from kvstore.store_retention import StoreRetention
from kvstore.store_state import StoreState
from kvstore.tiers.base import Tier
from kvstore.tiers.hbm_owner import OwnedPool

WritePolicy = Literal["write_through", "write_back", "selective"]
WRITE_POLICIES: tuple[str, ...] = ("write_through", "write_back", "selective")
COPY_REASONS = ("write_through", "write_back", "selective", "promote", "promote_skipped", "prefetch")


class TieredStore:
    """The in-process store (:class:`~kvstore.api.StoreAPI`): its jobs -- lookups and leases,
    reads, admission and eviction, the staging path -- are classes of their own over one
    :class:`~kvstore.store_state.StoreState`; this class composes them and checks what callers
    pass."""

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
        free_reserve: float = DEFAULT_RESERVE,
        switch_interval_ms: float = DEFAULT_SWITCH_INTERVAL_MS,
        event_log_events: int = DEFAULT_EVENT_LOG_EVENTS,
        max_pinned_fraction: float = DEFAULT_MAX_PINNED_FRACTION,
        event_token_ids: Sequence[bytes] = (),
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
        check_count("event_log_events", event_log_events, 0)
        for ns in event_token_ids:  # namespace ids whose events carry token ids
            check_namespace(ns)
        if isinstance(max_pinned_fraction, bool) or not (
                isinstance(max_pinned_fraction, (int, float)) and 0 <= max_pinned_fraction <= 0.9):
            raise InvalidArgument(f"max_pinned_fraction is a share of a tier in [0, 0.9], "
                                  f"got {max_pinned_fraction!r}")
        local = [t.capacity_pages for t in tiers if not t.shared] or [t.capacity_pages for t in tiers]
        specs: Sequence[EvictionPolicy | str] = policies or ["lru"] * len(tiers)
        if len(specs) != len(tiers):
            raise InvalidArgument(f"{len(tiers)} tiers but {len(specs)} policies")
        metrics = metrics if metrics is not None else tiers[0].metrics
        built = [make_policy(p, t.capacity_pages) if isinstance(p, str) else p
                 for p, t in zip(specs, tiers)]
        check_reserve(free_reserve)
        if isinstance(switch_interval_ms, bool) or not (
                isinstance(switch_interval_ms, (int, float)) and 0 <= switch_interval_ms <= 5):
            raise InvalidArgument(f"switch_interval_ms is in [0, 5] (0: leave the interpreter's), "
                                  f"got {switch_interval_ms!r}")
        st = self._st = StoreState(
            layout, tiers, built, write_policy=write_policy, selective_hits=selective_hits,
            promote_on_hit=promote_on_hit, leases=LeaseTable(lease_ttl_s, clock, metrics),
            bandwidth=BandwidthMeter(bandwidth_alpha), metrics=metrics,
            prefetch_workers=prefetch_workers, switch_interval_ms=switch_interval_ms,
            event_log_events=event_log_events,
            retention=Retention(int(max_pinned_fraction * min(local)), clock),
            event_token_ids=frozenset(event_token_ids))
        self._room = Room(st, free_reserve)
        self._reads = Reads(st, self._room)
        self._lookups = Lookups(st)
        self._staging = StagingPath(st, self._room, self._reads)
        self._events = StoreEvents(st)
        self._retention = StoreRetention(st, clock)
        self.layout = layout
        #: the tiers, fastest first, and each one's eviction policy (the store's own lists)
        self.tiers, self.policies = st.tiers, st.policies
        self.metrics = metrics
        self.write_policy, self.selective_hits = write_policy, selective_hits
        self.promote_on_hit = promote_on_hit
        self.lease_ttl_s = st.leases.ttl_s
        #: lookups, loads and misses per namespace, of the calls that name one (see
        #: :mod:`kvstore.namespace_stats`)
        self.namespace_counts: NamespaceCounters = st.namespace_counts
        #: who each namespace id is, as its users registered it (:meth:`label_namespace`)
        self.namespace_labels = NamespaceLabels()
        # Warm tiers (a disk index reopened after a restart) seed their policies.
        for ti, (tier, policy) in enumerate(zip(self.tiers, self.policies)):
            for key in tier.keys():
                meta = tier.meta(key)
                if len(policy) < policy.capacity:
                    policy.insert(key, meta.parent if meta else None)
                    if meta is not None:
                        st.budgets.entered(ti, [key], [meta.namespace_id])
        # A pool an engine allocates from (hbm) evicts through the store: its policy, write-back.
        for ti, tier in enumerate(self.tiers):
            if isinstance(tier, OwnedPool):
                tier.attach(StorePoolOwner(st, self._room, ti))

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
        return self._lookups.lookup(keys, lease=lease, local_only=local_only, namespace_id=namespace_id)

    def lookup_async(self, keys: Sequence[bytes], *, lease: bool = False,
                     namespace_id: bytes | None = None) -> Future[LookupResult]:
        """:meth:`lookup` of every tier on the store's prefetch threads. A caller that drops
        the future before it is done must release the lease it carries (``add_done_callback``).
        Raises what :meth:`lookup` raises for bad keys, at once."""
        return self._lookups.lookup_async(keys, lease=lease, namespace_id=namespace_id)

    def count_declined(self, namespace_id: bytes, num_blocks: int) -> None:
        """Count ``num_blocks`` matched blocks of ``namespace_id`` that a connector recomputes
        instead of loading (load-or-recompute), in :attr:`namespace_counts`."""
        self._st.check_open()
        check_namespace(namespace_id)
        check_count("num_blocks", num_blocks, 0)
        if num_blocks:
            self.namespace_counts.add(namespace_id, NamespaceCounts(declined=num_blocks))

    def count_failed(self, namespace_id: bytes, what: str, reason: str, num_blocks: int) -> None:
        """Count ``num_blocks`` blocks of ``namespace_id`` whose ``what`` ("load": recomputed;
        "save": a later miss) failed in a connector for ``reason`` (one of
        :data:`~kvstore.namespace_stats.FAILURE_REASONS`), in :attr:`namespace_counts`.
        InvalidArgument for another pair."""
        self._st.check_open()
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
        return self._lookups.release(lease, namespace_id=namespace_id)

    def narrow(self, lease: Lease, n: int, *, namespace_id: bytes | None = None) -> Lease:
        """Keep only the first ``n`` keys of ``lease`` pinned (a caller that will load fewer
        pages than it looked up must not keep the rest from eviction). Returns the narrowed
        lease (same id and expiry). Raises LeaseError for an expired or unknown lease."""
        return self._lookups.narrow(lease, n, namespace_id=namespace_id)

    def is_pinned(self, key: bytes) -> bool:
        return self._lookups.is_pinned(key)

    # ----------------------------------------------------------------- put, get

    def put(self, metas: Sequence[BlockMeta], pages: Any, *, tier: str | None = None) -> PutResult:
        """Store pages under their blocks' identities in ``tier`` (default: the fastest).

        ``pages``: see :func:`kvstore.buffers.page_views`. Pages whose key the tier already holds
        are not written again (they count as an access). ``refused`` counts pages the tier (or,
        under write-through, a tier below) could not take. Raises InvalidArgument before
        anything changes if an argument is malformed.
        """
        self._st.check_open()
        ti = self._st.tier_index(tier)
        check_metas(metas, self.layout)
        views = page_views(pages, self.layout, len(metas), writable=False)
        return self._room.store_into(ti, list(metas), views)

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
        return self._reads.get(namespace_id, keys, out, lease=lease)

    def prefetch(self, namespace_id: bytes, keys: Sequence[bytes], *, to: str | None = None) -> Future[int]:
        """Copy ``keys`` held in slower tiers into tier ``to`` (default: the fastest) in the
        background. The future yields how many leading keys ``to`` holds when done."""
        return self._reads.prefetch(namespace_id, keys, to=to)

    def read_bandwidth(self, tier_name: str) -> float | None:
        """Measured read bandwidth of tier ``tier_name`` in bytes/s (an exponentially weighted
        average over the store's successful reads), or None before its first one."""
        return self._reads.read_bandwidth(tier_name)

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until the background copies queued so far (promotions, ``selective`` and
        write-through copies down) have run. Returns False if ``timeout_s`` passed first."""
        return self._st.mover.drain(timeout_s)

    # ----------------------------------------------------------------- the staging path

    def staging_tier(self, name: str | None = None) -> LocalStagingSlab:
        """The tier loads and saves stage through: ``name``, or the fastest tier with page slots
        in one slab (the host tier). Raises InvalidArgument if there is none or ``name`` is
        another kind of tier."""
        return self._staging.staging_tier(name)

    def prepare_load(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        *,
        lease: Lease | None = None,
        tier: str | None = None,
    ) -> LoadHandle:
        """Pin the leading ``keys`` that the staging tier (``tier``, default the host tier)
        holds under ``namespace_id``, for a copy straight out of its slab.

        Mutates: pins each returned slot (its bytes stay until :meth:`complete_load`, even if
        the key is deleted or replaced meanwhile); counts the pinned pages as the tier's read
        hits (and their bytes) and the rest as misses, and both as ``namespace_id``'s load hits
        and misses. The tier's policy is touched for each hit, and ``selective`` hits counted
        (a page reaching ``selective_hits`` is copied down in the background), when the load
        completes (:meth:`complete_load`). ``lease`` (from :meth:`lookup`) rides along and is
        released by :meth:`complete_load`. Pages below the staging tier are not fetched:
        prefetch them first.

        Raises InvalidArgument (malformed keys or namespace id, another store's lease, no slab
        tier) and StoreClosed, changing nothing. A handle does not expire: its pins hold until
        :meth:`complete_load` (only a lease expires, which leaves the pins in place).
        """
        return self._staging.prepare_load(namespace_id, keys, lease=lease, tier=tier)

    def complete_load(self, handle: LoadHandle, *, into: Any = None) -> int:
        """End a load: with ``into`` (pages as :meth:`get` takes them, one per handle key)
        first copy the handle's pages there; count its pages as read by the tier's policy,
        unpin the handle's slots and release its lease (an expired lease is no error). Returns
        how many leading pages of the handle were valid while pinned -- all of them: a pinned
        slot keeps its bytes. Raises LeaseError for a handle that is unknown or already
        completed, InvalidArgument for another store's handle or pages that do not fit it
        (the handle stays open then)."""
        return self._staging.complete_load(handle, into=into)

    def prepare_store(self, metas: Sequence[BlockMeta], *, tier: str | None = None) -> StoreHandle:
        """Reserve staging-tier slots (``tier``, default the host tier) for the pages of
        ``metas``, to be written straight into the slab.

        Pages the tier already holds, or that another open handle is writing, are not reserved
        (``existing``; each counts as an access). Room is made by the tier's policy: victims are
        chosen under the store lock and written back (``write_back``) and deleted outside it,
        so this call may take as long as a write-back. ``refused`` counts pages no room could be
        made for (everything evictable pinned). Reserved slots are invisible to readers and
        nobody else's until :meth:`complete_store` publishes them or :meth:`abort` frees them;
        they do not expire (a writer that dies must be aborted by whoever tracked it: the
        daemon aborts a disconnected client's handles).

        One call takes the blocks of one namespace (as over the daemon, whose call names one).

        Raises InvalidArgument (malformed identities, blocks of several namespaces, no slab
        tier) and StoreClosed, changing nothing.
        """
        return self._staging.prepare_store(metas, tier=tier)

    def complete_store(self, handle: StoreHandle, ok: bool = True, *,
                       pages: Any = None) -> PutResult:
        """Publish the handle's slots under their keys (``ok``: every byte of each was written,
        or ``pages`` -- as :meth:`put` takes them, one per ``handle.metas`` -- are copied into
        them first), admit them to the tier's policy and apply write-through; with ``ok=False``
        it is :meth:`abort`. Returns what was stored; ``refused`` counts, as :meth:`put`'s does,
        pages a tier below could not take under write-through. Raises LeaseError for a handle
        that is unknown or already completed, InvalidArgument for another store's handle or
        pages that do not fit it (the handle stays open then)."""
        return self._staging.complete_store(handle, ok, pages=pages)

    def abort(self, handle: StoreHandle) -> None:
        """Free the handle's reserved slots unpublished (nothing of it becomes visible). Raises
        LeaseError for a handle that is unknown or already completed."""
        return self._staging.abort(handle)

    # ----------------------------------------------------------------- delete, evict, events

    def delete(self, keys: Sequence[bytes], *, namespace_id: bytes | None = None) -> int:
        """Remove keys from every tier. Returns how many tier copies were deleted. With
        ``namespace_id``, a key a local tier holds under another namespace is refused
        (InvalidArgument) and nothing is deleted: one tenant cannot delete another's pages."""
        self._st.check_open()
        check_keys(keys)
        keys = list(keys)
        if namespace_id is not None:
            check_namespace(namespace_id)
            with self._st.lock:
                self._retention.refuse_foreign(keys, namespace_id, "deleted")
        return self._room.delete(keys, namespace_id)

    def pin(self, namespace_id: bytes, keys: Sequence[bytes], *, ttl_s: float) -> Pin:
        """Keep ``keys`` of ``namespace_id`` cached for ``ttl_s`` seconds, in every tier (see
        :mod:`kvstore.retention`): no eviction takes them until the pin lapses or is removed;
        a key not stored yet is kept once it arrives. InvalidArgument for a key another
        namespace holds, a TTL out of bounds, or pins past ``store.max_pinned_fraction``;
        nothing changes then."""
        return self._retention.pin(namespace_id, keys, ttl_s)

    def unpin(self, pin: Pin | int, *, namespace_id: bytes | None = None) -> bool:
        """Remove a pin (its pages become evictable again). False when it lapsed, was removed
        already, or is not one of ``namespace_id``'s (another tenant's pin ids are not told)."""
        return self._retention.unpin(pin, namespace_id)

    def set_budget(self, namespace_id: bytes, tier: str, nbytes: int | None) -> None:
        """Hold a namespace to ``nbytes`` of a tier (see :mod:`kvstore.budgets`; the contract
        is :meth:`kvstore.api.StoreAPI.set_budget`)."""
        self._retention.set_budget(namespace_id, tier, nbytes)

    def retention(self, namespace_id: bytes) -> RetentionInfo:
        """A namespace's live pins and, per tier, its bytes held, pinned and budgeted."""
        return self._retention.info(namespace_id)

    def read_events(self, cursor: int | None = None, *, limit: int = 1024,
                    timeout_s: float = 0.0, epoch: bytes | None = None,
                    namespace_id: bytes | None = None) -> EventBatch:
        """The store's event log from ``cursor`` (see :mod:`kvstore.event_log`): every change
        of where a page lives -- stored, removed (evicted, deleted, expired, corrupt), moved
        (demoted) -- with a store-wide sequence number, at most ``limit`` events, waiting up to
        ``timeout_s`` for one. ``cursor`` None: from now on (the batch is empty; continue from
        its ``next_cursor``). A batch with ``gap`` set means events were lost past the log's
        window: resynchronize from :meth:`event_snapshot`. ``epoch``: the batch's (or
        snapshot's) epoch the cursor came with -- a cursor of another log (a restarted
        daemon's) is a gap. ``namespace_id``: only that namespace's keys (events left with none
        are dropped from the batch; the cursor still advances past them). InvalidArgument when
        the log is off (``store.event_log_events`` 0) or the cursor is not one the log gave."""
        return self._events.read(cursor, limit=limit, timeout_s=timeout_s, epoch=epoch,
                                 namespace_id=namespace_id)

    def event_snapshot(self, *, namespace_id: bytes | None = None) -> Snapshot:
        """The store's contents as "stored" events (per tier and namespace), and the cursor
        from which :meth:`read_events` goes on, taken in one hold of the store lock: every
        event at or after that cursor happened after the snapshot. A shared tier's pages are
        those this store tracks there (others' writes show up as they are read).
        ``namespace_id``: only that namespace's pages."""
        return self._events.snapshot(namespace_id)

    def namespace_of(self, key: bytes) -> bytes | None:
        """The namespace a local tier holds ``key`` under, or None (shared tiers are not asked:
        that would be a network call)."""
        return self._retention.namespace_of(key)

    def evict(self, n: int, *, tier: str | None = None) -> int:
        """Evict up to ``n`` pages from ``tier`` by its policy (write-back applies, outside the
        store lock). Returns how many pages left the tier."""
        self._st.check_open()
        check_count("n", n, 0)
        ti = self._st.tier_index(tier)
        return self._room.evict(ti, n)

    def set_policy(self, tier: str, spec: str) -> EvictionPolicy:
        """Switch ``tier``'s eviction policy at run time to a new one built from ``spec`` (a
        registered name or an import path, see :func:`kvstore.policy.make_policy`). The new
        policy starts with every key the old one tracks (as inserts, in the old one's
        iteration order: recency and frequency history are not carried over). The tier's pages
        are not touched. Raises InvalidArgument / UnknownComponent before anything changes."""
        self._st.check_open()
        ti = self._st.tier_index(tier)
        t = self.tiers[ti]
        policy = make_policy(spec, t.capacity_pages)
        with self._st.lock:
            keys = cast("list[bytes]", list(self.policies[ti]))
        # parents (a lineage policy needs them) outside the lock: a shared tier's meta is I/O
        parents = {k: m.parent if (m := t.meta(k)) is not None else None for k in keys}
        with self._st.lock:
            for k in cast("list[bytes]", list(self.policies[ti])):  # keys admitted meanwhile too
                if len(policy) < policy.capacity:
                    policy.insert(k, parents.get(k))
            self.policies[ti] = policy
        return policy

    # ----------------------------------------------------------------- introspection

    def stats(self) -> StoreStats:
        self._st.check_open()
        with self._st.lock:
            leases = len(self._st.leases)
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
        self._st.check_open()
        self.drain()
        with self._st.lock:
            self._st.leases.check()
            for ti, (tier, policy) in enumerate(zip(self.tiers, self.policies)):
                assert len(policy) <= policy.capacity, f"{tier.name}: policy over capacity"
                assert tier.used_pages <= tier.capacity_pages, f"{tier.name}: over capacity"
                assert not self._st.retiring[ti], f"{tier.name}: victims left retiring"
                assert not self._st.deleting[ti], f"{tier.name}: deletes left in flight"
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
        return self.tiers[self._st.tier_index(name)]

    @property
    def closed(self) -> bool:
        return self._st.closed

    @property
    def open_store_handles(self) -> int:
        """Saves prepared (:meth:`prepare_store`) and not yet completed or aborted: a writer's
        pages in flight, not visible to readers yet."""
        return self._staging.open_store_handles

    def close(self) -> None:
        """Finish background copies, stop the store's threads and close every tier. Every later
        call raises StoreClosed, but those that tear down or look (``drain``, which has nothing
        left to wait for, ``remove_listener``, ``tier``, ``closed``). Idempotent."""
        if self._st.closed:
            return
        self.drain()
        self._st.closed = True
        self._st.executor.shutdown(wait=True)
        self._st.mover.close()
        for t in self.tiers:
            if isinstance(t, OwnedPool):
                t.attach(None)
            t.close()
        if self._st.events is not None:  # last: wakes readers waiting on it
            self._st.events.close()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: the face, checked by mypy: TieredStore is a StoreAPI
_FACE: type[StoreAPI] = TieredStore
