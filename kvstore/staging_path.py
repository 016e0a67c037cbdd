"""The store's staging path, the one seam engines load and save through (see
docs/architecture.md, "The staging path", and :mod:`kvstore.staging` for the handles): ``prepare_load``/``complete_load``,
``prepare_store``/``complete_store``/``abort``. A mixin of :class:`~kvstore.store.TieredStore`:
it runs under the store's lock and room accounting (claims, retiring victims), whose contract
the store's module docstring states."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from kvstore.api import StagingSlab
from kvstore.buffers import page_views
from kvstore.checks import check_keys, check_metas, check_namespace
from kvstore.errors import InvalidArgument, LeaseError
from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.leases import LeaseTable
from kvstore.metrics import Metrics
from kvstore.namespace_stats import NamespaceCounters, NamespaceCounts
from kvstore.policy import EvictionPolicy
from kvstore.results import Lease, PutResult
from kvstore.staging import LoadHandle, StoreHandle, copy_in, copy_out
from kvstore.tiers.base import Tier
from kvstore.tiers.slab import SlabSlots


class StagingPath:
    # provided by TieredStore (annotations only)
    layout: KVLayout
    tiers: list[Tier]
    policies: list[EvictionPolicy]
    metrics: Metrics
    namespace_counts: NamespaceCounters
    write_policy: str
    _lock: threading.RLock
    _leases: LeaseTable
    _by_name: dict[str, int]
    _claimed: list[int]
    _writing: list[set[bytes]]
    _loads: dict[int, LoadHandle]
    _stores: dict[int, StoreHandle]
    _handle_ids: Iterator[int]
    _check_open: Callable[[], None]
    _tier_index: Callable[[str | None], int]
    tier: Callable[[str], Tier]
    _claim: Callable[[int, int], tuple[list[bytes], int]]
    _retire: Callable[..., int]
    _admit: Callable[[int, Sequence[BlockMeta]], None]
    _after_read: Callable[[int, list[bytes], list[bytes]], None]
    _store_into: Callable[..., PutResult]

    def staging_tier(self, name: str | None = None) -> StagingSlab:
        """The tier loads and saves stage through: ``name``, or the fastest tier with page slots
        in one slab (the host tier). Raises InvalidArgument if there is none or ``name`` is
        another kind of tier."""
        return cast(StagingSlab, self._slab_tier(name))

    def _slab_tier(self, name: str | None = None) -> SlabSlots:
        """:meth:`staging_tier` as the tier itself, with the slot calls the store makes."""
        self._check_open()
        if name is None:
            for tier in self.tiers:
                if isinstance(tier, SlabSlots):
                    return tier
            raise InvalidArgument(
                "no tier of this store keeps its pages in a slab",
                hint="add a host tier: loads and saves stage through it",
            )
        tier = self.tiers[self._tier_index(name)]
        if not isinstance(tier, SlabSlots):
            raise InvalidArgument(
                f"tier {name!r} is a {type(tier).__name__}, not a tier with slab slots",
                hint="name the store's host tier",
            )
        return tier

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
        self._check_open()
        check_keys(keys)
        check_namespace(namespace_id)
        if lease is not None and (not isinstance(lease, Lease) or lease.owner != self._leases.owner):
            raise InvalidArgument("prepare_load was given another store's lease",
                                  hint="pass the lease of this store's lookup")
        slab_tier = self._slab_tier(tier)
        t = cast(Tier, slab_tier)
        slots = slab_tier.pin_leading(list(keys), namespace_id)
        n = len(slots)
        t.count_reads(n, len(keys) - n)
        if keys:
            self.namespace_counts.add(namespace_id, NamespaceCounts(load_hit=n,
                                                                    load_miss=len(keys) - n))
        handle = LoadHandle(next(self._handle_ids), self._leases.owner, t.name, namespace_id,
                            tuple(keys[:n]), tuple(slots), lease, slab_tier.slab)
        with self._lock:
            self._loads[handle.id] = handle
        return handle

    def complete_load(self, handle: LoadHandle, *, into: Any = None) -> int:
        """End a load: with ``into`` (pages as :meth:`get` takes them, one per handle key)
        first copy the handle's pages there; count its pages as read by the tier's policy,
        unpin the handle's slots and release its lease (an expired lease is no error). Returns
        how many leading pages of the handle were valid while pinned -- all of them: a pinned
        slot keeps its bytes. Raises LeaseError for a handle that is unknown or already
        completed, InvalidArgument for another store's handle or pages that do not fit it
        (the handle stays open then)."""
        self._check_open()
        self._check_handle(handle, "load")
        views = None if into is None else page_views(into, self.layout, handle.num_blocks,
                                                     writable=True)
        held = self._pop_handle(self._loads, handle, "load")
        # the policy learns of the hits here, not in prepare_load: that call stands between a
        # hit and its first copy (the pins kept the pages meanwhile); before the unpin, so they
        # become evictable as the most recently used
        try:
            if views is not None:
                copy_out(held, views)
            self._after_read(self._by_name[held.tier], list(held.keys), [])
        finally:  # the handle is gone: its pins must go with it
            cast(SlabSlots, self.tier(held.tier)).unpin(held.slots)
        if held.lease is not None:
            try:
                with self._lock:
                    self._leases.release(held.lease)
            except LeaseError:
                pass  # expired: the pins kept the bytes anyway
        return held.num_blocks

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
        self._check_open()
        check_metas(metas, self.layout)
        if len({m.namespace_id for m in metas}) > 1:
            raise InvalidArgument("one prepare_store call takes blocks of one namespace",
                                  hint="call prepare_store once per namespace")
        slab_tier = self._slab_tier(tier)
        t = cast(Tier, slab_tier)
        ti = self._by_name[t.name]
        policy = self.policies[ti]
        metas = list(metas)
        present = t.contains([m.key for m in metas]) if metas else []
        new: list[BlockMeta] = []
        with self._lock:
            writing, seen = self._writing[ti], set()
            for meta, here in zip(metas, present):
                if here or meta.key in writing or meta.key in seen:
                    policy.access(meta.key)
                    continue
                seen.add(meta.key)
                new.append(meta)
            new = new[: t.capacity_pages]
            victims, claim = self._claim(ti, len(new))
            writing.update(m.key for m in new[:claim])
        if victims:
            kept = self._retire(ti, victims, claim)
            if kept < claim:
                with self._lock:
                    writing.difference_update(m.key for m in new[kept:claim])
            claim = kept
        slots = slab_tier.reserve(claim)
        if len(slots) < claim:  # physically short (pages still being read): give the rest up
            with self._lock:
                self._claimed[ti] -= claim - len(slots)
                writing.difference_update(m.key for m in new[len(slots):claim])
        got = tuple(new[: len(slots)])
        handle = StoreHandle(next(self._handle_ids), self._leases.owner, t.name, got,
                             tuple(slots), len(metas) - len(new), len(new) - len(got),
                             slab_tier.slab)
        t.count_writes(0, handle.refused)
        with self._lock:
            self._stores[handle.id] = handle
        return handle

    def complete_store(self, handle: StoreHandle, ok: bool = True, *,
                       pages: Any = None) -> PutResult:
        """Publish the handle's slots under their keys (``ok``: every byte of each was written,
        or ``pages`` -- as :meth:`put` takes them, one per ``handle.metas`` -- are copied into
        them first), admit them to the tier's policy and apply write-through; with ``ok=False``
        it is :meth:`abort`. Returns what was stored; ``refused`` counts, as :meth:`put`'s does,
        pages a tier below could not take under write-through. Raises LeaseError for a handle
        that is unknown or already completed, InvalidArgument for another store's handle or
        pages that do not fit it (the handle stays open then)."""
        self._check_open()
        if not ok:
            self.abort(handle)
            return PutResult(0, handle.existing, handle.refused + handle.num_blocks)
        self._check_handle(handle, "store")
        views = None if pages is None else page_views(pages, self.layout, handle.num_blocks,
                                                      writable=False)
        held = self._pop_handle(self._stores, handle, "store")
        ti = self._by_name[held.tier]
        if views is not None:  # the handle is ours alone now: no second complete writes these
            try:
                copy_in(held, views)
            except BaseException:
                self._unreserve(ti, held)
                raise
        t = self.tiers[ti]
        cast(SlabSlots, t).publish(held.slots, held.metas)
        t.count_writes(held.num_blocks)
        with self._lock:
            self._claimed[ti] -= held.num_blocks
            self._writing[ti].difference_update(m.key for m in held.metas)
        self._admit(ti, held.metas)
        refused = held.refused
        if self.write_policy == "write_through" and held.metas and ti + 1 < len(self.tiers):
            views = [held.slab[s] for s in held.slots]
            self.metrics.copies.labels("write_through", self.tiers[ti + 1].name).inc(len(views))
            refused += self._store_into(ti + 1, list(held.metas), views).refused
        return PutResult(held.num_blocks, held.existing, refused)

    def abort(self, handle: StoreHandle) -> None:
        """Free the handle's reserved slots unpublished (nothing of it becomes visible). Raises
        LeaseError for a handle that is unknown or already completed."""
        self._check_open()
        held = self._pop_handle(self._stores, handle, "store")
        self._unreserve(self._by_name[held.tier], held)

    def _unreserve(self, ti: int, held: StoreHandle) -> None:
        cast(SlabSlots, self.tiers[ti]).unreserve(held.slots)
        with self._lock:
            self._claimed[ti] -= held.num_blocks
            self._writing[ti].difference_update(m.key for m in held.metas)

    def _check_handle(self, handle: Any, kind: str) -> None:
        if not isinstance(handle, (LoadHandle, StoreHandle)):
            raise InvalidArgument(f"expected a {kind} handle, got {type(handle).__name__}")
        if handle.owner != self._leases.owner:
            raise InvalidArgument(f"{kind} handle {handle.id} was issued by another store")

    def _pop_handle(self, table: dict[int, Any], handle: Any, kind: str) -> Any:
        self._check_handle(handle, kind)
        with self._lock:
            held = table.pop(handle.id, None)
        if held is None:
            raise LeaseError(f"{kind} handle {handle.id} is unknown or already completed")
        return held


__all__ = ["StagingPath"]
