"""GPU machine only (-m gpu): the fast attention backend matches the reference on CUDA, in
float32 and bfloat16, for prefill, a cached prefix and decode in one batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runtime import (
    LlamaForPagedLM,
    SeqInput,
    allocate_kv_pool,
    build_batch,
    get_model_config,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")


@pytest.mark.parametrize("dtype, tol", [("float32", 2e-4), ("bfloat16", 3e-2)])
def test_sdpa_matches_torch_ref_on_cuda(dtype: str, tol: float) -> None:
    cfg = get_model_config("small").with_dtype(dtype)
    ref = LlamaForPagedLM.from_random(cfg, seed=3, backend="torch_ref", device="cuda",
                                     step_graphs="off")
    fast = LlamaForPagedLM.from_random(cfg, seed=3, backend="sdpa", device="cuda",
                                      step_graphs="off")
    gen = torch.Generator().manual_seed(0)
    block = 16
    pools = [allocate_kv_pool(cfg, 64, block, device="cuda") for _ in range(2)]
    specs = ((300, list(range(0, 19)), 0), (40, list(range(19, 40)), 290), (1, [40, 41, 42], 33))
    seqs = [SeqInput(torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist(), t, c)
            for n, t, c in specs]
    warm = [SeqInput(torch.randint(0, cfg.vocab_size, (s.num_cached_tokens,), generator=gen)
                     .tolist(), s.block_table, logits="none") for s in seqs if s.num_cached_tokens]
    for model, pool in zip((ref, fast), pools):
        model(build_batch(warm, cfg, block_size=block, num_blocks=64, device="cuda"), pool)
    batch = build_batch([dataclasses.replace(s, logits="all") for s in seqs], cfg,
                        block_size=block, num_blocks=64, device="cuda")
    out_ref, out_fast = ref(batch, pools[0]), fast(batch, pools[1])
    scale = out_ref.abs().max()
    assert (out_fast - out_ref).abs().max() <= tol * scale
