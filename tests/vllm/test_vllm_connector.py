"""kvstore's connector inside a real ``vllm.LLM`` (CPU backend, a tiny random-weight Llama):
greedy tokens are identical with and without it, and when the prefix comes from our host, disk
or Redis tier after vLLM's own prefix cache was dropped; vLLM reports the loaded tokens
(``num_cached_tokens``); a new process loads from the same disk directory; a page corrupted
on disk is recomputed; two cache salts never share a page; a layout we do not understand is
refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.vllm_engines import (
    BLOCK_SIZE,
    close_llm,
    engine_id,
    generate,
    kvstore_transfer_config,
    make_llm,
    reset_prefix_cache,
)
from connector.vllm import engine_stats, engine_store
from kvstore.errors import InvalidArgument
from tests.vllm.prompts import LOADABLE, PREFIX, PROMPTS

ROOT = Path(__file__).resolve().parents[2]


def _host(capacity: str = "64MiB") -> dict[str, Any]:
    return {"kind": "host", "capacity": capacity}


def _disk(path: Path) -> dict[str, Any]:
    return {"kind": "disk", "capacity": "64MiB", "path": str(path), "durability": "none"}


def _each_from_connector(llm: Any, expected: list[list[int]]) -> None:
    """Generate every prompt alone after dropping vLLM's prefix cache: the same tokens, with the
    prefix loaded by the connector and reported by vLLM."""
    for p, want in zip(PROMPTS, expected):
        reset_prefix_cache(llm)
        tokens, cached = generate(llm, [p])[0]
        assert tokens == want
        assert cached == LOADABLE


def _drop_host(llm: Any) -> None:
    store = engine_store(engine_id(llm))
    # vLLM returns a request's output before the connector's saver thread published its pages
    # (complete_store): evicting before that would miss the late ones, and their write-through
    # copies would read pages gone from host
    deadline = time.monotonic() + 30
    while store.open_store_handles:
        assert time.monotonic() < deadline, "saves still in flight after 30 s"
        time.sleep(0.01)
    store.drain()
    host = store.tier("host")
    store.evict(host.used_pages, tier="host")  # written through: disk/Redis keep theirs
    store.drain()
    assert host.used_pages == 0


def test_greedy_tokens_identical_and_host_hits_reported(tiny_llama: str, expected: list[list[int]]) -> None:
    llm = make_llm(tiny_llama, kvstore_transfer_config({"tiers": [_host()]}))
    try:
        first = generate(llm, PROMPTS)
        assert [t for t, _ in first] == expected  # saving changes nothing
        _each_from_connector(llm, expected)
        st = engine_stats(engine_id(llm))
        assert st.matched_tokens == {"host": 3 * LOADABLE}
        assert st.worker is not None
        assert st.worker.blocks_loaded == 3 * LOADABLE // BLOCK_SIZE
        assert st.worker.load_failures == {}
        assert st.worker.blocks_saved >= len(PREFIX) // BLOCK_SIZE
    finally:
        close_llm(llm)


def test_prefix_from_disk_and_redis(tiny_llama: str, expected: list[list[int]], tmp_path: Path,
                                    redis_server: Any) -> None:
    for lower in (_disk(tmp_path / "disk"), {"kind": "redis", "capacity": "64MiB",
                                              "url": redis_server.url}):
        cfg = {"tiers": [_host(), lower], "store": {"write_policy": "write_through"}}
        llm = make_llm(tiny_llama, kvstore_transfer_config(cfg))
        try:
            generate(llm, PROMPTS)
            _drop_host(llm)
            reset_prefix_cache(llm)
            tokens, cached = generate(llm, [PROMPTS[0]])[0]
            assert tokens == expected[0]
            assert cached == LOADABLE
            st = engine_stats(engine_id(llm))
            assert st.matched_tokens == {lower["kind"]: LOADABLE}  # found below host
            assert st.worker is not None and st.worker.load_failures == {}
        finally:
            close_llm(llm)


_CHILD = """
import json, os, sys
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from bench.vllm_engines import close_llm, engine_id, generate, kvstore_transfer_config, make_llm
from connector.vllm import engine_stats
model, disk, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cfg = {"tiers": [{"kind": "host", "capacity": "64MiB"},
                 {"kind": "disk", "capacity": "64MiB", "path": disk, "durability": "none"}]}
