"""Building a store (and its namespace) from the typed configuration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvstore.config import KVStoreConfig
from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.store import TieredStore
from kvstore.tiers import Tier, make_tier


def build_store(
    cfg: KVStoreConfig,
    metrics: Metrics | None = None,
    *,
    tier_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> TieredStore:
    """Open every configured tier, fastest first, and compose them. If a tier fails to open,
    the ones already opened are closed and the error propagates (the start stops).
    ``tier_kwargs``: extra constructor arguments by tier name (e.g. a host tier's ``slab``)."""
    metrics = metrics if metrics is not None else Metrics()
    layout = cfg.layout.build()
    tiers: list[Tier] = []
    try:
        for tcfg in cfg.tiers:
            tiers.append(make_tier(tcfg, layout, metrics, **(tier_kwargs or {}).get(tcfg.name, {})))
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


def build_namespace(cfg: KVStoreConfig) -> Namespace:
    return Namespace(cfg.model_id, cfg.layout.build(), cfg.tenant_salt)
