"""Admission and eviction: claiming room in a tier, choosing victims, writing them back and
deleting them, admitting what was written, copies down a tier, and deletes.

A writer *claims* room under the store lock (choosing victims), writes the victims back and
deletes them outside it, then writes its pages and publishes them to the policy under the lock
again. Victims between choice and delete are *retiring*; keys a tier deletes outside the lock
are *deleting* (see :meth:`Room.begin_delete`). The tier's cleaner (:mod:`kvstore.cleaner`)
evicts through the same calls ahead of need, on the store's mover.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

import numpy as np

from kvstore.cleaner import Cleaner
from kvstore.keys import BlockMeta
from kvstore.results import PutResult
from kvstore.store_state import StoreState
from kvstore.tiers.base import Tier
from kvstore.tiers.hbm_owner import OwnedPool
from kvstore.tiers.slab import SlabSlots

log = logging.getLogger("kvstore.store")


class Room:
    def __init__(self, state: StoreState, free_reserve: float) -> None:
        self._st = state
        self.cleaner = Cleaner(state.tiers, free_reserve, room=self.room, evict=self.evict_ahead,
                               submit=state.mover.submit, metrics=state.metrics)

    def store_into(self, ti: int, metas: list[BlockMeta], views: list[np.ndarray]) -> PutResult:
        step = self._st.tiers[ti].capacity_pages
        if len(metas) <= step:
            return self._store_chunk(ti, metas, views)
        # A batch larger than the tier: later chunks evict (and write back) earlier ones.
        parts = [
            self._store_chunk(ti, metas[i : i + step], views[i : i + step])
            for i in range(0, len(metas), step)
        ]
        return PutResult(*(sum(getattr(p, f) for p in parts) for f in ("stored", "existing", "refused")))

    def _store_chunk(self, ti: int, metas: list[BlockMeta], views: list[np.ndarray]) -> PutResult:
        if self._st.budgets.any(ti) and len({m.namespace_id for m in metas}) > 1:
            # budgets are judged per namespace: one chunk per namespace
            parts = [self._store_chunk(ti, [m for m in metas if m.namespace_id == ns],
                                       [v for m, v in zip(metas, views) if m.namespace_id == ns])
                     for ns in dict.fromkeys(m.namespace_id for m in metas)]
            return PutResult(*(sum(getattr(p, f) for p in parts)
                               for f in ("stored", "existing", "refused")))
        tier, policy = self._st.tiers[ti], self._st.policies[ti]
        present = tier.contains([m.key for m in metas]) if metas else []
        new_m, new_v = [], []
        seen: set[bytes] = set()
        busy = 0  # pages of keys the tier is deleting now: refused (a write could land first)
        with self._st.lock:
            writing, deleting = self._st.writing[ti], self._st.deleting[ti]
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
            ns = _one_namespace(new_m)
            victims, claim = self.claim(ti, len(new_m), ns)
        if victims:
            claim = self.retire(ti, victims, claim, ns)
        write_m, write_v = new_m[:claim], new_v[:claim]
        try:
            stored = tier.write(write_m, write_v) if write_m else []
        finally:
            with self._st.lock:
                self._st.unclaim(ti, claim, ns)
        ok_m = [m for m, ok in zip(write_m, stored) if ok]
        ok_v = [v for v, ok in zip(write_v, stored) if ok]
        self.admit(ti, ok_m)
        refused = len(new_m) - len(ok_m) + busy
        if self._st.write_policy == "write_through" and ok_m and ti + 1 < len(self._st.tiers):
            self._st.metrics.copies.labels("write_through", self._st.tiers[ti + 1].name).inc(len(ok_m))
            refused += self.store_into(ti + 1, ok_m, ok_v).refused
        return PutResult(len(ok_m), len(metas) - len(new_m) - busy, refused)

    def admit(self, ti: int, metas: Sequence[BlockMeta]) -> None:
        """Track pages just written to tier ``ti`` (their room was claimed)."""
        if not metas:
            return
        tier, policy = self._st.tiers[ti], self._st.policies[ti]
        with self._st.lock:
            if not tier.shared:
                # an eviction may have taken a page between its write and now: track only what
                # the tier still holds (a local index check)
                metas = [m for m, held in zip(metas, tier.contains([m.key for m in metas])) if held]
                deleting = self._st.deleting[ti]
                if deleting:  # a delete in flight may still remove it: _end_delete decides
                    metas = [m for m in metas if m.key not in deleting]
            entered = []
            for meta in metas:
                if meta.key in policy:
                    policy.access(meta.key)
                elif len(policy) < policy.capacity:
                    policy.insert(meta.key, meta.parent)
                    entered.append(meta)
            self._entered(ti, [m.key for m in metas])
            self._st.record("stored", ti, [m.key for m in entered],
                            [m.namespace_id for m in entered],
                            token_ids=[m.token_ids for m in entered])

    def _entered(self, ti: int, keys: list[bytes]) -> None:
        """``keys`` were just written to tier ``ti`` (lock held): each is clean there if the
        tier below holds it (a local index check; below a shared tier, its admission there
        tells), and the tier above, where it holds them, has them clean now."""
        st = self._st
        clean = st.clean[ti]
        clean.difference_update(keys)
        if ti + 1 < len(st.tiers) and not st.tiers[ti + 1].shared and keys:
            clean.update(k for k, there in zip(keys, st.tiers[ti + 1].contains(keys)) if there)
        if ti > 0:
            above = st.policies[ti - 1]
            st.clean[ti - 1].update(k for k in keys if k in above)
        policy = st.policies[ti]
        if len(clean) > 2 * policy.capacity:  # keys that left by paths that do not say so
            clean.intersection_update(cast("list[bytes]", list(policy)))

    def claim(self, ti: int, n: int, namespace_id: bytes | None = None) -> tuple[list[bytes], int]:
        """Claim room for ``n`` more pages of ``namespace_id`` in tier ``ti`` (lock held):
        choose the victims whose deletion makes it, and return them with the number of pages
        claimed (fewer than ``n`` when pinned pages leave no more to evict, or the namespace
        is at its budget there with nothing of its own left to evict: kvstore.budgets). The
        caller retires the victims outside the lock and gives the claim back once it has
        admitted what it wrote."""
        if n <= 0:
            return [], 0
        victims: list[bytes] = []
        if namespace_id is not None and self._st.budgets.any(ti):
            over = self._st.budgets.over(ti, namespace_id, n)
            if over:  # its own pages make its room, never another namespace's
                victims = self.choose_victims(ti, over, only=namespace_id)
                n -= over - len(victims)
                if n <= 0:
                    return victims, 0
        tier, policy = self._st.tiers[ti], self._st.policies[ti]
        claimed, retiring = self._st.claimed[ti], self._st.retiring[ti]
        need = max(claimed + n - tier.free_pages - len(retiring) - len(self._st.deleting[ti]),
                   len(policy) + claimed + n - policy.capacity)
        if need > 0:
            more = self.choose_victims(ti, need)
            self.cleaner.note_inline(ti, len(more))
            victims += more
        claim = max(0, min(n, policy.capacity - len(policy) - claimed))
        self._st.claimed[ti] += claim
        if namespace_id is not None:
            self._st.budgets.reserve(ti, namespace_id, claim)
        self.cleaner.check(ti)
        return victims, claim

    def room(self, ti: int) -> int:
        """Pages tier ``ti`` can take without evicting: free in the tier and in its policy,
        less the room writers claimed (victims retiring or being deleted count as free)."""
        tier, policy = self._st.tiers[ti], self._st.policies[ti]
        with self._st.lock:
            claimed = self._st.claimed[ti]
            going = len(self._st.retiring[ti]) + len(self._st.deleting[ti])
            return min(tier.free_pages + going - claimed, policy.capacity - len(policy) - claimed)

    def evict_ahead(self, ti: int, n: int) -> int:
        """Up to ``n`` victims of tier ``ti`` by its policy, written back per the write policy
        and deleted (the cleaner's eviction, on its lane). Returns how many were chosen: the
        cleaner's measure, which writers filling the tier meanwhile do not blur."""
        with self._st.lock:
            victims = self.choose_victims(ti, n)
        if victims:
            self.retire(ti, victims)
        return len(victims)

    def choose_victims(self, ti: int, n: int, only: bytes | None = None) -> list[bytes]:
        """Take up to ``n`` victims out of tier ``ti``'s policy (lock held); they are retiring
        until :meth:`_retire` deletes them. ``only``: victims of that namespace only."""
        tier, policy = self._st.tiers[ti], self._st.policies[ti]
        self._st.leases.expire()
        pins = self._st.leases.pins
        retention = self._st.retention
        retention.expire()
        held = retention.holds
        if only is not None:
            owner = self._st.budgets.owner
            in_use = tier.is_in_use if isinstance(tier, OwnedPool) else (lambda k: False)
            victims = cast("list[bytes]", policy.evict(
                n, lambda k: owner(ti, k) != only or k in pins or held(k) or in_use(k)))
        elif isinstance(tier, OwnedPool):  # blocks that running requests use are pinned too
            in_use = tier.is_in_use
            victims = cast("list[bytes]", policy.evict(
                n, lambda k: k in pins or held(k) or in_use(k)))
        elif len(retention):
            victims = cast("list[bytes]", policy.evict(n, lambda k: k in pins or held(k)))
        else:
            victims = cast("list[bytes]", policy.evict(n, pins.__contains__))
        hits = self._st.hits[ti]
        for k in victims:
            hits.pop(k, None)
        self._st.retiring[ti].update(victims)
        self._st.removals += 1
        return victims

    def retire(self, ti: int, victims: list[bytes], claim: int = 0,
               namespace_id: bytes | None = None) -> int:
        """Write ``victims`` back (write-back policy) and delete them from tier ``ti``. Called
        without the lock. A victim that a lease pinned since it was chosen is kept and goes back
        into the policy; the room it would have freed is taken off ``claim``, whose remainder
        is returned (the writer that claimed it writes that many pages)."""
        tier, policy = self._st.tiers[ti], self._st.policies[ti]
        if ti + 1 < len(self._st.tiers) and self._st.write_policy == "write_back":
            try:
                self.copy_down(ti, victims, "write_back")
            except Exception:  # noqa: BLE001 - a failed write-back loses a copy, not the tier
                log.exception("write-back from tier %r failed", tier.name)
        with self._st.lock:
            self._st.leases.expire()
            pins, retiring = self._st.leases.pins, self._st.retiring[ti]
            held = self._st.retention.holds  # a retention pin made since the choice spares too
            gone, spared = [], 0
            for k in victims:
                retiring.discard(k)
                if k in policy:
                    continue  # re-admitted meanwhile by a write of the same key: it stays
                meta = tier.meta(k) if k in pins or held(k) else None
                if meta is not None:
                    policy.insert(k, meta.parent)
                    spared += 1
                else:
                    gone.append(k)
            give_up = min(spared, claim)
            self._st.unclaim(ti, give_up, namespace_id)
            spaces = self._st.namespaces_of(tier, gone)
            self._record_eviction(ti, gone, spaces)
            self._st.clean[ti].difference_update(gone)
            slow = bool(gone) and self.deletes_slowly(tier)
            if slow:
                self.begin_delete(ti, gone)
            elif gone and not tier.shared:
                tier.delete(gone)
            # after the delete, never before it: see _removals
            self._st.removals += 1
        if slow:
            self.delete_off_lock(ti, gone)
        if tier.shared:  # network I/O: outside the lock (its policy is a budget, see above)
            tier.delete(gone)
        tier.count_eviction(len(gone))
        return claim - give_up

    def _record_eviction(self, ti: int, gone: list[bytes], spaces: list[bytes | None]) -> None:
        """Log ``gone`` leaving tier ``ti`` (lock held): *moved* (demoted) where the tier
        below holds its copy -- a local tier's index tells; below a shared tier, the copy that
        reached it (``clean``) -- else *removed* (evicted)."""
        st = self._st
        if not gone:
            return
        below = ti + 1 if ti + 1 < len(st.tiers) else None
        if below is None:
            there = [False] * len(gone)
        elif st.tiers[below].shared:
            clean = st.clean[ti]
            there = [k in clean for k in gone]
        else:
            there = st.tiers[below].contains(gone)
        spaces = spaces or [None] * len(gone)
        for moved in (True, False):
            keys = [k for k, t in zip(gone, there) if t is moved]
            nss = [n for n, t in zip(spaces, there) if t is moved]
            if moved:
                st.record("moved", ti, keys, nss, reason="demoted", to=below)
            else:
                st.record("removed", ti, keys, nss, reason="evicted")

    @staticmethod
    def deletes_slowly(tier: Tier) -> bool:
        """A local tier whose delete is I/O (a disk index transaction that may wait on an
        fsync): it runs outside the lock. A slab tier's delete is an in-memory index update and
        stays under it (its staging path relies on that)."""
        return not tier.shared and not isinstance(tier, SlabSlots)

    def begin_delete(self, ti: int, keys: Sequence[bytes]) -> None:
        """Mark ``keys`` (untracked already) as being deleted from tier ``ti`` outside the lock
        (lock held): until :meth:`_end_delete`, writers refuse them, admissions skip them, and a
        leased lookup re-checks its run (a page found there is not leased: it is going)."""
        self._st.deleting[ti].update(keys)
        self._st.deletes_in_flight += 1
        self._st.removals += 1

    def delete_off_lock(self, ti: int, keys: Sequence[bytes]) -> int:
        tier = self._st.tiers[ti]
        try:
            return tier.delete(keys)
        finally:
            with self._st.lock:
                self.end_delete(ti, keys)

    def end_delete(self, ti: int, keys: Sequence[bytes]) -> None:
        """The delete of ``keys`` from tier ``ti`` ended (lock held). A key a writer wrote
        after the delete ran is the tier's again: tracked, as its admission would have."""
        deleting, tier, policy = self._st.deleting[ti], self._st.tiers[ti], self._st.policies[ti]
        deleting.subtract(keys)
        done = [k for k in dict.fromkeys(keys) if deleting[k] <= 0]
        for k in done:
            del deleting[k]
        self._st.deletes_in_flight -= 1
        self._st.removals += 1  # after the delete: see _removals
        back = [k for k, here in zip(done, tier.contains(done)) if here] if done else []
        for k in back:
            if k in policy or k in self._st.retiring[ti]:
                continue
            if len(policy) < policy.capacity:  # the tier holds it: the policy has its room
                meta = tier.meta(k)
                policy.insert(k, meta.parent if meta else None)
                self._st.record("stored", ti, [k], [meta.namespace_id if meta else None])
            else:  # never leave a page no policy tracks (not expected: a guard)
                tier.delete([k])

    def copy_down(self, ti: int, keys: Sequence[bytes], reason: str) -> None:
        """Copy ``keys`` from tier ``ti`` to ``ti + 1`` where they are not already present
        (a write-back: nor already copied once, see StoreState.clean)."""
        src, dst = self._st.tiers[ti], self._st.tiers[ti + 1]
        if reason == "write_back":
            with self._st.lock:
                clean = self._st.clean[ti]
                keys = [k for k in keys if k not in clean]
        keys = [k for k, there in zip(keys, dst.contains(list(keys))) if not there]
        metas = [m for m in (src.meta(k) for k in keys) if m is not None]
        if not metas:
            return
        bufs = self._st.scratch(len(metas))
        by_ns: dict[bytes, list[int]] = {}
        for i, m in enumerate(metas):
            by_ns.setdefault(m.namespace_id, []).append(i)
        ok_m, ok_v = [], []
        for ns, idx in by_ns.items():
            found = self._st.timed_read(src, ns, [metas[i].key for i in idx], [bufs[i] for i in idx])
            for i, f in zip(idx, found):
                if f:
                    ok_m.append(metas[i])
                    ok_v.append(bufs[i])
        if ok_m:
            self._st.metrics.copies.labels(reason, dst.name).inc(len(ok_m))
            self.store_into(ti + 1, ok_m, ok_v)

    def adopt(self, ti: int, metas: Sequence[BlockMeta]) -> None:
        """Track pages an engine committed in pool tier ``ti`` as if they had been put there
        (write-through copies them down, in the background)."""
        with self._st.lock:
            policy = self._st.policies[ti]
            entered = []
            for meta in metas:
                if meta.key not in policy and len(policy) < policy.capacity:
                    policy.insert(meta.key, meta.parent)
                    entered.append(meta)
            self._entered(ti, [m.key for m in metas])
            self._st.record("stored", ti, [m.key for m in entered],
                            [m.namespace_id for m in entered],
                            token_ids=[m.token_ids for m in entered])
        if self._st.write_policy == "write_through" and ti + 1 < len(self._st.tiers):
            self._st.background(self.copy_down, ti, [m.key for m in metas], "write_through")

    def evict(self, ti: int, n: int) -> int:
        """Evict up to ``n`` pages of tier ``ti`` by its policy (write-back applies, outside the
        lock). Returns how many pages left the tier."""
        before = self._st.tiers[ti].used_pages
        if not self.evict_ahead(ti, n):
            return 0
        return max(0, before - self._st.tiers[ti].used_pages)

    def delete(self, keys: list[bytes], namespace_id: bytes | None = None) -> int:
        """Remove ``keys`` (checked) from every tier: untracked under the lock, deleted outside
        it where that is I/O. Returns how many tier copies were deleted. ``namespace_id``: the
        caller's (checked against local tiers): a shared tier's removals carry it."""
        n = 0
        shared, slow = [], []
        with self._st.lock:
            for ti, tier in enumerate(self._st.tiers):
                policy = self._st.policies[ti]
                tracked = [k for k in keys if k in policy] if tier.shared else []
                for k in keys:
                    policy.remove(k)
                    self._st.hits[ti].pop(k, None)
                self._st.clean[ti].difference_update(keys)
                if tier.shared:
                    shared.append(tier)
                    self._st.record("removed", ti, tracked, [namespace_id] * len(tracked),
                                    reason="deleted")
                    continue
                # which of them it held, and whose they were (a local index check)
                held = [k for k, here in zip(keys, tier.contains(keys)) if here]
                spaces = self._st.namespaces_of(tier, held)
                self._st.record("removed", ti, held, spaces, reason="deleted")
                if self.deletes_slowly(tier):
                    self.begin_delete(ti, keys)
                    slow.append(ti)
                else:
                    n += tier.delete(keys)  # an in-memory index update: policy == tier
            self._st.removals += 1  # after the deletes (see StoreState.removals)
        for ti in slow:  # I/O outside the lock
            n += self.delete_off_lock(ti, keys)
        for tier in shared:  # network I/O outside the lock
            n += tier.delete(keys)
        return n


def _one_namespace(metas: Sequence[BlockMeta]) -> bytes | None:
    """The namespace of ``metas`` when they share one (a budget applies), else None."""
    if not metas:
        return None
    ns = metas[0].namespace_id
    return ns if all(m.namespace_id == ns for m in metas) else None


__all__ = ["Room"]