llm = make_llm(model, kvstore_transfer_config(cfg))
tokens, cached = generate(llm, [prompt])[0]
st = engine_stats(engine_id(llm))
close_llm(llm)
print("RESULT " + json.dumps({"tokens": tokens, "cached": cached, "matched": st.matched_tokens}))
"""


def _child(model: str, disk: Path, prompt: list[int]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _CHILD, model, str(disk), json.dumps(prompt)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])  # type: ignore[no-any-return]


def test_new_process_loads_the_prefix_from_the_same_disk(tiny_llama: str, expected: list[list[int]],
                                                          tmp_path: Path) -> None:
    cfg = {"tiers": [_host(), _disk(tmp_path / "disk")], "store": {"write_policy": "write_through"}}
    llm = make_llm(tiny_llama, kvstore_transfer_config(cfg))
    try:
        generate(llm, [PROMPTS[0]])
    finally:
        close_llm(llm)  # the disk tier is closed: its directory unlocked
    got = _child(tiny_llama, tmp_path / "disk", PROMPTS[1])
    assert got["tokens"] == expected[1]
    assert got["cached"] == len(PREFIX)  # the shared prefix, from disk
    assert got["matched"] == {"disk": len(PREFIX)}


def test_page_corrupted_on_disk_is_recomputed_and_counted(tiny_llama: str, expected: list[list[int]],
                                                          tmp_path: Path) -> None:
    cfg = {"tiers": [_host(), _disk(tmp_path / "disk")], "store": {"write_policy": "write_through"}}
    llm = make_llm(tiny_llama, kvstore_transfer_config(cfg))
    try:
        generate(llm, [PROMPTS[0]])
        _drop_host(llm)
        store = engine_store(engine_id(llm))
        disk = store.tier("disk")
        # the page of block 4: blocks 0..3 load, 4 and later are recomputed
        by_parent = {m.parent: m.key for k in disk.keys() if (m := disk.meta(k)) is not None}
        key = by_parent[next(m.namespace_id for k in disk.keys() if (m := disk.meta(k)))]
        for _ in range(4):
            key = by_parent[key]
        slot = disk.slot_of(key)
        path = tmp_path / "disk" / "slots.dat"
        slot_bytes = path.stat().st_size // disk.capacity_pages
        with open(path, "r+b") as f:  # one byte in the middle of the record's payload
            f.seek(slot * slot_bytes + slot_bytes // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))
        reset_prefix_cache(llm)
        tokens, cached = generate(llm, [PROMPTS[0]])[0]
        assert tokens == expected[0]
        # vLLM counted the tokens scheduled for loading; the connector lowers the count to the
        # blocks it did load (the 4 before the corrupt one) before vLLM reports it
        assert cached == 4 * BLOCK_SIZE
        assert disk.stats().corrupt == 1
        st = engine_stats(engine_id(llm))
        assert st.worker is not None
        assert st.worker.blocks_loaded == 4  # the blocks before the corrupt one
        assert st.worker.load_failures == {"miss": LOADABLE // BLOCK_SIZE - 4}
        # the recomputed blocks were saved again: the next request loads the whole prefix
        _drop_host(llm)
        reset_prefix_cache(llm)
        assert generate(llm, [PROMPTS[0]])[0] == (expected[0], LOADABLE)
        st = engine_stats(engine_id(llm))
        assert st.worker is not None and st.worker.blocks_loaded == 4 + LOADABLE // BLOCK_SIZE
    finally:
        close_llm(llm)


def test_two_cache_salts_never_share(tiny_llama: str, expected: list[list[int]]) -> None:
    llm = make_llm(tiny_llama, kvstore_transfer_config({"tiers": [_host()]}))
    try:
        assert generate(llm, [PROMPTS[0]], cache_salt="tenant-a")[0][0] == expected[0]
        reset_prefix_cache(llm)
        tokens, cached = generate(llm, [PROMPTS[0]], cache_salt="tenant-b")[0]
        assert (tokens, cached) == (expected[0], 0)
        reset_prefix_cache(llm)
        tokens, cached = generate(llm, [PROMPTS[0]], cache_salt="tenant-a")[0]
        assert (tokens, cached) == (expected[0], LOADABLE)
        reset_prefix_cache(llm)
        tokens, cached = generate(llm, [PROMPTS[0]])[0]  # no salt: a third namespace
        assert (tokens, cached) == (expected[0], 0)
    finally:
        close_llm(llm)


def test_a_vllm_layout_we_do_not_understand_is_refused(tiny_llama: str) -> None:
    from vllm.distributed.kv_transfer.kv_transfer_state import get_kv_transfer_group

    llm = make_llm(tiny_llama, kvstore_transfer_config({"tiers": [_host()]}))
    try:
        worker = get_kv_transfer_group()
        lay = worker._layout
        assert lay.block_format == "vllm-cpu"
        # a GPU backend's [2, num_blocks, block_size, heads, head_size] per layer
        bad = {n: torch.zeros(2, 8, lay.block_size, lay.num_kv_heads, lay.head_dim)
               for n in worker._layer_names}
        with pytest.raises(InvalidArgument, match="kvstore understands vllm-cpu"):
            worker.register_kv_caches(bad)
        # the engine still runs on the caches it registered
        assert generate(llm, [PROMPTS[0]], max_tokens=2)[0][0]
    finally:
        close_llm(llm)


def test_extra_config_errors_name_the_problem() -> None:
    from connector.vllm import load_kvstore_config
    from kvstore.errors import ConfigError
    from kvstore.layout import KVLayout

    lay = KVLayout(2, 2, 32, BLOCK_SIZE, "float32", "vllm-cpu")
    with pytest.raises(ConfigError, match=r"\['tiers'\] with daemon='unix:///tmp/k.sock': the "
                       "daemon's tiers and store are configured in its own config file"):
        load_kvstore_config({"daemon": "unix:///tmp/k.sock", "tiers": [_host()]}, lay, "m")
    with pytest.raises(ConfigError, match="daemon must be the daemon's address, got 7"):
        load_kvstore_config({"daemon": 7}, lay, "m")
    with pytest.raises(ConfigError, match="token without daemon"):
        load_kvstore_config({"token": "t"}, lay, "m")
    cfg = load_kvstore_config({"daemon": "unix:///tmp/k.sock", "token": "t",
                               "connector": {"prefetch_policy": "best_effort"}}, lay, "m")
    assert cfg.connector.prefetch_policy == "best_effort"
    with pytest.raises(ConfigError, match=r"unknown kv_connector_extra_config key\(s\) \['tier'\]"):
        load_kvstore_config({"tier": []}, lay, "m")
    cfg = load_kvstore_config({"tiers": [_host()], "tenant_salt": "t"}, lay, "my-model")
    assert (cfg.model_id, cfg.tenant_salt, cfg.layout.build()) == ("my-model", "t", lay)


def _metrics(llm: Any) -> dict[str, float]:
    """vLLM's Prometheus counters ``vllm:kvstore_*``, as ``name`` or ``name{label}``."""
    from vllm.v1.metrics.reader import Counter

    out: dict[str, float] = {}
    for m in llm.get_metrics():
        if isinstance(m, Counter) and m.name.startswith("vllm:kvstore_"):
            extra = [v for k, v in m.labels.items() if k not in ("engine", "model_name")]
            out[m.name + (f"{{{extra[0]}}}" if extra else "")] = m.value
    return out


