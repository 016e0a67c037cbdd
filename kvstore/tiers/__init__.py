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

#: kind -> (its tier class, its config model), as "module:Class" paths: the one line that
#: registers a kind (docs/tiers.md: adding a tier). The config model's module must be light (it
#: imports none of the tier's dependencies: every configuration load imports it, and the
#: config's tier list is the discriminated union of these models); the tier's module is imported
#: only when the kind is configured.
TIER_KINDS: dict[str, tuple[str, str]] = {
    "hbm": ("kvstore.tiers.hbm:HBMTier", "kvstore.tiers.hbm_config:HBMTierConfig"),
    "host": ("kvstore.tiers.host:HostTier", "kvstore.tiers.host_config:HostTierConfig"),
    "disk": ("kvstore.tiers.disk:DiskTier", "kvstore.tiers.disk_config:DiskTierConfig"),
    "redis": ("kvstore.tiers.redis:RedisTier", "kvstore.tiers.redis_config:RedisTierConfig"),
}
#: kind -> "module:Class" of its tier
TIERS: dict[str, str] = {kind: tier for kind, (tier, _) in TIER_KINDS.items()}
#: kind -> "module:Class" of its config model
TIER_CONFIGS: dict[str, str] = {kind: model for kind, (_, model) in TIER_KINDS.items()}


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
    cfg: TierConfigBase, layout: KVLayout, metrics: Metrics, *, mac: RecordMac | None = None,
    store_token_ids: bool = False, **runtime: Any
) -> Tier:
    """Build a tier from its validated config model (``kvstore.tiers.<kind>_config``); a tier
    that writes records also gets ``mac`` (None: the public key, integrity only) and
    ``store_token_ids`` (``security.store_token_ids``); ``runtime``: constructor arguments the
    config cannot hold (the daemon hands the host tier its shared-memory slab)."""
    cls = tier_class(cfg.kind)
    if cls.writes_records:
        runtime["store_token_ids"] = store_token_ids
        if mac is not None:
            runtime["mac"] = mac
    return cls(cfg, layout, metrics, **runtime)


__all__ = ["CONFIGS", "REGISTRY", "TIER_CONFIGS", "TIER_KINDS", "TIERS", "Tier", "make_tier",
           "tier_class", "tier_config_models"]
