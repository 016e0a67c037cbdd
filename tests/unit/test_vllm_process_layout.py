"""Which vLLM process layouts in-process mode refuses (no vLLM needed: the check is
:func:`connector.vllm_engine.check_process_layout`)."""

from __future__ import annotations

import pytest

from connector.vllm_engine import check_process_layout
from kvstore.errors import ConfigError


@pytest.mark.parametrize("backend", ["uni", None])
def test_one_worker_beside_the_scheduler_runs_in_process(backend: str | None) -> None:
    check_process_layout(backend, 1, daemon=False)


@pytest.mark.parametrize(("backend", "world", "why"), [
    ("mp", 1, "runs its workers in processes of their own"),
    ("ray", 1, "runs its workers in processes of their own"),
    ("mp", 4, "runs 4 tensor-parallel workers"),
])
def test_split_or_sharded_layouts_are_refused_in_process(backend: str, world: int,
                                                         why: str) -> None:
    with pytest.raises(ConfigError, match=why) as exc:
        check_process_layout(backend, world, daemon=False)
    assert "kv_connector_extra_config.daemon" in str(exc.value.hint)


@pytest.mark.parametrize(("backend", "world"), [("mp", 1), ("mp", 2), ("ray", 4), ("uni", 1),
                                                ("external_launcher", 1)])
def test_every_layout_with_one_scheduler_runs_over_the_daemon(backend: str, world: int) -> None:
    check_process_layout(backend, world, daemon=True)


@pytest.mark.parametrize("daemon", [True, False])
def test_torchrun_ranks_each_scheduling_on_their_own_are_refused(daemon: bool) -> None:
    with pytest.raises(ConfigError, match="each rank schedules on its own"):
        check_process_layout("external_launcher", 2, daemon=daemon)
