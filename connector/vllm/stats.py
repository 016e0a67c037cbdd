"""The connector's counters as vLLM takes them: :meth:`KVStoreConnector.get_kv_connector_stats`
hands vLLM each side's counters (hits by tier, misses, pending lookups, blocks loaded and saved,
load errors by reason, daemon failures); vLLM's stat logger logs them ("KV Transfer metrics") and
its Prometheus logger exports them as ``vllm:kvstore_*_total`` (:data:`PROM_COUNTERS`).
:func:`~connector.vllm_engine.engine_stats` gives the totals. Every failed load or save is also
logged once with its reason (rate-limited, see :mod:`connector.failure_log`) and told to the
store, which counts it per namespace and reason -- in daemon mode the daemon, so ``kvstore
stats`` shows it whichever process failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import PromMetric, PromMetricT


@dataclass
class KVStoreConnectorStats(KVConnectorStats):
    """Counter increments, ``{"name": n}`` or ``{"name:label": n}`` (names and labels as in
    :meth:`KVStoreVLLMStats.counters`); sums when aggregated."""

    def reset(self) -> None:
        # annotated through a local: without vLLM the base class is Any and mypy infers from this
        empty: dict[str, int | float] = {}
        self.data = empty

    def aggregate(self, other: KVConnectorStats) -> KVStoreConnectorStats:
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(sorted(self.data.items()))

    def is_empty(self) -> bool:
        return not any(self.data.values())


#: Prometheus counters (``vllm:kvstore_<name>_total``): name -> (label, help).
PROM_COUNTERS: dict[str, tuple[str | None, str]] = {
    "hit_tokens": ("tier", "Prompt tokens kvstore offered to load, by the tier holding them."),
    "miss_tokens": (None, "Prompt tokens past vLLM's prefix cache that kvstore did not hold."),
    "pending_lookups": (None, "Lookups answered 'not yet' (a tier below host still reading)."),
    "skipped_requests": ("reason", "Requests kvstore does not cache, by reason."),
    "loaded_blocks": (None, "Blocks loaded into vLLM's KV cache by kvstore."),
    "saved_blocks": (None, "Blocks saved by kvstore."),
    "abandoned_saves": (None, "Saves kvstore dropped (no room, or the step ended early)."),
    "load_errors": ("reason", "Blocks kvstore failed to load (vLLM recomputed them), by reason."),
    "save_errors": ("reason", "Blocks kvstore failed to save (a later miss), by reason."),
    "daemon_failures": ("call", "Calls to the kvstore daemon that did not reach it, by call."),
}


class KVStorePromMetrics(KVConnectorPromMetrics):
    """:data:`PROM_COUNTERS`, fed from :class:`KVStoreConnectorStats` by vLLM's Prometheus
    logger (one child per engine and label value)."""

    def __init__(self, vllm_config: VllmConfig,
                 metric_types: dict[type[PromMetric], type[PromMetricT]],
                 labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._families: dict[str, Any] = {
            name: self._counter_cls(name=f"vllm:kvstore_{name}_total", documentation=doc,
                                    labelnames=self._labelnames + ([label] if label else []))
            for name, (label, doc) in PROM_COUNTERS.items()
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        engine_labels = self.per_engine_labelvalues[engine_idx]
        for key, value in transfer_stats_data.items():
            name, _, label = key.partition(":")
            family = self._families.get(name)
            if family is None or not value:
                continue  # a counter this version does not export
            family.labels(*engine_labels, *([label] if label else [])).inc(value)
