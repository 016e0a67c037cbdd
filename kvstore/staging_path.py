"""The store's staging path, the one seam engines load and save through (see
docs/architecture.md, "The staging path", and :mod:`kvstore.staging` for the handles): ``prepare_load``/``complete_load``,
``prepare_store``/``complete_store``/``abort``. One of the store's jobs
(:class:`~kvstore.store.TieredStore` composes them): it keeps the open handles, and runs under
the store's lock and room accounting (:mod:`kvstore.room`), whose contract the store's module
docstring states."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from kvstore.api import LocalStagingSlab
from kvstore.buffers import page_views
from kvstore.checks import check_keys, check_metas, check_namespace
from kvstore.errors import InvalidArgument, LeaseError
from kvstore.keys import BlockMeta
from kvstore.namespace_stats import NamespaceCounts
from kvstore.reads import Reads
from kvstore.results import Lease, PutResult
from kvstore.room import Room
from kvstore.staging import LoadHandle, StoreHandle, copy_in, copy_out
from kvstore.store_state import StoreState
from kvstore.tiers.base import Tier
from kvstore.tiers.slab import SlabSlots


class StagingPath:
    def __init__(self, state: StoreState, room: Room, reads: Reads) -> None:
        self._st, self._room, self._reads = state, room, reads
        self._loads: dict[int, LoadHandle] = {}
        self._stores: dict[int, StoreHandle] = {}
        self._handle_ids = iter(range(1, 1 << 62))

    @property
    def open_store_handles(self) -> int:
        """Saves prepared and not yet completed or aborted."""
        with self._st.lock:
            return len(self._stores)

    def staging_tier(self, name: str | None = None) -> LocalStagingSlab:
        """:meth:`kvstore.store.TieredStore.staging_tier` (its contract is there)."""
        return cast(LocalStagingSlab, self._slab_tier(name))

    def _slab_tier(self, name: str | None = None) -> SlabSlots:
        """:meth:`staging_tier` as the tier itself, with the slot calls the store makes."""
        self._st.check_open()
        if name is None:
            for tier in self._st.tiers:
                if isinstance(tier, SlabSlots):
                    return tier
            raise InvalidArgument(
                "no tier of this store keeps its pages in a slab",
                hint="add a host tier: loads and saves stage through it",
            )
        tier = self._st.tiers[self._st.tier_index(name)]
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
        """:meth:`kvstore.store.TieredStore.prepare_load` (its contract is there)."""
        self._st.check_open()
        check_keys(keys)
        check_namespace(namespace_id)
        if lease is not None and (not isinstance(lease, Lease) or lease.owner != self._st.leases.owner):
            raise InvalidArgument("prepare_load was given another store's lease",
                                  hint="pass the lease of this store's lookup")
        slab_tier = self._slab_tier(tier)
        t = cast(Tier, slab_tier)
        slots = slab_tier.pin_leading(list(keys), namespace_id)
        n = len(slots)
        t.count_reads(n, len(keys) - n)
        if keys:
            self._st.namespace_counts.add(namespace_id, NamespaceCounts(load_hit=n,
                                                                    load_miss=len(keys) - n))
        handle = LoadHandle(next(self._handle_ids), self._st.leases.owner, t.name, namespace_id,
                            tuple(keys[:n]), tuple(slots), lease, slab_tier.slab)
        with self._st.lock:
            self._loads[handle.id] = handle
        return handle

    def complete_load(self, handle: LoadHandle, *, into: Any = None) -> int:
        """:meth:`kvstore.store.TieredStore.complete_load` (its contract is there)."""
        self._st.check_open()
        self._check_handle(handle, "load")
        views = None if into is None else page_views(into, self._st.layout, handle.num_blocks,
                                                     writable=True)
        held = self._pop_handle(self._loads, handle, "load")
        # the policy learns of the hits here, not in prepare_load: that call stands between a
        # hit and its first copy (the pins kept the pages meanwhile); before the unpin, so they
        # become evictable as the most recently used
        try:
            if views is not None:
                copy_out(held, views)
            self._reads.after_read(self._st.by_name[held.tier], list(held.keys), [])
        finally:  # the handle is gone: its pins must go with it
            cast(SlabSlots, self._st.tiers[self._st.by_name[held.tier]]).unpin(held.slots)
        if held.lease is not None:
            try:
                with self._st.lock:
                    self._st.leases.release(held.lease)
            except LeaseError:
                pass  # expired: the pins kept the bytes anyway
        return held.num_blocks

    def prepare_store(self, metas: Sequence[BlockMeta], *, tier: str | None = None) -> StoreHandle:
        """:meth:`kvstore.store.TieredStore.prepare_store` (its contract is there)."""
        self._st.check_open()
        check_metas(metas, self._st.layout)
        if len({m.namespace_id for m in metas}) > 1:
            raise InvalidArgument("one prepare_store call takes blocks of one namespace",
                                  hint="call prepare_store once per namespace")
        slab_tier = self._slab_tier(tier)
        t = cast(Tier, slab_tier)
        ti = self._st.by_name[t.name]
        policy = self._st.policies[ti]
        metas = list(metas)
        present = t.contains([m.key for m in metas]) if metas else []
        new: list[BlockMeta] = []
        with self._st.lock:
            writing, seen = self._st.writing[ti], set()
            for meta, here in zip(metas, present):
                if here or meta.key in writing or meta.key in seen:
                    policy.access(meta.key)
                    continue
                seen.add(meta.key)
                new.append(meta)
            new = new[: t.capacity_pages]
            ns = new[0].namespace_id if new else None
            victims, claim = self._room.claim(ti, len(new), ns)
            writing.update(m.key for m in new[:claim])
        if victims:
            kept = self._room.retire(ti, victims, claim, ns)
            if kept < claim:
                with self._st.lock:
                    writing.difference_update(m.key for m in new[kept:claim])
            claim = kept
        slots = slab_tier.reserve(claim)
        if len(slots) < claim:  # physically short (pages still being read): give the rest up
            with self._st.lock:
                self._st.unclaim(ti, claim - len(slots), ns)
                writing.difference_update(m.key for m in new[len(slots):claim])
        got = tuple(new[: len(slots)])
        handle = StoreHandle(next(self._handle_ids), self._st.leases.owner, t.name, got,
                             tuple(slots), len(metas) - len(new), len(new) - len(got),
                             slab_tier.slab)
        t.count_writes(0, handle.refused)
        with self._st.lock:
            self._stores[handle.id] = handle
        return handle

    def complete_store(self, handle: StoreHandle, ok: bool = True, *,
                       pages: Any = None) -> PutResult:
        """:meth:`kvstore.store.TieredStore.complete_store` (its contract is there)."""
        self._st.check_open()
        if not ok:
            self.abort(handle)
            return PutResult(0, handle.existing, handle.refused + handle.num_blocks)
        self._check_handle(handle, "store")
        views = None if pages is None else page_views(pages, self._st.layout, handle.num_blocks,
                                                      writable=False)
        held = self._pop_handle(self._stores, handle, "store")
        ti = self._st.by_name[held.tier]
        if views is not None:  # the handle is ours alone now: no second complete writes these
            try:
                copy_in(held, views)
            except BaseException:
                self._unreserve(ti, held)
                raise
        t = self._st.tiers[ti]
        cast(SlabSlots, t).publish(held.slots, held.metas)
        t.count_writes(held.num_blocks)
        with self._st.lock:
            self._st.unclaim(ti, held.num_blocks, _namespace(held))
            self._st.writing[ti].difference_update(m.key for m in held.metas)
        self._room.admit(ti, held.metas)
        refused = held.refused
        if self._st.write_policy == "write_through" and held.metas and ti + 1 < len(self._st.tiers):
            views = [held.slab[s] for s in held.slots]
            self._st.metrics.copies.labels("write_through", self._st.tiers[ti + 1].name).inc(len(views))
            refused += self._room.store_into(ti + 1, list(held.metas), views).refused
        return PutResult(held.num_blocks, held.existing, refused)

    def abort(self, handle: StoreHandle) -> None:
        """:meth:`kvstore.store.TieredStore.abort` (its contract is there)."""
        self._st.check_open()
        held = self._pop_handle(self._stores, handle, "store")
        self._unreserve(self._st.by_name[held.tier], held)

    def _unreserve(self, ti: int, held: StoreHandle) -> None:
        cast(SlabSlots, self._st.tiers[ti]).unreserve(held.slots)
        with self._st.lock:
            self._st.unclaim(ti, held.num_blocks, _namespace(held))
            self._st.writing[ti].difference_update(m.key for m in held.metas)

    def _check_handle(self, handle: Any, kind: str) -> None:
        if not isinstance(handle, (LoadHandle, StoreHandle)):
            raise InvalidArgument(f"expected a {kind} handle, got {type(handle).__name__}")
        if handle.owner != self._st.leases.owner:
            raise InvalidArgument(f"{kind} handle {handle.id} was issued by another store")

    def _pop_handle(self, table: dict[int, Any], handle: Any, kind: str) -> Any:
        self._check_handle(handle, kind)
        with self._st.lock:
            held = table.pop(handle.id, None)
        if held is None:
            raise LeaseError(f"{kind} handle {handle.id} is unknown or already completed")
        return held


def _namespace(handle: StoreHandle) -> bytes | None:
    return handle.metas[0].namespace_id if handle.metas else None


__all__ = ["StagingPath"]
