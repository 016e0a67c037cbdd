"""Tier implementations, chosen by name. Each is imported only when configured, so an optional
dependency (lmdb, redis) is needed only by the deployments that use that tier."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvstore.registry import Registry
from kvstore.tiers.base import Tier

if TYPE_CHECKING:
    from kvstore.layout import KVLayout
    from kvstore.metrics import Metrics
    from kvstore.record import RecordMac

#: kind -> "module:Class"
TIERS: dict[str, str] = {
    "hbm": "kvstore.tiers.hbm:HBMTier",
    "host": "kvstore.tiers.host:HostTier",
    "disk": "kvstore.tiers.disk:DiskTier",
    "redis": "kvstore.tiers.redis:RedisTier",
}
#: Kinds whose pages leave the process as records (kvstore.record): they take the record MAC.
RECORD_TIERS = frozenset({"disk", "redis"})


REGISTRY: Registry[Tier] = Registry("tier kind", "tier kinds", Tier, TIERS)


def tier_class(kind: str) -> type[Tier]:
    """The class of tier ``kind``: a registered kind or a ``package.module:Class`` path."""
    return REGISTRY.resolve(kind)


def make_tier(
    cfg: Any, layout: KVLayout, metrics: Metrics, *, mac: RecordMac | None = None, **extra: Any
) -> Tier:
    """Build a tier from its config model (``kvstore.config.*TierConfig``); a tier that writes
    records gets ``mac`` (None: the public key, integrity only); ``extra``: keyword arguments
    the config cannot hold (the daemon hands the host tier its shared-memory slab)."""
    cls = tier_class(cfg.kind)
    capacity_pages = int(cfg.capacity) // layout.page_bytes
    kwargs = {**cfg.tier_kwargs(), **extra}
    if cfg.kind in RECORD_TIERS and mac is not None:
        kwargs["mac"] = mac
    return cls(cfg.name, layout, capacity_pages, metrics, **kwargs)


__all__ = ["RECORD_TIERS", "REGISTRY", "TIERS", "Tier", "make_tier", "tier_class"]
