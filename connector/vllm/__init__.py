"""kvstore as a vLLM KV connector (``KVConnectorBase_V1``), loaded by vLLM through
``kv_connector_module_path``::

    KVTransferConfig(kv_connector="KVStoreConnector", kv_connector_module_path="connector.vllm",
                     kv_role="kv_both", kv_load_failure_policy="recompute",
                     kv_connector_extra_config={"config_file": "/etc/kvstore.toml"})

This is the only package of the project that imports vLLM (the optional extra ``kvstore[vllm]``).
It adapts vLLM's calls to :class:`~connector.inprocess.InProcessScheduler` and
:class:`~connector.inprocess.InProcessWorker`, which do the work through the store's staging
path; nothing here touches a tier. Its modules:

* :mod:`.connector` -- :class:`KVStoreConnector`, both of vLLM's sides (the calls each makes,
  a request's namespace, tensor parallelism);
* :mod:`.layout` -- the page layout of vLLM's KV cache (:func:`layout_for`,
  :data:`BLOCK_FORMATS`);
* :mod:`.request_state` -- what the scheduler side keeps per request;
* :mod:`.stats` -- the counters handed to vLLM's stat loggers and Prometheus.

Configuration (``kv_connector_extra_config``, read by :mod:`connector.vllm_engine`):

* in-process -- ``config_file`` (a kvstore TOML/YAML file) and any top-level field of
  :class:`~kvstore.config.KVStoreConfig` inline (``tiers``, ``store``, ``connector``,
  ``security``, ``tenant_salt``, ``model_id``), overriding the file. The store lives in vLLM's
  engine process, shared by the scheduler side and the worker side;
* daemon -- ``daemon: "unix:///path/kvstore.sock"`` (or ``"host:port"`` and ``token``): the
  tiers are a ``kvstore serve`` sidecar's, shared by every engine of the node and outliving
  them; ``connector``, ``security``, ``tenant_salt``, ``model_id`` still apply here (``tiers``
  and ``store`` are refused: they are the daemon's). The daemon's ``[layout]`` must be this
  engine's (``block_format = "vllm-cpu"`` and vLLM's shape), else the engine refuses to start
  with both layouts named. Each request's namespace (:mod:`.connector`) is named on every
  daemon call; the daemon keeps tenants apart and enforces its per-namespace quota. If the
  daemon goes down, vLLM recomputes (lookups miss, saves drop, each failed call counted) and the
  client reconnects when it is back.

The layout is vLLM's (it needs no configuring). Process layouts: through the daemon the two
sides may live in different processes -- vLLM's default on its CPU build, where the scheduler
runs in EngineCore and the worker in a process of its own: the scheduler side's lookup leases
the pages, and the worker's client takes the lease over by its ticket (see
:mod:`server.daemon.service`). In-process mode needs both sides and one worker in one process
(vLLM's ``uni`` executor); in any other layout it is refused at start
(:func:`~connector.vllm_engine.check_process_layout`), since each process would build a store of its own.

``kv_load_failure_policy`` must be ``"recompute"``: a page that fails its check is a miss, and
vLLM recomputes those tokens; with ``"fail"`` vLLM would fail the request instead.
"""

# vLLM finds the connector here by name (kv_connector="KVStoreConnector" in module
# connector.vllm): these re-exports are the plug-in's public surface
from connector.vllm.connector import KVStoreConnector, KVStoreConnectorMetadata
from connector.vllm.layout import BLOCK_FORMATS, layout_for
from connector.vllm.stats import PROM_COUNTERS, KVStoreConnectorStats, KVStorePromMetrics
from connector.vllm_engine import (
    KVStoreVLLMStats,
    engine_stats,
    engine_store,
    load_kvstore_config,
)

__all__ = [
    "BLOCK_FORMATS",
    "PROM_COUNTERS",
    "KVStoreConnector",
    "KVStoreConnectorMetadata",
    "KVStoreConnectorStats",
    "KVStorePromMetrics",
    "KVStoreVLLMStats",
    "engine_stats",
    "engine_store",
    "layout_for",
    "load_kvstore_config",
]
