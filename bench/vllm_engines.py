"""Building vLLM engines for ``bench.vllm`` and tests/vllm: a tiny Llama checkpoint, an ``LLM``
with kvstore's connector (or vLLM's ExampleConnector, or none), greedy generation."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BLOCK_SIZE = 32  # the CPU attention backend refuses 16


def write_tiny_llama(path: Path, *, num_layers: int = 2, hidden: int = 128, seed: int = 0) -> str:
    """A random-weight Llama (2 layers, 4 heads of 32, 2 KV heads, vocabulary 512) saved by
    transformers. ``initializer_range=0.2`` makes greedy output vary (not one token over and
    over)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=num_layers, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=8192,
                      initializer_range=0.2)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(str(path), safe_serialization=True)
    return str(path)


def kvstore_transfer_config(extra: dict[str, Any]) -> Any:
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector="KVStoreConnector", kv_role="kv_both",
                            kv_connector_module_path="connector.vllm",
                            kv_load_failure_policy="recompute", kv_connector_extra_config=extra)


def example_transfer_config(path: str) -> Any:
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both",
                            kv_connector_extra_config={"shared_storage_path": path})


def make_llm(model: str, transfer: Any = None, *, max_model_len: int = 4096,
             **llm_kwargs: Any) -> Any:
    """A CPU ``vllm.LLM`` over ``model`` (token-id prompts, eager, block size 32);
    ``llm_kwargs`` go to ``LLM`` (``disable_log_stats=False`` for ``llm.get_metrics()``)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    return LLM(model=model, skip_tokenizer_init=True, enforce_eager=True,
               block_size=BLOCK_SIZE, dtype="float32", max_model_len=max_model_len,
               kv_transfer_config=transfer, seed=0, **llm_kwargs)


def close_llm(llm: Any) -> None:
    """Shut the engine down in this process (its connector closes its store)."""
    llm.llm_engine.engine_core.shutdown()


def engine_id(llm: Any) -> str:
    return str(llm.llm_engine.vllm_config.kv_transfer_config.engine_id)


def generate(llm: Any, prompts: list[list[int]], *, max_tokens: int = 8,
             cache_salt: str | None = None,
             kv_transfer_params: dict[str, Any] | None = None) -> list[tuple[list[int], int]]:
    """Greedy tokens and ``num_cached_tokens`` (vLLM's prefix-cache hits plus the tokens the
    connector loaded) of each prompt. ``kv_transfer_params``: every request's (as an OpenAI
    server request passes them)."""
    from vllm import SamplingParams

    extra = None if kv_transfer_params is None else {"kv_transfer_params": kv_transfer_params}
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, extra_args=extra)
    inputs: list[Any] = []
    for p in prompts:
        item: dict[str, Any] = {"prompt_token_ids": list(p)}
        if cache_salt is not None:
            item["cache_salt"] = cache_salt
        inputs.append(item)
    outs = llm.generate(inputs, sp, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), int(o.num_cached_tokens or 0)) for o in outs]


def reset_prefix_cache(llm: Any) -> None:
    """Drop vLLM's own prefix cache, so that a prefix can come only from the connector."""
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM kept its prefix cache: blocks are still held")


def ttft_s(llm: Any, prompts: Callable[[int], list[int]], runs: int, *,
           want_cached: int | None, before: Callable[[], None] = lambda: None,
           reset: bool = True) -> float:
    """Best TTFT of ``runs`` runs (after a warm-up run), vLLM's prefix cache reset before each
    (unless not ``reset``); ``want_cached``: what ``num_cached_tokens`` must be (None: not
    checked)."""
    times = []
    for i in range(runs + 1):
        before()
        if reset:
            reset_prefix_cache(llm)
        t0 = time.perf_counter()
        (_, cached), = generate(llm, [prompts(i)], max_tokens=1)
        dt = time.perf_counter() - t0
        if want_cached is not None and i > 0 and cached != want_cached:
            raise RuntimeError(f"run {i}: vLLM reports {cached} cached tokens, expected {want_cached}")
        if i:
            times.append(dt)
    return min(times)


def daemon_ttfts(model: str, directory: Path, *, max_len: int, runs: int,
                 fresh: Callable[[int], list[int]], same: list[int], hit: int) -> tuple[float, float]:
    """TTFT in seconds of no reuse (``fresh(i)``: a new prompt each run) and of a host hit
    (``same`` again; ``hit``: the tokens it must load) with kvstore's connector over a fresh
    ``kvstore serve`` in ``directory``: the sample daemon config of docs/vllm.md (one host tier) with
    ``model``'s page layout."""
    import json

    from kvstore import KVLayout
    from server.daemon.process import DaemonProcess, layout_env

    cfg = json.loads((Path(model) / "config.json").read_text())
    layout = KVLayout(cfg["num_hidden_layers"], cfg["num_key_value_heads"],
                      cfg["hidden_size"] // cfg["num_attention_heads"], BLOCK_SIZE, "float32",
                      "vllm-cpu")
    daemon = DaemonProcess(directory, {
        **layout_env(layout), "KVSTORE_MODEL_ID": "bench",
        "KVSTORE_TIERS": '[{"kind": "host", "capacity": "1GiB"}]'}).start()
    try:
        llm = make_llm(model, kvstore_transfer_config({"daemon": daemon.target}),
                       max_model_len=max_len)
        try:
            no_reuse = ttft_s(llm, fresh, runs, want_cached=0)
            generate(llm, [same], max_tokens=1)
            return no_reuse, ttft_s(llm, lambda i: same, runs, want_cached=hit)
        finally:
            close_llm(llm)
    finally:
        daemon.stop()
