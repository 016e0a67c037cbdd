"""Engine: greedy outputs are identical with and without prefix-cache hits (full, partial,
concurrent, after preemption, chunked prefill), per-request metrics, sampling and stopping, and
the pool inside a TieredStore([hbm, host])."""

from __future__ import annotations

import random

import pytest

from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.store import TieredStore
from kvstore.tiers.hbm import HBMTier
from kvstore.tiers.host import HostTier
from runtime import LlamaForPagedLM, get_model_config
from runtime.engine import Engine
from runtime.request import RequestOutput
from runtime.sampling import SamplingParams

BS = 16
GREEDY = SamplingParams(max_tokens=8)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaForPagedLM:
    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=7)


def make_engine(model: LlamaForPagedLM, num_blocks: int = 128, *, lower: int = 0,
                **kw: object) -> Engine:
    layout = model.config.kv_layout(BS)
    m = Metrics()
    pool = HBMTier.build("hbm", layout, num_blocks, m, device="cpu")
    tiers = [pool, HostTier.build("host", layout, lower, m)] if lower else [pool]
    store = TieredStore(layout, tiers, write_policy="write_back")  # owns the pool's eviction
    engine = Engine(model, pool, Namespace("test/tiny/7", layout), **kw)  # type: ignore[arg-type]
    engine.store = store
    return engine


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 512) for _ in range(n)]


def reference(model: LlamaForPagedLM, prompts: list[list[int]],
              params: SamplingParams = GREEDY) -> list[list[int]]:
    """Each prompt alone, prefix caching off, a big pool."""
    out = []
    for p in prompts:
        engine = make_engine(model, 64, enable_prefix_caching=False)
        out.append(engine.generate([p], params)[0].output_token_ids)
    return out


def assert_clean(engine: Engine) -> None:
    """Nothing is held once all requests finished; the pool's invariants hold."""
    pool = engine.pool
    pool.check_integrity()
    assert not engine.has_unfinished()
    assert pool.num_free + pool.num_evictable == pool.num_blocks
    assert all(pool.refcount(b) == 0 for b in range(pool.num_blocks))


def tokens(outs: list[RequestOutput]) -> list[list[int]]:
    return [o.output_token_ids for o in outs]


def test_full_hit_same_prompt_twice(model: LlamaForPagedLM) -> None:
    p = prompt(random.Random(1), 53)  # 3 full blocks + 5
    engine = make_engine(model)
    (first,) = engine.generate([p], GREEDY)
    (second,) = engine.generate([p], GREEDY)
    assert tokens([first, second]) == reference(model, [p]) * 2
    assert first.metrics.num_tokens_reused == {"hbm": 0}
    assert first.metrics.num_tokens_computed == 53
    assert second.metrics.num_tokens_reused == {"hbm": 3 * BS}
    assert second.metrics.num_tokens_computed == 53 - 3 * BS
    for o in (first, second):
        assert o.metrics.ttft_s is not None and o.metrics.ttft_s > 0
        assert o.finish_reason == "length" and len(o.output_token_ids) == GREEDY.max_tokens
    assert_clean(engine)


def test_block_aligned_prompt_recomputes_its_last_token(model: LlamaForPagedLM) -> None:
    p = prompt(random.Random(2), 4 * BS)
    engine = make_engine(model)
    first, second = engine.generate([p], GREEDY)[0], engine.generate([p], GREEDY)[0]
    assert first.output_token_ids == second.output_token_ids == reference(model, [p])[0]
    assert second.metrics.num_tokens_reused == {"hbm": 3 * BS}  # the last block is recomputed
    assert second.metrics.num_tokens_computed == BS


def test_partial_hit_shared_prefix(model: LlamaForPagedLM) -> None:
    rng = random.Random(3)
    prefix = prompt(rng, 40)
    a, b = prefix + prompt(rng, 9), prefix + prompt(rng, 30)
    engine = make_engine(model)
    outs = engine.generate([a], GREEDY) + engine.generate([b], GREEDY)
    assert tokens(outs) == reference(model, [a, b])
    assert outs[1].metrics.num_tokens_reused == {"hbm": 2 * BS}  # 40 shared -> 2 full blocks
    assert outs[1].metrics.num_tokens_computed == len(b) - 2 * BS
    assert_clean(engine)


def test_generated_blocks_are_committed_and_hit(model: LlamaForPagedLM) -> None:
    """Keys chain over prompt + output: a follow-up prompt that contains the reply hits it."""
    p = prompt(random.Random(4), 20)
    engine = make_engine(model)
    (first,) = engine.generate([p], SamplingParams(max_tokens=30))
    follow = p + first.output_token_ids + [5, 6, 7]  # 53 tokens; 49 had K/V computed
    (second,) = engine.generate([follow], GREEDY)
    assert second.metrics.num_tokens_reused == {"hbm": 3 * BS}
    assert second.output_token_ids == reference(model, [follow])[0]


