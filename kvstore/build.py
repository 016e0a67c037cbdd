"""Building a store (and its namespace) from the typed configuration."""

from __future__ import annotations

import errno

from kvstore.config import KVStoreConfig, TierConfig
from kvstore.errors import ConfigError
from kvstore.layout import KVLayout
from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.sizes import format_size
from kvstore.store import TieredStore
from kvstore.tiers import Tier, make_tier


def build_store(cfg: KVStoreConfig, metrics: Metrics | None = None) -> TieredStore:
    """Open every configured tier, fastest first, and compose them. If a tier fails to open,
    the ones already opened are closed and the error propagates (the start stops)."""
    metrics = metrics if metrics is not None else Metrics()
    layout = cfg.layout.build()
    tiers: list[Tier] = []
    try:
        for i, tcfg in enumerate(cfg.tiers):
            tiers.append(_open_tier(i, tcfg, layout, metrics))
        s = cfg.store
        return TieredStore(
            layout,
            tiers,
            [t.policy for t in cfg.tiers],
            write_policy=s.write_policy,
            selective_hits=s.selective_hits,
            promote_on_hit=s.promote_on_hit,
            lease_ttl_s=s.lease_ttl_s,
            prefetch_workers=s.prefetch_workers,
            metrics=metrics,
        )
    except BaseException:
        for t in tiers:
            t.close()
        raise


def _open_tier(i: int, tcfg: TierConfig, layout: KVLayout, metrics: Metrics) -> Tier:
    try:
        return make_tier(tcfg, layout, metrics)
    except OSError as exc:
        # A host slab is one mapping of its whole capacity: more than the machine can map is a
        # configuration error, not an OSError from deep inside the tier.
        if tcfg.kind != "host" or exc.errno != errno.ENOMEM:
            raise
        raise ConfigError(
            f"tiers.{i} ({tcfg.name!r}): a host tier of {format_size(tcfg.capacity)} cannot be "
            f"mapped on this machine ({exc.strerror})",
            hint=f"lower tiers.{i}.capacity to fit this machine's memory (README: operator "
            "notes, sizing the host tier)",
        ) from None


def build_namespace(cfg: KVStoreConfig) -> Namespace:
    return Namespace(cfg.model_id, cfg.layout.build(), cfg.tenant_salt)
