"""GPU machine only (-m gpu): the paged Triton kernels and the CUDA step graphs.

The kernels match the reference backend in float32 and bfloat16 with long cached prefixes and
several splits; graph replay gives bitwise the logits of the same padded steps run eagerly, and
the same greedy tokens with hits from hbm, host, disk and Redis and under preemption; a float32
model with graphs keeps the reference's logits (1e-4)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from kvstore.metrics import Metrics
from runtime import LlamaForPagedLM, SeqInput, allocate_kv_pool, build_batch, get_model_config
from runtime.attention import make_attention_backend
from runtime.attention.paged import attention, step_from_meta
from tests.runtime.test_engine_connector import (
    GREEDY,
    _engine_over,
    _only_below_host,
    clear_hbm,
    make_disk_engine,
    make_engine,
    prompt,
    tokens,
)

pytestmark = pytest.mark.gpu
BS = 16


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")


def _random_batch(cfg, specs, num_blocks, gen):  # type: ignore[no-untyped-def]
    seqs, start = [], 0
    for new, cached in specs:
        used = -(-(new + cached) // BS)
        seqs.append(SeqInput(torch.randint(0, cfg.vocab_size, (new,), generator=gen).tolist(),
                             list(range(start, start + used)), cached, "all"))
        start += used
    assert start <= num_blocks
    return build_batch(seqs, cfg, block_size=BS, num_blocks=num_blocks, device="cuda")


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("splits", [1, 8])
def test_paged_attention_matches_reference(dtype: str, tol: float, splits: int) -> None:
    cfg = get_model_config("small").with_dtype(dtype)
    gen = torch.Generator().manual_seed(0)
    nb = 512
    pool = torch.randn((nb, cfg.num_layers, 2, BS, cfg.num_kv_heads, cfg.head_dim),
                       generator=gen).to("cuda", cfg.torch_dtype)
    # a long prefix hit's suffix, a decode token on 3000 cached, a fresh prefill, a short chunk
    batch = _random_batch(cfg, [(16, 4000), (1, 3000), (70, 0), (5, 37)], nb, gen)
    t = batch.meta.num_tokens
    q = torch.randn((t, cfg.num_heads, cfg.head_dim), generator=gen).to("cuda", cfg.torch_dtype)
    k = torch.randn((t, cfg.num_kv_heads, cfg.head_dim), generator=gen).to("cuda", cfg.torch_dtype)
    v = torch.randn_like(k)
    ref, paged = make_attention_backend("torch_ref"), make_attention_backend("paged")
    pool_ref = pool.clone()
    ref.write_kv(pool_ref, 1, k, v, batch.meta)
    paged.write_kv(pool, 1, k, v, batch.meta)
    assert torch.equal(pool, pool_ref)
    step = dataclasses.replace(step_from_meta(batch.meta, cfg.num_heads // cfg.num_kv_heads,
                                              cfg.num_kv_heads), num_splits=splits)
    out = attention(q, pool, 1, step, cfg.head_dim ** -0.5)
    want = ref.attend(q, k, v, pool_ref, 1, batch.meta, cfg.head_dim ** -0.5)
    assert (out.float() - want.float()).abs().max().item() <= tol * want.float().abs().max().item()


def _models(name: str, dtype: str) -> dict[str, LlamaForPagedLM]:
    cfg = get_model_config(name).with_dtype(dtype)
    return {mode: LlamaForPagedLM.from_random(cfg, seed=3, device="cuda", step_graphs=mode)
            for mode in ("cuda", "eager", "off")}


def test_graph_replay_is_bitwise_the_eager_step_and_close_to_sdpa() -> None:
    models = _models("small", "bfloat16")
    cfg = models["cuda"].config
    gen = torch.Generator().manual_seed(1)
    nb = 600
    pools = {m: allocate_kv_pool(cfg, nb, BS, device="cuda") for m in models}
    warm = _random_batch(cfg, [(500, 0), (300, 0), (40, 0)], nb, gen)
    steps = [
        _random_batch(cfg, [(16, 2000)], nb, gen),  # a prefix hit's suffix
        _random_batch(cfg, [(1, 500)], nb, gen),  # decode, batch 1
        _random_batch(cfg, [(1, 100), (1, 300), (1, 40)], nb, gen),  # decode, batch 3
        _random_batch(cfg, [(16, 2000)], nb, gen),  # the first shape again: a replay
    ]
    for mode, model in models.items():
        model(warm, pools[mode])
    for batch in steps:
        out = {mode: model(batch, pools[mode]) for mode, model in models.items()}
        assert torch.equal(out["cuda"], out["eager"])
        assert torch.equal(pools["cuda"], pools["eager"])
        scale = out["off"].abs().max().item()
        assert (out["cuda"] - out["off"]).abs().max().item() <= 3e-2 * scale
    graphs = models["cuda"].step_graphs
    assert graphs is not None and graphs.num_captures == 3  # the repeated shape was replayed


def test_float32_graphs_keep_the_reference_logits() -> None:
    cfg = get_model_config("small").with_dtype("float32")
    fast = LlamaForPagedLM.from_random(cfg, seed=3, device="cuda", step_graphs="cuda")
    ref = LlamaForPagedLM.from_random(cfg, seed=3, device="cuda", step_graphs="off",
                                      backend="torch_ref")
    gen = torch.Generator().manual_seed(2)
    nb = 300
    pools = [allocate_kv_pool(cfg, nb, BS, device="cuda") for _ in range(2)]
    for batch in (_random_batch(cfg, [(200, 0), (33, 0)], nb, gen),
                  _random_batch(cfg, [(16, 1500), (1, 700)], nb, gen)):
        want, got = ref(batch, pools[1]), fast(batch, pools[0])
        assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


def _tier_tokens(model: LlamaForPagedLM, tmp_path) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Greedy tokens of one prompt computed, then hit in hbm, host and disk; then six prompts
    sharing a host prefix through a pool small enough to preempt."""
    out: list[list[int]] = []
    engine = make_disk_engine(model, tmp_path)
    store = engine.store
    assert store is not None
    host = store.tier("host")
    p = prompt(random.Random(9), 53)
    out += tokens(engine.generate([p], GREEDY))  # computed
    out += tokens(engine.generate([p], GREEDY))  # hbm
    clear_hbm(engine)
    out += tokens(engine.generate([p], GREEDY))  # host
    clear_hbm(engine)
    store.evict(host.capacity_pages, tier="host")
    (o,) = engine.generate([p], GREEDY)  # disk
    assert o.metrics.num_tokens_reused["disk"] == 48
    out.append(o.output_token_ids)
    engine.close()
    store.close()
    rng = random.Random(10)
    shared = prompt(rng, 32)
    prompts = [shared + prompt(rng, 8 + 3 * i) for i in range(6)]
    engine = make_engine(model, num_blocks=10, max_num_batched_tokens=48, chunk_size=16)
    engine.generate([shared + [5]], GREEDY)
    clear_hbm(engine)
    out += tokens(engine.generate(prompts, GREEDY))
    assert engine.scheduler.num_preemptions > 0
    engine.close()
    assert engine.store is not None
    engine.store.close()
    return out