def test_pending_redis_lookup_is_asked_again_and_loads(tiny_llama: str, expected: list[list[int]],
                                                       redis_server: Any) -> None:
    """A lookup that needs Redis answers "not yet" (None) while the server is stopped; vLLM asks
    again in later steps, and once Redis answers the prefix loads from it. vLLM's own stats
    (Prometheus, fed by get_kv_connector_stats) receive the hits, misses and pending lookups."""
    import threading

    redis = {"kind": "redis", "capacity": "64MiB", "url": redis_server.url,
             "timeout_s": 30.0}  # a stopped server is waited for, not a miss
    cfg = {"tiers": [_host(), redis], "store": {"write_policy": "write_through"}}
    llm = make_llm(tiny_llama, kvstore_transfer_config(cfg), disable_log_stats=False)
    try:
        assert generate(llm, [PROMPTS[0]])[0] == (expected[0], 0)
        _drop_host(llm)
        reset_prefix_cache(llm)
        redis_server.pause()  # SIGSTOP: connections stay open, nothing answers
        resume = threading.Timer(1.5, redis_server.resume)
        resume.start()
        try:
            tokens, cached = generate(llm, [PROMPTS[0]])[0]
        finally:
            resume.join()
        assert (tokens, cached) == (expected[0], LOADABLE)
        st = engine_stats(engine_id(llm))
        assert st.pending_lookups >= 1  # answered None at least once, then asked again
        assert st.matched_tokens == {"redis": LOADABLE}
        assert st.missed_tokens == LOADABLE  # the first request's
        assert st.worker is not None and st.worker.load_failures == {}
        assert st.worker.blocks_loaded == LOADABLE // BLOCK_SIZE
        m = _metrics(llm)
        assert m["vllm:kvstore_hit_tokens{redis}"] == LOADABLE
        assert m["vllm:kvstore_miss_tokens"] == LOADABLE
        assert m["vllm:kvstore_pending_lookups"] == st.pending_lookups
        assert m["vllm:kvstore_loaded_blocks"] == LOADABLE // BLOCK_SIZE
        assert m["vllm:kvstore_saved_blocks"] == st.worker.blocks_saved >= len(PREFIX) // BLOCK_SIZE
        assert m.get("vllm:kvstore_load_errors{miss}", 0) == 0
    finally:
        close_llm(llm)


