"""Tier implementations, chosen by name. Each is imported only when configured, so an optional
dependency (lmdb, redis) is needed only by the deployments that use that tier."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvstore.registry import Registry
from kvstore.tiers.base import Tier
from kvstore.tiers.config_base import TierConfigBase

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
#: kind -> "module:Class" of its config model (light modules: no tier dependency imported);
#: the config's tier list is the discriminated union of these
TIER_CONFIGS: dict[str, str] = {
    "hbm": "kvstore.tiers.hbm_config:HBMTierConfig",
    "host": "kvstore.tiers.host_config:HostTierConfig",
    "disk": "kvstore.tiers.disk_config:DiskTierConfig",
    "redis": "kvstore.tiers.redis_config:RedisTierConfig",
}
#: Kinds whose pages leave the process as records (kvstore.record): they take the record MAC.
RECORD_TIERS = frozenset({"disk", "redis"})


REGISTRY: Registry[Tier] = Registry("tier kind", "tier kinds", Tier, TIERS)
CONFIGS: Registry[TierConfigBase] = Registry("tier config", "tier configs", TierConfigBase,
                                             TIER_CONFIGS)


def tier_config_models() -> list[type[TierConfigBase]]:
    """Every registered kind's config model, in registration order."""
    return [CONFIGS.resolve(kind) for kind in TIER_CONFIGS]


def tier_class(kind: str) -> type[Tier]:
    """The class of tier ``kind``: a registered kind or a ``package.module:Class`` path."""
    return REGISTRY.resolve(kind)


def make_tier(
    cfg: Any, layout: KVLayout, metrics: Metrics, *, mac: RecordMac | None = None,
    store_token_ids: bool = False, **extra: Any
) -> Tier:
    """Build a tier from its config model (``kvstore.tiers.<kind>_config``); a tier that writes
    records gets ``mac`` (None: the public key, integrity only) and ``store_token_ids``
    (``security.store_token_ids``); ``extra``: keyword arguments the config cannot hold (the
    daemon hands the host tier its shared-memory slab)."""
    cls = tier_class(cfg.kind)
    capacity_pages = int(cfg.capacity) // layout.page_bytes
    kwargs = {**cfg.tier_kwargs(), **extra}
    if cfg.kind in RECORD_TIERS:
        kwargs["store_token_ids"] = store_token_ids
        if mac is not None:
            kwargs["mac"] = mac
    return cls(cfg.name, layout, capacity_pages, metrics, **kwargs)


__all__ = ["CONFIGS", "RECORD_TIERS", "REGISTRY", "TIER_CONFIGS", "TIERS", "Tier", "make_tier",
           "tier_class", "tier_config_models"]
