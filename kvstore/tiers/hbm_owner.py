"""The seam between a block pool that an engine uses in place (:class:`~kvstore.tiers.hbm.HBMTier`)
and whoever owns its eviction policy.

The pool keeps refcounts and the prefix cache (key -> block); it never picks victims itself. Its
owner does, through four calls, all made by the pool *without* holding the pool's lock (so an
owner may call back into the pool: ``delete``, ``read``, ``meta``, ``is_in_use``):

* ``reclaim(num_blocks) -> int`` — the pool needs ``num_blocks`` more free blocks for an
  ``allocate``: evict up to that many cached keys in the owner's victim order (skipping every key
  for which ``pool.is_in_use(key)`` is true), writing them elsewhere first if the owner wants to,
  then remove them with ``pool.delete``. Returns how many blocks it freed (best effort; the pool
  re-checks its free list afterwards). Returning 0 means "nothing more to evict".
* ``on_commit(metas)`` — the engine committed these blocks: they are new prefix-cache entries the
  owner should start tracking (and, under write-through, copy down).
* ``on_allocate()`` — an ``allocate`` took free blocks: an owner that keeps a free reserve
  queues its refill here (off the caller's thread: the caller is the engine's scheduler).
* ``on_hit(keys)`` — the engine reused these cached keys (``acquire_prefix``). Keys come deepest
  block first, so under LRU a prefix's tail is evicted before its head (vLLM frees a request's
  blocks in reverse order for the same reason).

``TieredStore`` is the owner in a tiered deployment (evicting by the tier's configured policy and
writing victims back per the write policy). :class:`kvstore.local_owner.LocalOwner` is the owner
of a pool that runs without a store — the runtime alone, or a test.

This module imports no torch, so the store can import it to recognise pools.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

from kvstore.keys import BlockMeta


class PoolOwner(Protocol):
    """Chooses and removes a pool's victims. See the module docstring for the contract."""

    def reclaim(self, num_blocks: int) -> int: ...

    def on_commit(self, metas: Sequence[BlockMeta]) -> None: ...

    def on_allocate(self) -> None: ...

    def on_hit(self, keys: Sequence[bytes]) -> None: ...


class OwnedPool(ABC):
    """Mixin of a tier whose blocks an engine also uses in place. Such a tier holds keys its
    owner must not evict (``is_in_use``) and calls its owner back (``attach``)."""

    @abstractmethod
    def attach(self, owner: PoolOwner | None) -> None:
        """Make ``owner`` the one that chooses this pool's victims (None: no owner; ``allocate``
        then uses free blocks only). Replaces any previous owner."""

    @abstractmethod
    def is_in_use(self, key: bytes) -> bool:
        """True while ``key`` is committed in a block some request references (refcount > 0).
        Such a key must not be chosen as a victim; deleting it anyway only unlinks the key — the
        block stays with its requests and is freed when they release it."""


__all__ = ["OwnedPool", "PoolOwner"]
