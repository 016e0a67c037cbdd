"""GPU machine only (-m gpu): an engine captures its step graphs at start, and no request then
captures one on its path -- prefills, prefix hits from hbm and host, decode batches, chunked
prefill and preemption (the CPU suite checks the enumeration itself in mode "eager":
tests/runtime/test_step_shapes.py)."""

from __future__ import annotations

import random

import pytest
import torch

from runtime import LlamaForPagedLM, SamplingParams, get_model_config
from tests.runtime.test_engine_connector import clear_hbm, make_engine, prompt

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")


def test_no_capture_on_a_request_path_after_start() -> None:
    model = LlamaForPagedLM.from_random(get_model_config("small").with_dtype("bfloat16"), seed=3,
                                        device="cuda", step_graphs="cuda")
    engine = make_engine(model, num_blocks=40, host_pages=128, max_num_batched_tokens=64,
                         max_num_seqs=6, chunk_size=32)
    graphs = model.step_graphs
    assert graphs is not None
    up = engine.startup
    assert up.num_shapes > 0 and up.num_captured == up.num_shapes == graphs.num_captures
    assert up.capture_s <= up.seconds
    rng = random.Random(4)
    shared = prompt(rng, 100)
    prompts = [shared + prompt(rng, 3 * i + 1) for i in range(6)] + [prompt(rng, 150)]
    params = [SamplingParams(max_tokens=rng.randrange(1, 12)) for _ in prompts]
    engine.generate(prompts, params)  # prefills, chunks, decode batches (and preemption)
    engine.generate(prompts[:3], params[:3])  # hbm hits
    clear_hbm(engine)
    engine.generate(prompts[3:], params[3:])  # host hits
    assert engine.scheduler.num_tokens_loaded > 0
    assert graphs.late_shapes == [] and graphs.num_captures == up.num_captured
    engine.close()
    assert engine.store is not None
    engine.store.close()


@pytest.mark.parametrize("backend", ["paged", "sdpa"])
def test_long_steps_are_warmed_at_start_and_write_nothing(backend: str) -> None:
    """A step longer than the graphs' MAX_TOKENS runs eagerly: the engine ran each of its
    kernel specialisations once at start, over a scratch block; the pool stays untouched and
    the tokens equal an engine's that did not warm up."""
    cfg = get_model_config("small").with_dtype("bfloat16")
    model = LlamaForPagedLM.from_random(cfg, seed=3, device="cuda", step_graphs="cuda",
                                        backend=backend)
    limits = {"max_num_batched_tokens": 640, "max_num_seqs": 4, "num_blocks": 96,
              "connector": False}
    engine = make_engine(model, **limits)
    up = engine.startup
    assert up.num_warm_steps > (1 if backend == "paged" else 0) and 0 < up.warm_s < up.seconds
    assert engine.pool.pool.count_nonzero() == 0
    assert engine.pool.num_free == engine.pool.num_blocks
    rng = random.Random(5)
    prompts = [prompt(rng, 600), prompt(rng, 300) + prompt(rng, 300)]
    params = SamplingParams(max_tokens=4)
    warm = [o.output_token_ids for o in engine.generate(prompts, params)]
    cold = make_engine(LlamaForPagedLM.from_random(cfg, seed=3, device="cuda",
                                                   step_graphs="cuda", backend=backend),
                       capture_graphs_at_start=False, **limits)
    assert warm == [o.output_token_ids for o in cold.generate(prompts, params)]
