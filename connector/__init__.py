"""Engine-facing connector API (scheduler side + worker side), shaped like vLLM's KV connector.

``connector.base`` holds the two interfaces and their typed metadata; ``connector.inprocess`` the
implementation over a :class:`~kvstore.store.TieredStore` in the engine's process (its copies
are the store's transfer engine, :mod:`kvstore.transfer`); ``connector.build`` builds it from
config.
"""

from connector.base import (
    ConnectorMetadata,
    ConnectorStats,
    FinishedRequests,
    KVCacheSpec,
    KVConnectorScheduler,
    KVConnectorWorker,
    LoadMatch,
    LoadSpec,
    SaveSpec,
)
from connector.build import build_connector
from connector.inprocess import InProcessScheduler, InProcessWorker

__all__ = [
    "ConnectorMetadata",
    "ConnectorStats",
    "FinishedRequests",
    "InProcessScheduler",
    "InProcessWorker",
    "KVCacheSpec",
    "KVConnectorScheduler",
    "KVConnectorWorker",
    "LoadMatch",
    "LoadSpec",
    "SaveSpec",
    "build_connector",
]
