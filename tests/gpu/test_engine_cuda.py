"""GPU machine only (-m gpu): the engine on CUDA with the fast backend gives the same greedy
tokens with and without prefix-cache hits, and with preemption in a small pool."""

from __future__ import annotations

import pytest
import torch

from runtime import Engine, SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    system = torch.randint(3, 30000, (100,), generator=gen).tolist()
    return [system + torch.randint(3, 30000, (n,), generator=gen).tolist() for n in (7, 40, 73, 5)]


@pytest.mark.parametrize("dtype_cfg", ["small"])
def test_cached_and_uncached_agree_on_cuda(dtype_cfg: str) -> None:
    params = SamplingParams(max_tokens=12)
    ref = Engine.from_config(dtype_cfg, seed=1, num_blocks=256, device="cuda", backend="sdpa",
                             enable_prefix_caching=False)
    want = [o.output_token_ids for o in ref.generate(_prompts(), params)]
    hot = Engine.from_config(dtype_cfg, seed=1, num_blocks=256, device="cuda", backend="sdpa")
    hot.generate(_prompts()[:1], params)  # warm the cache with the shared prefix
    got = hot.generate(_prompts(), params)
    assert [o.output_token_ids for o in got] == want
    assert sum(o.metrics.num_tokens_reused.get("hbm", 0) for o in got) > 0
    small = Engine.from_config(dtype_cfg, seed=1, num_blocks=24, device="cuda", backend="sdpa")
    out = small.generate(_prompts(), params)
    assert [o.output_token_ids for o in out] == want
