"""Building an engine's in-process connector from the typed configuration."""

from __future__ import annotations

from connector.inprocess import InProcessScheduler, InProcessWorker
from kvstore.build import build_namespace
from kvstore.config import KVStoreConfig
from kvstore.errors import InvalidArgument
from kvstore.keys import Namespace
from kvstore.store import TieredStore
from kvstore.tiers.slab import SlabSlots


def build_connector(
    cfg: KVStoreConfig, store: TieredStore, *, num_blocks: int, namespace: Namespace | None = None
) -> tuple[InProcessScheduler, InProcessWorker]:
    """Both sides of the in-process connector over ``store`` (built from ``cfg``) for an engine
    whose KV cache has ``num_blocks`` blocks, with ``cfg.connector``'s settings. ``namespace``:
    default the configuration's (model id, layout, tenant salt). Raises InvalidArgument when the
    store has no host tier to stage loads through."""
    conn = cfg.connector
    host = conn.host_tier or next(
        (t.name for t in store.tiers if isinstance(t, SlabSlots)), None)
    if host is None:
        raise InvalidArgument(
            "the connector needs a host tier to stage loads through; this store has none",
            hint="add a tier of kind 'host' to tiers")
    if namespace is None:
        namespace = build_namespace(cfg)
    return (
        InProcessScheduler(store, namespace, num_blocks=num_blocks, host_tier=host),
        InProcessWorker(store, host_tier=host, prefetch_policy=conn.prefetch_policy,
                        prefetch_timeout_s=conn.prefetch_timeout_s, layerwise=conn.layerwise),
    )


__all__ = ["build_connector"]