def test_many_concurrent_requests_sharing_a_system_prompt(model: LlamaForPagedLM) -> None:
    rng = random.Random(5)
    system = prompt(rng, 50)
    prompts = [system + prompt(rng, rng.randrange(1, 25)) for _ in range(8)]
    # A small step budget staggers admissions, so later requests hit what earlier ones committed.
    engine = make_engine(model, max_num_batched_tokens=40)
    outs = engine.generate(prompts, GREEDY)
    assert tokens(outs) == reference(model, prompts)
    assert sum(o.metrics.num_tokens_reused["hbm"] for o in outs) >= 3 * BS
    for o in outs:
        assert o.metrics.num_tokens_computed + o.metrics.num_tokens_reused["hbm"] == len(
            o.prompt_token_ids)
    assert_clean(engine)


@pytest.mark.parametrize("caching", [True, False])
def test_preemption_and_recompute_in_a_small_pool(model: LlamaForPagedLM, caching: bool) -> None:
    rng = random.Random(6)
    prompts = [prompt(rng, 30) for _ in range(6)]
    params = SamplingParams(max_tokens=20)  # 49 tokens of K/V each: 4 blocks; 6 * 4 > 12
    engine = make_engine(model, 12, enable_prefix_caching=caching)
    outs = engine.generate(prompts, params)
    assert tokens(outs) == reference(model, prompts, params)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert engine.scheduler.num_preemptions == sum(o.metrics.num_preemptions for o in outs)
    assert all(len(o.output_token_ids) == 20 for o in outs)
    assert_clean(engine)


def test_chunked_prefill_of_long_prompts(model: LlamaForPagedLM) -> None:
    rng = random.Random(7)
    prompts = [prompt(rng, n) for n in (100, 67, 3)]
    engine = make_engine(model, chunk_size=7, max_num_batched_tokens=20)
    outs = engine.generate(prompts, GREEDY)
    assert tokens(outs) == reference(model, prompts)
    assert [o.metrics.num_tokens_computed for o in outs] == [100, 67, 3]
    again = engine.generate(prompts[:1], GREEDY)[0]  # a hit on blocks committed chunk by chunk
    assert again.output_token_ids == outs[0].output_token_ids
    assert again.metrics.num_tokens_reused == {"hbm": 6 * BS}
    assert_clean(engine)


def test_step_api_interleaves_decode_and_prefill(model: LlamaForPagedLM) -> None:
    rng = random.Random(8)
    a, b = prompt(rng, 10), prompt(rng, 60)
    engine = make_engine(model, chunk_size=16)
    ra = engine.add_request(a, GREEDY, request_id="a")
    engine.step()  # a prefilled, first token out
    rb = engine.add_request(b, GREEDY, request_id="b")
    outs: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for o in engine.step():
            outs[o.request_id] = o
    assert [outs[ra].output_token_ids, outs[rb].output_token_ids] == reference(model, [a, b])
    assert outs[ra].metrics.ttft_s < outs[rb].metrics.ttft_s  # type: ignore[operator]


def test_seeded_sampling_is_reproducible(model: LlamaForPagedLM) -> None:
    rng = random.Random(9)
    p, other = prompt(rng, 25), prompt(rng, 40)
    sampled = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234)
    alone = make_engine(model).generate([p], sampled)[0].output_token_ids
    batched = make_engine(model).generate(
        [other, p], [SamplingParams(max_tokens=5, temperature=0.7, seed=1), sampled])
    assert batched[1].output_token_ids == alone
    reseeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=99)
    assert make_engine(model).generate([p], reseeded)[0].output_token_ids != alone


def test_stop_tokens_and_max_tokens(model: LlamaForPagedLM) -> None:
    p = prompt(random.Random(10), 20)
    engine = make_engine(model)
    full = engine.generate([p], SamplingParams(max_tokens=10))[0].output_token_ids
    stop = full[3]
    cut = full.index(stop) + 1
    (out,) = engine.generate([p], SamplingParams(max_tokens=10, stop_token_ids=[stop]))
    assert out.finish_reason == "stop" and out.output_token_ids == full[:cut]
    (one,) = engine.generate([p], SamplingParams(max_tokens=1))
    assert one.finish_reason == "length" and one.output_token_ids == full[:1]
    assert_clean(engine)


def test_pool_in_a_tiered_store_writes_evicted_blocks_back_to_host(
    model: LlamaForPagedLM,
) -> None:
    rng = random.Random(11)
    prompts = [prompt(rng, 40) for _ in range(8)]
    engine = make_engine(model, 8, lower=64)
    outs = [engine.generate([p], GREEDY)[0] for p in prompts]  # one at a time: 3 blocks each
    assert tokens(outs) == reference(model, prompts)
    store = engine.store
    assert store is not None
    host = store.tiers[1]
    assert host.used_pages > 0  # blocks evicted from hbm were written back
    assert store.stats().copies.get("write_back->host", 0) == host.used_pages
    store.check_integrity()
    assert_clean(engine)


def test_from_config_builds_pool_and_store() -> None:
    engine = Engine.from_config("tiny", seed=0, num_blocks=32, block_size=16)
    assert engine.store is not None and engine.store.tiers[0] is engine.pool
    assert engine.pool.owner is not None
    (out,) = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=3))
    assert len(out.output_token_ids) == 3
