"""The engine-facing block pool: the paged KV cache an engine uses in place, which is at once the
store's fastest tier. This is its public home (``kvstore.tiers`` is the store's own): an engine
or a benchmark builds its pool here, and reaches every other tier through configuration
(:func:`kvstore.build_store`, :func:`kvstore.build_tier`).

* :class:`HBMTier` — the pool: ``pool`` (``[num_blocks, *layout.page_shape]``, the model's KV
  cache), ``allocate / commit / acquire_prefix / acquire / release`` for the engine's block
  tables, and the :class:`~kvstore.Tier` calls the store makes. Its block states and guarantees
  are in its module's docstring.
* :class:`CommitResult` — what ``commit`` did with one block (a duplicate key points the caller
  at the block that already holds it).
* :class:`PoolOwner` — the calls (``reclaim``, ``on_commit``, ``on_hit``, ...) by which whoever
  owns the pool's eviction policy chooses its victims: a :class:`~kvstore.TieredStore` that the
  pool is a tier of, or :class:`LocalOwner` for a pool used without a store.

Threading: every call of the pool is thread-safe; it calls its owner without holding its lock.
"""

from __future__ import annotations

from kvstore.local_owner import LocalOwner
from kvstore.tiers.hbm import CommitResult, HBMTier
from kvstore.tiers.hbm_owner import PoolOwner

__all__ = ["CommitResult", "HBMTier", "LocalOwner", "PoolOwner"]