def test_a_request_pins_its_prefix_through_kv_transfer_params(tiny_llama: str,
                                                               expected: list[list[int]]) -> None:
    """``kv_transfer_params={"kvstore_pin_ttl_s": ..., "kvstore_pin_tokens": ...}`` pins the
    prompt's prefix in the store (counted ``pins:made``): an explicit eviction of the host tier
    leaves it, and it loads from there; a bad ask is counted ``pins:refused`` and the request
    still runs."""
    llm = make_llm(tiny_llama, kvstore_transfer_config({"tiers": [_host()]}))
    try:
        pin = {"kvstore_pin_ttl_s": 600, "kvstore_pin_tokens": len(PREFIX)}
        assert generate(llm, [PROMPTS[0]], kv_transfer_params=pin)[0][0] == expected[0]
        bad = {"kvstore_pin_ttl_s": -1}
        assert generate(llm, [PROMPTS[1]], kv_transfer_params=bad)[0][0] == expected[1]
        assert engine_stats(engine_id(llm)).pins == {"made": 1, "refused": 1}
        generate(llm, [[(5 * i + 1) % 500 + 3 for i in range(6 * BLOCK_SIZE + 1)]])  # unpinned
        store = engine_store(engine_id(llm))
        deadline = time.monotonic() + 30
        while store.open_store_handles:  # saves still being published (see _drop_host)
            assert time.monotonic() < deadline, "saves still in flight after 30 s"
            time.sleep(0.01)
        store.drain()
        host = store.tier("host")
        assert store.evict(host.used_pages, tier="host") == 6  # all but the pinned prefix
        store.drain()
        assert host.used_pages == len(PREFIX) // BLOCK_SIZE
        reset_prefix_cache(llm)
        tokens, cached = generate(llm, [PROMPTS[0]])[0]
        assert tokens == expected[0] and cached >= len(PREFIX) // BLOCK_SIZE * BLOCK_SIZE
    finally:
        close_llm(llm)
