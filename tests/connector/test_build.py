"""The in-process connector built from the typed configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from connector import InProcessScheduler, InProcessWorker, build_connector
from kvstore import InvalidArgument, build_store, load_config

SMALL = {"layout": {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "block_size": 4}}


def test_settings_reach_both_sides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTORE_CONNECTOR__PREFETCH_POLICY", "best_effort")
    cfg = load_config(overrides={
        **SMALL, "model_id": "m", "connector": {"prefetch_timeout_s": 0.5, "layerwise": False},
        "tiers": [{"kind": "host", "name": "ram", "capacity": "1MiB"},
                  {"kind": "disk", "name": "nvme", "path": str(tmp_path / "d"),
                   "capacity": "1MiB", "o_direct": False, "durability": "none"}],
    })
    store = build_store(cfg)
    sched, worker = build_connector(cfg, store, num_blocks=16)
    assert isinstance(sched, InProcessScheduler) and isinstance(worker, InProcessWorker)
    assert worker.prefetch_policy == "best_effort" and worker.prefetch_timeout_s == 0.5
    assert worker.layerwise is False and sched.num_blocks == 16
    assert sched.namespace.model_id == "m" and sched.namespace.layout == store.layout
    worker.close()
    store.close()


def test_a_store_without_a_host_tier_is_refused(tmp_path: Path) -> None:
    cfg = load_config(overrides={**SMALL, "tiers": [
        {"kind": "disk", "path": str(tmp_path / "d"), "capacity": "1MiB", "o_direct": False}]})
    store = build_store(cfg)
    with pytest.raises(InvalidArgument, match="needs a host tier"):
        build_connector(cfg, store, num_blocks=4)
    store.close()
