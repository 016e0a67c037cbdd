"""The paged Triton kernels and the padded step path, on a CPU through Triton's interpreter: the
K/V write and attention equal the reference backend (several sequences, cached prefixes, decode,
grouped-query heads, one split and several), padding tokens write nothing, and a model running
its small steps through them (``step_graphs="eager"``, the CPU path of the CUDA graphs) gives
the reference's logits and greedy tokens, with and without prefix-cache hits."""

from __future__ import annotations

import dataclasses
from types import ModuleType

import pytest
import torch

from kvstore.errors import InvalidArgument
from runtime import Engine, LlamaForPagedLM, SamplingParams, SeqInput, build_batch, get_model_config
from runtime.attention import make_attention_backend

BS = 4
NB = 64
CFG = get_model_config("tiny").with_dtype("float32")


@pytest.fixture
def paged() -> ModuleType:
    """``runtime.attention.paged``; on a CPU its kernels run under Triton's interpreter, which
    tests/conftest.py selects for the session."""
    import runtime.attention.paged as module
    import runtime.attention.paged_kernels as kernels

    if not torch.cuda.is_available():
        assert type(kernels._attention_kernel).__name__ == "InterpretedFunction"
    return module


BATCHES = [
    [SeqInput(list(range(1, 20)), list(range(0, 5)), 0)],  # prefill, a partial last block
    [SeqInput(list(range(1, 4)), list(range(5, 15)), 30)],  # a prefix hit's suffix
    [SeqInput([5], list(range(15, 25)), 37),  # decode
     SeqInput(list(range(1, 9)), list(range(25, 35)), 3),  # a chunk after 3 cached
     SeqInput([7], list(range(35, 60)), 90)],  # decode on a long prefix
]


@pytest.mark.parametrize("seqs", BATCHES)
@pytest.mark.parametrize("splits", [1, 4])
def test_kernels_match_the_reference(paged: ModuleType, seqs: list[SeqInput], splits: int) -> None:
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn((NB, CFG.num_layers, 2, BS, CFG.num_kv_heads, CFG.head_dim), generator=gen)
    batch = build_batch(seqs, CFG, block_size=BS, num_blocks=NB)
    t = batch.meta.num_tokens
    q = torch.randn((t, CFG.num_heads, CFG.head_dim), generator=gen)
    k = torch.randn((t, CFG.num_kv_heads, CFG.head_dim), generator=gen)
    v = torch.randn((t, CFG.num_kv_heads, CFG.head_dim), generator=gen)
    ref, ours = make_attention_backend("torch_ref"), paged.PagedBackend()
    pool_ref = pool.clone()
    ref.write_kv(pool_ref, 1, k, v, batch.meta)
    ours.write_kv(pool, 1, k, v, batch.meta)
    assert torch.equal(pool, pool_ref)
    step = dataclasses.replace(
        paged.step_from_meta(batch.meta, CFG.num_heads // CFG.num_kv_heads, CFG.num_kv_heads),
        num_splits=splits)
    got = paged.attention(q, pool, 1, step, 0.25)
    want = ref.attend(q, k, v, pool_ref, 1, batch.meta, 0.25)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_padding_tokens_write_nothing(paged: ModuleType) -> None:
    pool = torch.zeros((NB, CFG.num_layers, 2, BS, CFG.num_kv_heads, CFG.head_dim))
    k = torch.ones((3, CFG.num_kv_heads, CFG.head_dim))
    blocks, offsets = torch.tensor([2, -1, -1]), torch.tensor([1, 0, 3])
    paged.write_kv(pool, 0, k, k * 2, blocks, offsets)
    assert pool[2, 0, 0, 1].eq(1).all() and pool[2, 0, 1, 1].eq(2).all()
    assert pool.count_nonzero() == 2 * CFG.num_kv_heads * CFG.head_dim


def test_padded_steps_give_the_reference_logits(paged: ModuleType) -> None:
    ref = LlamaForPagedLM.from_random(CFG, 3, backend="torch_ref", step_graphs="off")
    ours = LlamaForPagedLM.from_random(CFG, 3, step_graphs="eager")
    assert ours.step_graphs is not None and ours.step_graphs.mode == "eager"
    pools = [torch.zeros((NB, *CFG.kv_layout(BS).page_shape)) for _ in range(2)]
    prompt = list(range(3, 40))
    for seqs in ([SeqInput(prompt, list(range(10)), 0)],
                 [SeqInput([9], list(range(10)), 37),
                  SeqInput(list(range(5, 30)), list(range(20, 30)), 0, "all")],
                 [SeqInput([11], list(range(10)), 38), SeqInput([3, 4, 5], list(range(20, 30)), 25)]):
        batch = build_batch(seqs, CFG, block_size=BS, num_blocks=NB)
        want, got = ref(batch, pools[0]), ours(batch, pools[1])
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
        assert torch.allclose(pools[0], pools[1], atol=1e-5)


def test_greedy_tokens_with_padded_steps_and_hits(paged: ModuleType) -> None:
    prompts = [list(range(3, 60)), list(range(3, 50)) + [7, 8], [9] * 33]
    params = SamplingParams(max_tokens=6)
    ref = Engine.from_config("tiny", seed=2, num_blocks=64, step_graphs="off", backend="torch_ref",
                             enable_prefix_caching=False)
    want = [o.output_token_ids for o in ref.generate(prompts, params)]
    hot = Engine.from_config("tiny", seed=2, num_blocks=64, step_graphs="eager")
    hot.generate(prompts[:1], params)
    got = hot.generate(prompts, params)  # the first two share a 47-token prefix with it
    assert [o.output_token_ids for o in got] == want
    assert sum(o.metrics.num_tokens_reused.get("hbm", 0) for o in got) >= 80


def test_step_graphs_setting_is_checked(paged: ModuleType) -> None:
    with pytest.raises(InvalidArgument, match="step_graphs must be one of"):
        LlamaForPagedLM(CFG, step_graphs="fast")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="needs a CUDA device"):
        LlamaForPagedLM(CFG, step_graphs="cuda")
    assert LlamaForPagedLM(CFG).step_graphs is None  # "auto" on a CPU: every step eager