def _redis_tokens(model: LlamaForPagedLM, server) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Greedy tokens of one prompt computed, then hit in Redis (through host), on an emptied
    server."""
    from kvstore.tiers.redis import RedisTier

    server.client().flushall()
    redis = RedisTier.build("redis", model.config.kv_layout(BS), 64, Metrics(), url=server.url)
    engine, store, host = _engine_over(model, redis)
    p = prompt(random.Random(9), 53)
    out = tokens(engine.generate([p], GREEDY))  # computed
    _only_below_host(engine, store, host, redis, engine.namespace.chain(p).keys[:3])
    (o,) = engine.generate([p], GREEDY)  # Redis
    assert o.metrics.num_tokens_reused["redis"] == 48
    out.append(o.output_token_ids)
    engine.close()
    store.close()
    return out


def test_greedy_tokens_identical_with_graphs_on_and_off(tmp_path, redis_server) -> None:  # type: ignore[no-untyped-def]
    cfg = get_model_config("tiny")
    on = LlamaForPagedLM.from_random(cfg, seed=7, device="cuda", step_graphs="cuda")
    off = LlamaForPagedLM.from_random(cfg, seed=7, device="cuda", step_graphs="eager")
    got = _tier_tokens(on, tmp_path / "on") + _redis_tokens(on, redis_server)
    assert on.step_graphs is not None and on.step_graphs.num_captures > 0
    assert got == _tier_tokens(off, tmp_path / "off") + _redis_tokens(off, redis_server)
