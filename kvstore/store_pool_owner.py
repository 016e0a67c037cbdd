"""The store as the owner of an engine's block pool (kvstore.tiers.hbm_owner): the pool asks it
for room, and tells it of allocations, commits and reuses."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.keys import BlockMeta
from kvstore.room import Room
from kvstore.store_state import StoreState


class StorePoolOwner:
    """The store as the owner of pool tier ``ti`` (see kvstore.tiers.hbm_owner): victims by the
    tier's policy, written back per the write policy (outside the store lock); commits and
    reuses feed the policy; allocations keep the pool's free reserve (kvstore.cleaner)."""

    def __init__(self, state: StoreState, room: Room, ti: int) -> None:
        self._st, self._room, self._ti = state, room, ti

    def reclaim(self, num_blocks: int) -> int:
        # the allocation found the pool's free reserve used up: it evicts (and writes back) on
        # the engine's thread, and the pool is cleaned ahead of need from now on
        self._st.check_open()
        freed = self._room.evict(self._ti, num_blocks)
        self._room.cleaner.note_inline(self._ti, freed)
        return freed

    def on_allocate(self) -> None:
        self._room.cleaner.check(self._ti)

    def on_commit(self, metas: Sequence[BlockMeta]) -> None:
        self._room.adopt(self._ti, metas)

    def on_hit(self, keys: Sequence[bytes]) -> None:
        with self._st.lock:
            self._st.policies[self._ti].access_many(keys)


__all__ = ["StorePoolOwner"]
