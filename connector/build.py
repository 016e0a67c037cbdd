"""Building an engine's in-process connector from the typed configuration, over an embedded
store or over the sidecar daemon."""

from __future__ import annotations

from typing import TYPE_CHECKING

from connector.inprocess import InProcessScheduler, InProcessWorker
from kvstore.build import build_namespace
from kvstore.config import ConnectorConfig, KVStoreConfig
from kvstore.errors import InvalidArgument
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.api import StoreAPI

if TYPE_CHECKING:
    from connector.daemon import DaemonStore


def build_worker(conn: ConnectorConfig, store: StoreAPI, host_tier: str, *,
                 cpu_inline: bool = False) -> InProcessWorker:
    """The worker side over ``store`` (embedded or the daemon), staging through ``host_tier``,
    with ``conn``'s prefetch and layer-wise settings; ``cpu_inline`` as for
    :class:`InProcessWorker`."""
    return InProcessWorker(store, host_tier=host_tier,
                           prefetch_policy=conn.prefetch_policy,
                           prefetch_timeout_s=conn.prefetch_timeout_s, layerwise=conn.layerwise,
                           cpu_inline=cpu_inline)


def build_connector(
    cfg: KVStoreConfig, store: StoreAPI, *, num_blocks: int, namespace: Namespace | None = None
) -> tuple[InProcessScheduler, InProcessWorker]:
    """Both sides of the in-process connector over ``store`` (built from ``cfg``) for an engine
    whose KV cache has ``num_blocks`` blocks, with ``cfg.connector``'s settings. ``namespace``:
    default the configuration's (model id, layout, tenant salt). Raises InvalidArgument when the
    store has no host tier to stage loads through."""
    host = staging_host(cfg.connector, store)
    if namespace is None:
        namespace = build_namespace(cfg)
    return (
        InProcessScheduler(store, namespace, num_blocks=num_blocks, host_tier=host),
        build_worker(cfg.connector, store, host),
    )


def staging_host(conn: ConnectorConfig, store: StoreAPI) -> str:
    """The host tier the connector stages through: ``conn.host_tier``, else the store's first
    tier of page slots. Raises InvalidArgument when the store has none."""
    if conn.host_tier:
        return conn.host_tier
    try:
        return store.staging_tier().name
    except InvalidArgument:
        raise InvalidArgument(
            "the connector needs a host tier to stage loads through; this store has none",
            hint="add a tier of kind 'host' to tiers") from None


def connect_daemon(target: str, layout: KVLayout, *, token: str | None = None,
                   namespace_id: bytes | None = None, cuda: bool = False,
                   secret: bytes | None = None) -> DaemonStore:
    """A :class:`~connector.daemon.DaemonStore` at ``target`` for an engine whose pages are
    ``layout``; page-locked for DMA when ``cuda``. The daemon's host slab has the page size of
    its configured ``[layout]``, and every key's namespace the layout's fingerprint, so its
    layout must be exactly the engine's: a mismatch raises InvalidArgument naming both (and
    the ``[layout]`` to start the daemon with). ``secret``: the deployment secret, for the
    byte path's page seals (see DaemonStore). Raises DaemonUnavailable when nothing answers."""
    from connector.daemon import DaemonStore

    remote = DaemonStore(target, namespace_id, token=token, secret=secret)
    try:
        if not remote.shared_memory:
            raise InvalidArgument(
                f"the kvstore daemon at {target} shares no memory with this engine (a TCP "
                "connection): an engine loads and saves pages through the daemon's shared memory",
                hint="run the engine on the daemon's node and connect over its Unix socket "
                     "(unix:///path/kvstore.sock)")
        if remote.layout != layout:
            fields = _layout_fields(layout)
            want = ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}"
                             for k, v in fields.items()).replace("'", '"')
            env = " ".join(f"KVSTORE_LAYOUT__{k.upper()}={v}" for k, v in fields.items())
            raise InvalidArgument(
                f"the kvstore daemon at {target} stores pages of {remote.layout} "
                f"({remote.layout.page_bytes} bytes); this engine's are {layout} "
                f"({layout.page_bytes} bytes)",
                hint=f"start the daemon with [layout] {want} (in its config file, or as {env} "
                     "over the embedded default)")
        if cuda:
            remote.register_for_dma()
    except BaseException:
        remote.close()
        raise
    return remote


def _layout_fields(layout: KVLayout) -> dict[str, object]:
    return {"num_layers": layout.num_layers, "num_kv_heads": layout.num_kv_heads,
            "head_dim": layout.head_dim, "block_size": layout.block_size,
            "dtype": layout.dtype, "block_format": layout.block_format}


__all__ = ["build_connector", "build_worker", "connect_daemon", "staging_host"]
