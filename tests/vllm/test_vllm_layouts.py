"""The plug-in in vLLM's own process layout (issue 34): no environment override, so vLLM runs
its scheduler (EngineCore) and its worker in separate processes, each with its own client of
the daemon. The scheduler side leases what it matched; the worker takes the lease over by its
ticket and loads. A repeated prompt after ``reset_prefix_cache`` is served by loading --
counted by the daemon's store, not only by vLLM -- with greedy tokens identical to vLLM without
the plug-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import vllm_engines as ve
from connector.daemon import DaemonStore
from kvstore.keys import Namespace, shard_model_id
from tests.server.daemon_proc import ROOT, DaemonProc, write_config
from tests.vllm.prompts import LOADABLE, PREFIX, PROMPTS
from tests.vllm.test_vllm_daemon import VLLM_LAYOUT


def _child(model: str, target: str, tp: int = 1,
           *extra: str) -> subprocess.CompletedProcess[str]:
    """vLLM in its default layout: no VLLM_ENABLE_V1_MULTIPROCESSING (conftest sets it for
    this process's engines). With ``tp`` > 1 each worker's threads get their share of this
    machine's cores: vLLM's CPU build binds one NUMA node per worker by itself and refuses
    when there are fewer nodes than workers, as here (its documented remedy,
    VLLM_CPU_OMP_THREADS_BIND)."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PYTHONPATH"] = str(ROOT)
    if tp > 1:
        cpus = sorted(os.sched_getaffinity(0))
        share = max(1, len(cpus) // tp)
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
            ",".join(map(str, cpus[r * share:(r + 1) * share] or cpus[-1:])) for r in range(tp))
    return subprocess.run(
        [sys.executable, str(ROOT / "tests/vllm/default_layout_child.py"), model, target,
         "--tp", str(tp), *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, list[list[int] | int]]:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[0][len("RESULT "):])  # type: ignore[no-any-return]


@pytest.mark.timeout(600)
def test_default_process_layout_loads_from_the_daemon(tiny_llama: str, expected: list[list[int]],
                                                      tmp_path: Path) -> None:
    cfg = write_config(tmp_path, host="64MiB", disk=None, layout=VLLM_LAYOUT)
    with DaemonProc(cfg) as d:
        out = _result(_child(tiny_llama, d.target))
        assert out["first"] == [expected[0], 0]
        assert out["second"] == [expected[0], LOADABLE]  # vLLM's count of loaded tokens ...
        with DaemonStore(d.target) as c:  # ... and the store's: every block hit, none missed
            st = c.stats(check_integrity=True)
            host = st.tier("host")
            assert host.hits == LOADABLE // ve.BLOCK_SIZE and host.misses == 0
            assert st.integrity_error == ""
            assert (st.active_leases, st.open_load_handles, st.open_store_handles) == (0, 0, 0)


@pytest.mark.timeout(600)
def test_a_request_s_pin_reaches_the_daemon_in_the_default_layout(tiny_llama: str,
                                                                   expected: list[list[int]],
                                                                   tmp_path: Path) -> None:
    """``kv_transfer_params`` asking a pin, with vLLM's scheduler in its EngineCore process: the
    daemon holds the pin -- the prompt's prefix blocks under the engine's namespace, for the
    TTL asked -- and the request's tokens are unchanged."""
    cfg = write_config(tmp_path, host="64MiB", disk=None, layout=VLLM_LAYOUT)
    with DaemonProc(cfg) as d:
        out = _result(_child(tiny_llama, d.target, 1, "--pin-ttl", "600",
                             "--pin-tokens", str(len(PREFIX))))
        assert out["first"] == [expected[0], 0]
        with DaemonStore(d.target) as c:
            ns = Namespace(shard_model_id(tiny_llama, 0, 1), c.layout)
            (pin,) = c.retention(ns.id).pins
            assert pin.keys == tuple(ns.chain(PREFIX).keys)
            host = {t.tier: t for t in c.retention(ns.id).tiers}["host"]
            assert host.pinned_bytes == len(PREFIX) // ve.BLOCK_SIZE * c.layout.page_bytes


@pytest.mark.timeout(600)
def test_in_process_mode_in_the_default_layout_is_refused_with_one_line(tiny_llama: str) -> None:
    """Each process would build a store of its own and reuse nothing: vLLM does not start,
    and the error says why and what to set."""
    proc = _child(tiny_llama, "in-process")
    assert proc.returncode != 0 and "RESULT" not in proc.stdout
    assert ("kvstore's in-process mode needs vLLM's scheduler and one worker in one process"
            in proc.stderr), proc.stderr[-4000:]
    assert "set kv_connector_extra_config.daemon" in proc.stderr


#: one tensor-parallel worker's page layout: the tiny Llama's 2 KV heads split over 2 ranks
TP2_LAYOUT = {**VLLM_LAYOUT, "num_kv_heads": 1}


@pytest.mark.timeout(900)
def test_tensor_parallel_shards_load_from_the_daemon(tiny_llama: str, tmp_path: Path) -> None:
    """tensor_parallel_size=2 on vLLM's CPU build: each worker saves its shard of every block in
    its shard's namespace, and a repeated prompt loads both shards of every block -- counted by
    the daemon per shard -- with greedy tokens identical to the same engine without the
    plug-in."""
    plain = _result(_child(tiny_llama, "none", tp=2))
    assert plain["first"][1] == 0 and plain["second"] == [plain["first"][0], 0]
    cfg = write_config(tmp_path, host="64MiB", disk=None, layout=TP2_LAYOUT)
    with DaemonProc(cfg) as d:
        out = _result(_child(tiny_llama, d.target, tp=2))
        assert out["first"] == [plain["first"][0], 0]
        assert out["second"] == [plain["first"][0], LOADABLE]
        blocks = LOADABLE // ve.BLOCK_SIZE
        with DaemonStore(d.target) as c:
            st = c.stats(check_integrity=True)
            host = st.tier("host")
            assert host.hits == 2 * blocks and host.misses == 0  # both shards of every block
            assert st.integrity_error == ""
            assert (st.active_leases, st.open_load_handles, st.open_store_handles) == (0, 0, 0)
            for rank in (0, 1):  # each shard's pages under its own namespace
                ns = Namespace(shard_model_id(tiny_llama, rank, 2), c.layout)
                keys = ns.chain(PROMPTS[0]).keys
                assert c.lookup(keys, namespace_id=ns.id).num_blocks == len(keys)
            whole = Namespace(tiny_llama, c.layout).chain(PROMPTS[0]).keys
            assert c.lookup(whole, namespace_id=Namespace(tiny_llama, c.layout).id).num_blocks == 0
