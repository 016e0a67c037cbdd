"""A load that fails under vLLM (issue 34 item 3): the daemon is killed (SIGKILL) while the
worker loads a prefix the scheduler side matched and leased. The failure is logged once with
its reason, counted by the worker and -- once the daemon is back -- by the daemon, per
namespace and reason; vLLM recomputes the blocks, so greedy tokens are those of vLLM without
the plug-in, and the request's ``num_cached_tokens`` counts only what did load (vLLM's own
prefix-cache hit here), not what the connector offered."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench import vllm_engines as ve
from connector.vllm import engine_stats, engine_store
from tests.admin.conftest import TOKEN
from tests.redis_servers import free_port
from tests.server.daemon_proc import DaemonProc, write_config
from tests.vllm.prompts import LOADABLE, PREFIX, PROMPTS
from tests.vllm.test_vllm_daemon import VLLM_LAYOUT

B = ve.BLOCK_SIZE
LOCAL = 4 * B  # what vLLM's own prefix cache holds when the load fails


@pytest.mark.timeout(600)
def test_a_daemon_killed_mid_load_is_logged_counted_and_not_reported_as_cached(
        tiny_llama: str, expected: list[list[int]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    config, url = _with_admin(write_config(tmp_path, host="64MiB", disk=None,
                                           layout=VLLM_LAYOUT))
    with DaemonProc(config, env={"KVSTORE_ADMIN__TOKEN": TOKEN}) as d:
        llm = ve.make_llm(tiny_llama, ve.kvstore_transfer_config({"daemon": d.target}))
        try:
            eid = ve.engine_id(llm)
            assert ve.generate(llm, [PROMPTS[0]])[0] == (expected[0], 0)  # saves the prefix
            ve.reset_prefix_cache(llm)
            # its first LOCAL tokens are loaded, and stay in vLLM's prefix cache
            assert ve.generate(llm, [PREFIX[:LOCAL] + [5]])[0][1] == LOCAL

            # The scheduler side matches the rest of the prefix and leases it; the worker
            # reads which blocks host holds, then the daemon dies before the worker pins them.
            # (Killed later, during the copy out of the shared slab, the load still lands:
            # the pinned pages stay mapped in this process -- a load that worked.)
            client = engine_store(eid)
            pin = client.prepare_load

            def killing_pin(*args: Any, **kwargs: Any) -> Any:
                if d.proc is not None and d.proc.poll() is None:
                    d.proc.kill()
                    d.proc.wait()
                return pin(*args, **kwargs)

            monkeypatch.setattr(client, "prepare_load", killing_pin)
            with caplog.at_level(logging.WARNING, logger="kvstore"):
                tokens, cached = ve.generate(llm, [PROMPTS[1]])[0]
            failed = (LOADABLE - LOCAL) // B
            assert tokens == expected[1]  # recomputed: the same greedy tokens
            assert cached == LOCAL  # not LOADABLE: the failed blocks are not reported cached
            st = engine_stats(eid)
            assert st.worker is not None and st.worker.load_failures == {"unavailable": failed}
            assert st.matched_tokens["host"] == LOCAL + failed * B  # what was offered
            lines = [r.getMessage() for r in caplog.records
                     if r.getMessage().startswith("kvstore load of")]
            assert len(lines) == 1, lines  # once, with its reason and the exception
            assert lines[0].startswith(f"kvstore load of {failed} block(s) failed (reason "
                                       "unavailable): the "), lines[0]
            assert "daemon" in lines[0] and "hint: start `kvstore serve`" in lines[0]
            assert lines[0].endswith("they are recomputed")

            # the daemon comes back: the worker's count reaches it, for the namespace, and
            # the admin API (what `kvstore stats` shows) has it
            monkeypatch.undo()
            d.start()
            assert client.wait_connected(60.0)
            ns = next(n for n, c in client.namespace_counts.snapshot().rows.items()
                      if c.load_failed_unavailable)
            assert _daemon_row(url, ns)["load_failed_blocks"]["unavailable"] == failed
        finally:
            ve.close_llm(llm)


def _with_admin(config: Path) -> tuple[Path, str]:
    port = free_port()
    config.write_text(config.read_text() + f'\n[admin]\nlisten = "127.0.0.1:{port}"\n'
                      "sample_interval_s = 0.25\n")
    return config, f"http://127.0.0.1:{port}"


def _daemon_row(url: str, ns: bytes, timeout_s: float = 30.0) -> dict[str, Any]:
    """The admin API's stats row of namespace ``ns`` once it counts a failed load (clients
    tell without waiting for the reply, and the admin API samples)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=30) as http:
        while True:
            rows = http.get("/v1/stats").raise_for_status().json()["namespaces"]
            row = next((r for r in rows if r["namespace_id"] == ns.hex()), None)
            if (row is not None and any(row["load_failed_blocks"].values())) \
                    or time.monotonic() > deadline:
                assert row is not None, rows
                return row
            time.sleep(0.2)
