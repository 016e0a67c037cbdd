"""Eviction policies, chosen by name from a registry and imported only when selected.

``make_policy("lru", capacity)`` builds a registered policy; ``make_policy("pkg.mod:MyPolicy",
capacity)`` builds a user's own ``EvictionPolicy`` subclass from its import path. The contract
every policy implements is in :mod:`kvstore.policy.base`.
"""

from __future__ import annotations

from kvstore.policy.base import EvictionPolicy
from kvstore.registry import Registry

#: Registry name -> ``module:Class``. Modules are imported on first use only.
POLICIES: dict[str, str] = {
    "lru": "kvstore.policy.lru:LRUPolicy",
    "fifo": "kvstore.policy.fifo:FIFOPolicy",
    "lfu": "kvstore.policy.lfu:LFUPolicy",
    "s3fifo": "kvstore.policy.s3fifo:S3FIFOPolicy",
    "arc": "kvstore.policy.arc:ARCPolicy",
    "lineage": "kvstore.policy.lineage:LineagePolicy",
    "lineage_arc": "kvstore.policy.lineage_arc:LineageARCPolicy",
}

REGISTRY: Registry[EvictionPolicy] = Registry("eviction policy", "policies", EvictionPolicy,
                                               POLICIES)

__all__ = ["POLICIES", "REGISTRY", "EvictionPolicy", "available_policies", "make_policy"]


def available_policies() -> list[str]:
    """The registered policy names, sorted."""
    return sorted(POLICIES)


def make_policy(spec: str, capacity: int) -> EvictionPolicy:
    """Build the policy that ``spec`` names, for a tier of ``capacity`` pages.

    ``spec`` is a registry name (see :func:`available_policies`) or an import path
    ``"package.module:ClassName"`` of an :class:`EvictionPolicy` subclass.

    Raises :class:`~kvstore.errors.UnknownComponent` for an unknown name, a module or attribute
    that does not exist, or a class that is not an ``EvictionPolicy``; ``ValueError`` for
    ``capacity < 1``; also for a registered policy whose module fails to import (a broken
    install stops the start, loudly). Resolution is :class:`kvstore.registry.Registry`'s.
    """
    return REGISTRY.resolve(spec)(capacity)
