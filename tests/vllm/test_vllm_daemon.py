"""kvstore's vLLM connector over a real ``kvstore serve`` sidecar (daemon mode): greedy tokens
identical to vLLM without a connector; a second engine (a new session) loads the prefix the
first one saved, and vLLM reports the loaded tokens; two cache salts never share a page
through the daemon; with the daemon down vLLM still serves (recomputing), and the failed calls
are counted; a daemon whose layout is not vLLM's is refused at start, naming both."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import vllm_engines as ve
from connector.daemon import DaemonStore
from connector.vllm import engine_stats, engine_store
from kvstore.errors import InvalidArgument
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config
from tests.vllm.prompts import LOADABLE, PROMPTS

#: the page layout of vLLM's CPU cache for the tiny Llama (2 layers, 2 KV heads of 32)
VLLM_LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 32, "block_size": ve.BLOCK_SIZE,
               "dtype": "float32", "block_format": "vllm-cpu"}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    with DaemonProc(write_config(tmp_path, host="64MiB", disk=None, layout=VLLM_LAYOUT)) as d:
        yield d


def _daemon_llm(model: str, target: str) -> Any:
    return ve.make_llm(model, ve.kvstore_transfer_config({"daemon": target}))


def test_daemon_mode_shares_across_engines_keeps_salts_apart_and_survives_an_outage(
        tiny_llama: str, expected: list[list[int]], daemon: DaemonProc) -> None:
    llm = _daemon_llm(tiny_llama, daemon.target)
    try:
        assert isinstance(engine_store(ve.engine_id(llm)), DaemonStore)
        assert [t for t, _ in ve.generate(llm, PROMPTS)] == expected  # saving changes nothing
        assert ve.generate(llm, [PROMPTS[0]], cache_salt="tenant-a")[0][0] == expected[0]
        st = engine_stats(ve.engine_id(llm))
        assert st.worker is not None and st.worker.blocks_saved > 0
        assert st.daemon_failures == {}
    finally:
        ve.close_llm(llm)  # its session ends; the pages stay in the daemon

    stats = DaemonStore(daemon.target)
    try:
        held = stats.stats().tier("host").used_pages
        assert held >= 2 * (LOADABLE // ve.BLOCK_SIZE)  # two namespaces' prefixes at least
        llm = _daemon_llm(tiny_llama, daemon.target)  # a second engine: nothing in its own cache
        try:
            eid = ve.engine_id(llm)
            tokens, cached = ve.generate(llm, [PROMPTS[1]])[0]
            assert (tokens, cached) == (expected[1], LOADABLE)
            assert engine_stats(eid).matched_tokens == {"host": LOADABLE}
            ve.reset_prefix_cache(llm)
            assert ve.generate(llm, [PROMPTS[0]], cache_salt="tenant-b")[0] == (expected[0], 0)
            ve.reset_prefix_cache(llm)
            tokens, cached = ve.generate(llm, [PROMPTS[0]], cache_salt="tenant-a")[0]
            assert (tokens, cached) == (expected[0], LOADABLE)
            st = engine_stats(eid)
            assert st.matched_tokens == {"host": 2 * LOADABLE}
            assert st.worker is not None
            assert st.worker.blocks_loaded == 2 * LOADABLE // ve.BLOCK_SIZE
            assert st.worker.load_failures == {}
            assert stats.stats(check_integrity=True).integrity_error == ""

            assert daemon.stop(signal.SIGTERM) == 0  # the daemon goes away under the engine
            ve.reset_prefix_cache(llm)
            assert ve.generate(llm, [PROMPTS[2]])[0] == (expected[2], 0)  # recomputed
            st = engine_stats(eid)
            assert st.daemon_failures.get("lookup", 0) >= 1
            assert st.worker is not None and st.worker.load_failures == {}
        finally:
            ve.close_llm(llm)
    finally:
        stats.close()


def test_a_daemon_with_another_layout_is_refused_naming_both(tiny_llama: str,
                                                             tmp_path: Path) -> None:
    with DaemonProc(write_config(tmp_path, disk=None)) as d:  # the daemon's own tiny layout
        with pytest.raises(InvalidArgument) as info:
            _daemon_llm(tiny_llama, d.target)
    msg = str(info.value)
    assert f"the kvstore daemon at {d.target} stores pages of KVLayout(num_layers=2" in msg
    assert f"head_dim={TINY_LAYOUT['head_dim']}" in msg
    assert "this engine's are KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, " \
           "block_size=32, dtype='float32', block_format='vllm-cpu') (32768 bytes)" in msg
    assert 'start the daemon with [layout] num_layers = 2, num_kv_heads = 2, head_dim = 32, ' \
           'block_size = 32, dtype = "float32", block_format = "vllm-cpu"' in msg
