"""Building a store (and its namespace), or one tier alone, from the typed configuration."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kvstore.config import KVStoreConfig, TierConfig, tier_config_error
from kvstore.errors import ConfigError, InvalidArgument
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.record import RecordMac
from kvstore.store import TieredStore
from kvstore.tiers import Tier, make_tier, tier_class
from kvstore.tiers.config_base import TierConfigBase

log = logging.getLogger("kvstore.build")


def build_store(
    cfg: KVStoreConfig,
    metrics: Metrics | None = None,
    *,
    tier_runtime: Mapping[str, Mapping[str, Any]] | None = None,
) -> TieredStore:
    """Open every configured tier, fastest first, and compose them. If a tier fails to open,
    the ones already opened are closed and the error propagates (the start stops).
    ``tier_runtime``: by tier name, constructor arguments no config can hold (the host tier's
    shared-memory ``slab``)."""
    metrics = metrics if metrics is not None else Metrics()
    layout = cfg.layout.build()
    mac = RecordMac(cfg.security.secret_bytes())
    shared = [t.name for t in cfg.tiers if tier_class(t.kind).shared]
    if shared and not mac.authenticated:
        log.warning(
            "shared tier(s) %s run without security.secret: their records are checked for "
            "integrity only, and anyone who can write to them can have forged pages served; "
            "set KVSTORE_SECURITY__SECRET or security.secret_file on every node", shared,
        )
    tiers: list[Tier] = []
    try:
        for i, tcfg in enumerate(cfg.tiers):
            extra = (tier_runtime or {}).get(tcfg.name, {})
            tiers.append(_open_tier(i, tcfg, layout, metrics, mac,
                                    cfg.security.store_token_ids, extra))
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
            free_reserve=s.free_reserve,
            switch_interval_ms=s.switch_interval_ms,
            event_log_events=s.event_log_events,
            max_pinned_fraction=s.max_pinned_fraction,
            event_token_ids=[bytes.fromhex(n) for n in s.event_token_ids],
            metrics=metrics,
        )
    except BaseException:
        for t in tiers:
            t.close()
        raise


def _open_tier(i: int, tcfg: TierConfig, layout: KVLayout, metrics: Metrics,
               mac: RecordMac, store_token_ids: bool, extra: Mapping[str, Any]) -> Tier:
    try:
        return make_tier(tcfg, layout, metrics, mac=mac, store_token_ids=store_token_ids,
                         **extra)
    except InvalidArgument as exc:
        # A host slab is one mapping of its whole capacity: more than the machine can map is a
        # configuration error of that entry (the tier itself refuses it before mapping).
        if tcfg.kind != "host":
            raise
        raise ConfigError(
            f"tiers.{i} ({tcfg.name!r}): {exc.message}",
            hint=f"lower tiers.{i}.capacity to fit this machine's memory (docs/operations.md: "
            "sizing the host tier)",
        ) from None


def build_tier(
    cfg: TierConfig | Mapping[str, Any],
    layout: KVLayout,
    metrics: Metrics | None = None,
    *,
    mac: RecordMac | None = None,
    store_token_ids: bool = False,
    **extra: Any,
) -> Tier:
    """One tier, opened alone, from an entry of the configuration's tier list: its config model,
    or a mapping such as ``{"kind": "disk", "capacity": "64GiB", "path": "/nvme/kv"}`` validated
    as the list's entries are. For benchmarks of one tier, and for a store an engine composes
    around its own pool (:mod:`kvstore.pool`). ``mac``: the record MAC of a tier that writes
    records (None: the public key, integrity only); ``store_token_ids``: as
    ``security.store_token_ids``; ``extra``: constructor arguments no config holds (a host
    tier's shared-memory ``slab``). Raises ConfigError naming each bad field; a tier that cannot
    open raises as it does in :func:`build_store`."""
    if not isinstance(cfg, TierConfigBase):
        try:
            cfg = _TIER_ENTRY.validate_python(dict(cfg))
        except ValidationError as exc:
            raise tier_config_error(exc) from None
    return make_tier(cfg, layout, metrics if metrics is not None else Metrics(), mac=mac,
                     store_token_ids=store_token_ids, **extra)


#: Validates one entry of ``KVStoreConfig.tiers`` (the union of the registered kinds' models).
_TIER_ENTRY: TypeAdapter[TierConfig] = TypeAdapter(TierConfig)


def build_namespace(cfg: KVStoreConfig) -> Namespace:
    """The configured namespace; its tenant salt is keyed by ``security.secret`` when set."""
    return Namespace(
        cfg.model_id, cfg.layout.build(), cfg.tenant_salt, cfg.security.secret_bytes()
    )
