"""Tier implementations, chosen by name. Each is imported only when configured, so an optional
dependency (lmdb, redis) is needed only by the deployments that use that tier."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kvstore.errors import UnknownComponent
from kvstore.tiers.base import Tier

if TYPE_CHECKING:
    from kvstore.layout import KVLayout
    from kvstore.metrics import Metrics

#: kind -> "module:Class"
TIERS: dict[str, str] = {
    "hbm": "kvstore.tiers.hbm:HBMTier",
    "host": "kvstore.tiers.host:HostTier",
    "disk": "kvstore.tiers.disk:DiskTier",
    "redis": "kvstore.tiers.redis:RedisTier",
}


def tier_class(kind: str) -> type[Tier]:
    try:
        path = TIERS[kind]
    except KeyError:
        raise UnknownComponent(
            f"unknown tier kind {kind!r}", hint=f"known tier kinds: {sorted(TIERS)}"
        ) from None
    module, _, name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        # A configured tier that cannot load must stop the start, loudly.
        raise UnknownComponent(
            f"tier {kind!r} failed to import: {exc}",
            hint=f"install the dependencies of the {kind} tier",
        ) from exc
    return cls  # type: ignore[no-any-return]


def make_tier(cfg: Any, layout: KVLayout, metrics: Metrics, **extra: Any) -> Tier:
    """Build a tier from its config model (``kvstore.config.*TierConfig``); ``extra``: keyword
    arguments the config cannot hold (the daemon hands the host tier its shared-memory slab)."""
    cls = tier_class(cfg.kind)
    capacity_pages = int(cfg.capacity) // layout.page_bytes
    return cls(cfg.name, layout, capacity_pages, metrics, **cfg.tier_kwargs(), **extra)


__all__ = ["TIERS", "Tier", "make_tier", "tier_class"]
