"""Logits of LlamaForPagedLM over the paged pool match transformers' LlamaForCausalLM (float32,
CPU, rtol 1e-4) for prefill, greedy decode, prefix-cache hits, chunked prefill and mixed
batches, with every attention backend. Weights go through save_pretrained and our loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from runtime import (
    LlamaForPagedLM,
    SeqInput,
    allocate_kv_pool,
    available_backends,
    build_batch,
    get_model_config,
)

from .conftest import assert_logits_close, hf_logits

BLOCK = 4
NUM_BLOCKS = 64


def _prompt(n: int, seed: int, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=available_backends())
def model(request: pytest.FixtureRequest, tiny_ckpt: tuple[Path, Any]) -> LlamaForPagedLM:
    return LlamaForPagedLM.from_checkpoint(tiny_ckpt[0], backend=request.param)


def _run(model: LlamaForPagedLM, pool: torch.Tensor, seqs: list[SeqInput]) -> torch.Tensor:
    batch = build_batch(seqs, model.config, block_size=BLOCK, num_blocks=pool.shape[0])
    return model(batch, pool)


def test_loader_reads_hf_config(tiny_ckpt: tuple[Path, Any]) -> None:
    model = LlamaForPagedLM.from_checkpoint(tiny_ckpt[0])
    assert model.config == get_model_config("tiny")
    assert (tiny_ckpt[0] / "model.safetensors.index.json").exists()


def test_prefill_all_positions(model: LlamaForPagedLM, tiny_ckpt: tuple[Path, Any]) -> None:
    tokens = _prompt(37, seed=0)
    pool = allocate_kv_pool(model.config, NUM_BLOCKS, BLOCK)
    table = list(range(40, 50))  # 10 blocks cover 37 tokens
    ours = _run(model, pool, [SeqInput(tokens, table, logits="all")])
    assert_logits_close(ours, hf_logits(tiny_ckpt[1], tokens))


def test_greedy_decode_20_steps(model: LlamaForPagedLM, tiny_ckpt: tuple[Path, Any]) -> None:
    prompt = _prompt(13, seed=1)
    pool = allocate_kv_pool(model.config, NUM_BLOCKS, BLOCK)
    table = [9, 3, 27, 1, 55, 8, 60, 12, 2, 33]  # scattered, 40 tokens of room
    logits = [_run(model, pool, [SeqInput(prompt, table)])[0]]
    seq = prompt + [int(logits[-1].argmax())]
    for _ in range(20):
        step = _run(model, pool, [SeqInput([seq[-1]], table, num_cached_tokens=len(seq) - 1)])
        logits.append(step[0])
        seq.append(int(step[0].argmax()))
    ref = hf_logits(tiny_ckpt[1], seq[:-1])[len(prompt) - 1:]
    assert_logits_close(torch.stack(logits), ref)
    assert ref.argmax(-1).tolist() == seq[len(prompt):]


@pytest.mark.parametrize("k", [8, 20])
def test_prefix_cache_hit(model: LlamaForPagedLM, tiny_ckpt: tuple[Path, Any], k: int) -> None:
    """Sequence A's first k tokens fill blocks; sequence B shares them (same pool) and, after a
    copy of those pages to other blocks of a fresh pool (a load from the store), computes only
    its tail. Both match HF on B's full sequence."""
    shared = _prompt(k, seed=2)
    a_tail, b_tail = _prompt(6, seed=3), _prompt(11, seed=4)
    pool = allocate_kv_pool(model.config, NUM_BLOCKS, BLOCK)
    prefix_blocks = list(range(10, 10 + k // BLOCK))
    _run(model, pool, [SeqInput(shared + a_tail, prefix_blocks + [30, 31], logits="none")])
    ref = hf_logits(tiny_ckpt[1], shared + b_tail)[k:]
    b_table = prefix_blocks + [40, 41, 42]
    before = pool[prefix_blocks].clone()
    hit = _run(model, pool, [SeqInput(b_tail, b_table, num_cached_tokens=k, logits="all")])
    assert_logits_close(hit, ref)
    assert torch.equal(pool[prefix_blocks], before)  # cached pages are read, never rewritten
    fresh = allocate_kv_pool(model.config, NUM_BLOCKS, BLOCK)
    loaded_blocks = list(range(50, 50 + k // BLOCK))
    fresh[loaded_blocks] = pool[prefix_blocks]
    loaded = _run(model, fresh, [SeqInput(b_tail, loaded_blocks + [1, 2, 3], num_cached_tokens=k,
                                          logits="all")])
    assert_logits_close(loaded, ref)


def test_chunked_prefill(model: LlamaForPagedLM, tiny_ckpt: tuple[Path, Any]) -> None:
    tokens = _prompt(61, seed=5)
    pool = allocate_kv_pool(model.config, NUM_BLOCKS, BLOCK)
    table = list(range(NUM_BLOCKS - 1, NUM_BLOCKS - 17, -1))  # 16 blocks, descending ids
    outs, done = [], 0
    for size in (7, 13, 1, 30, 10):
        chunk = tokens[done:done + size]
        outs.append(_run(model, pool, [SeqInput(chunk, table, num_cached_tokens=done,
                                                logits="all")]))
        done += size
    assert done == len(tokens)
    assert_logits_close(torch.cat(outs), hf_logits(tiny_ckpt[1], tokens))


def test_mixed_batch(model: LlamaForPagedLM, tiny_ckpt: tuple[Path, Any]) -> None:
    """One batch: a fresh prefill, a decode token and a prefill chunk with a cached prefix."""
    hf = tiny_ckpt[1]
    a, b, c = _prompt(10, seed=6), _prompt(18, seed=7), _prompt(13, seed=8)
    tables = [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9, 10, 11]]
    pool = allocate_kv_pool(model.config, NUM_BLOCKS, BLOCK)
    _run(model, pool, [SeqInput(b[:17], tables[1], logits="none"),
                       SeqInput(c[:8], tables[2], logits="none")])
    out = _run(model, pool, [
        SeqInput(a, tables[0], logits="all"),
        SeqInput(b[17:], tables[1], num_cached_tokens=17),
        SeqInput(c[8:], tables[2], num_cached_tokens=8, logits="all"),
    ])
    assert out.shape == (10 + 1 + 5, 512)
    assert_logits_close(out[:10], hf_logits(hf, a))
    assert_logits_close(out[10:11], hf_logits(hf, b)[17:])
    assert_logits_close(out[11:], hf_logits(hf, c)[8:])


def test_tied_embeddings_default_rope(tied_ckpt: tuple[Path, Any]) -> None:
    model = LlamaForPagedLM.from_checkpoint(tied_ckpt[0])
    assert model.config.tie_word_embeddings and model.config.rope_scaling is None
    assert not (tied_ckpt[0] / "model.safetensors.index.json").exists()
    tokens = _prompt(30, seed=9)
    pool = allocate_kv_pool(model.config, 16, BLOCK)
    out = _run(model, pool, [SeqInput(tokens[:17], list(range(8)), logits="all")])
    out2 = _run(model, pool, [SeqInput(tokens[17:], list(range(8)), num_cached_tokens=17,
                                       logits="all")])
    assert_logits_close(torch.cat([out, out2]), hf_logits(tied_ckpt[1], tokens))
