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
from tests.server.daemon_proc import ROOT, DaemonProc, write_config
from tests.vllm.prompts import LOADABLE
from tests.vllm.test_vllm_daemon import VLLM_LAYOUT


def _child(model: str, target: str) -> subprocess.CompletedProcess[str]:
    """vLLM in its default layout: no VLLM_ENABLE_V1_MULTIPROCESSING (conftest sets it for
    this process's engines)."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, str(ROOT / "tests/vllm/default_layout_child.py"), model, target],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)


@pytest.mark.timeout(600)
def test_default_process_layout_loads_from_the_daemon(tiny_llama: str, expected: list[list[int]],
                                                      tmp_path: Path) -> None:
    cfg = write_config(tmp_path, host="64MiB", disk=None, layout=VLLM_LAYOUT)
    with DaemonProc(cfg) as d:
        proc = _child(tiny_llama, d.target)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stderr[-4000:]
        out = json.loads(lines[0][len("RESULT "):])
        assert out["first"] == [expected[0], 0]
        assert out["second"] == [expected[0], LOADABLE]  # vLLM's count of loaded tokens ...
        with DaemonStore(d.target) as c:  # ... and the store's: every block hit, none missed
            st = c.stats(check_integrity=True)
            host = st.tier("host")
            assert host.hits == LOADABLE // ve.BLOCK_SIZE and host.misses == 0
            assert st.integrity_error == ""
            assert (st.active_leases, st.open_load_handles, st.open_store_handles) == (0, 0, 0)


@pytest.mark.timeout(600)
def test_in_process_mode_in_the_default_layout_is_refused_with_one_line(tiny_llama: str) -> None:
    """Each process would build a store of its own and reuse nothing: vLLM does not start,
    and the error says why and what to set."""
    proc = _child(tiny_llama, "in-process")
    assert proc.returncode != 0 and "RESULT" not in proc.stdout
    assert ("kvstore's in-process mode needs vLLM's scheduler and workers in one process"
            in proc.stderr), proc.stderr[-4000:]
    assert "set kv_connector_extra_config.daemon" in proc.stderr
