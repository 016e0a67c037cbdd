"""The owner of an engine's block pool when no store owns it (the runtime alone, or a test):
it picks victims by an eviction policy of its own and drops them. Kept out of ``kvstore.tiers``:
tiers know nothing of policies; whoever owns a pool does (see :mod:`kvstore.tiers.hbm_owner`)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import cast

from kvstore.keys import BlockMeta
from kvstore.policy import EvictionPolicy, make_policy
from kvstore.tiers.base import Tier
from kvstore.tiers.hbm_owner import OwnedPool


class LocalOwner:
    """The owner of a pool used without a store: evicts by an :class:`EvictionPolicy` of its own
    and drops victims (there is no tier below to write them to).

    It tracks the keys the engine commits (``on_commit``) and reuses (``on_hit``); pages written
    through the tier API (``Tier.write``) are not tracked — in a store the store tracks those.
    Keys deleted behind its back stay tracked until chosen, when their ``delete`` is a no-op.
    Thread-safe (one lock around the policy; never held while calling the pool).
    """

    def __init__(self, pool: Tier, policy: EvictionPolicy | str = "lru") -> None:
        if not isinstance(pool, OwnedPool):
            raise TypeError(f"LocalOwner needs an OwnedPool tier, got {type(pool).__name__}")
        self.pool = pool
        if isinstance(policy, str):
            policy = make_policy(policy, pool.capacity_pages)
        self.policy = policy
        self._lock = threading.Lock()
        #: Every victim chosen so far, in order (for tests and debugging).
        self.evicted: list[bytes] = []

    def reclaim(self, num_blocks: int) -> int:
        is_in_use = self.pool.is_in_use
        freed = 0
        while freed < num_blocks:
            with self._lock:
                # the policy was fed only 16-byte keys (on_commit), so it returns only those
                victims = cast(list[bytes], self.policy.evict(num_blocks - freed, is_in_use))
                self.evicted.extend(victims)
            if not victims:
                break
            before = self.pool.free_pages
            # A victim deleted behind our back (stale) or just taken by a request frees nothing;
            # the loop then asks the policy for the next one.
            self.pool.count_eviction(self.pool.delete(victims))
            freed += max(0, self.pool.free_pages - before)
        return freed

    def on_commit(self, metas: Sequence[BlockMeta]) -> None:
        with self._lock:
            for m in metas:
                self.policy.insert(m.key, m.parent)

    def on_allocate(self) -> None:
        """Nothing: without a store, a pool evicts only when an allocation finds no free
        block (there is no tier below to write back to)."""

    def on_hit(self, keys: Sequence[bytes]) -> None:
        with self._lock:
            self.policy.access_many(keys)


__all__ = ["LocalOwner"]
