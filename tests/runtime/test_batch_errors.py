"""Bad inputs to build_batch and the model raise InvalidArgument naming the value, and the KV
pool is left untouched."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvstore.errors import InvalidArgument
from runtime import (
    LlamaForPagedLM,
    ModelConfig,
    SeqInput,
    allocate_kv_pool,
    build_batch,
    get_model_config,
)

BLOCK, NUM_BLOCKS = 4, 8


@pytest.fixture(scope="module")
def model() -> LlamaForPagedLM:
    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=0)


@pytest.fixture
def pool(model: LlamaForPagedLM) -> torch.Tensor:
    return allocate_kv_pool(model.config, NUM_BLOCKS, BLOCK).normal_()


@pytest.mark.parametrize("seqs, fragment", [
    ([], "at least one sequence"),
    ([SeqInput([], [0])], "sequence 0 has no new tokens"),
    ([SeqInput([1, 512], [0])], "token id 512 is outside [0, 512)"),
    ([SeqInput([1, 2], [0]), SeqInput([-1], [1])], "sequence 1: token id -1"),
    ([SeqInput([1.0], [0])], "token id 1.0"),  # type: ignore[list-item]
    ([SeqInput([1], [0], num_cached_tokens=-1)], "num_cached_tokens must be an int >= 0"),
    ([SeqInput([1] * 5, [0])], "block table has 1 blocks, 2 needed for 5 tokens"),
    ([SeqInput([1], [0, 1], num_cached_tokens=8)], "3 needed for 9 tokens"),
    ([SeqInput([1], [0, 8])], "block id 8 is outside [0, 8)"),
    # several sequences: their tables are checked at once, the offender still named
    ([SeqInput([1], [0]), SeqInput([2], [1]), SeqInput([3], [8])],
     "sequence 2: block id 8 is outside [0, 8)"),
    ([SeqInput([1], [0]), SeqInput([2], [True])], "sequence 1: block id True"),
    ([SeqInput([1], [0]), SeqInput([2], [1.0])], "sequence 1: block id 1.0"),  # type: ignore[list-item]
    ([SeqInput([1], [0, 0])], "repeats a block"),
    ([SeqInput([1, 2], [3]), SeqInput([5], [3], num_cached_tokens=1)], "written twice"),
    # long sequences take the bulk (numpy) paths: same checks, same messages
    ([SeqInput([1] * 100 + [512], list(range(7)))], "token id 512 is outside [0, 512)"),
    ([SeqInput([1] * 100 + [True], list(range(7)))], "token id True"),

    ([SeqInput([1], [0], logits="first")], "logits must be"),  # type: ignore[arg-type]
])
def test_build_batch_rejects(model: LlamaForPagedLM, seqs: list[SeqInput], fragment: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        build_batch(seqs, model.config, block_size=BLOCK, num_blocks=NUM_BLOCKS)
    assert fragment in str(info.value) and info.value.hint


@pytest.mark.parametrize("seqs, fragment", [
    ([SeqInput([1] * 100, [*range(99), 2**70])], "block id 1180591620717411303424 is outside"),
    ([SeqInput([1] * 100, [*range(98), 5, 99])], "repeats a block"),
    ([SeqInput([1] * 70, list(range(18))), SeqInput([2] * 70, [*range(20, 24), 17, *range(30, 43)])],
     "sequence 1: slot (block 17, offset 0) is written twice"),
])
def test_long_sequences_take_the_bulk_checks(model: LlamaForPagedLM, seqs: list[SeqInput],
                                             fragment: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        build_batch(seqs, model.config, block_size=BLOCK, num_blocks=128)
    assert fragment in str(info.value)


def test_sequence_longer_than_max_positions(model: LlamaForPagedLM) -> None:
    limit = model.config.max_position_embeddings
    table = list(range(limit // BLOCK + 1))
    ok = SeqInput([1], table, num_cached_tokens=limit - 1)
    build_batch([ok], model.config, block_size=BLOCK, num_blocks=len(table))
    with pytest.raises(InvalidArgument, match=f"257 tokens, more than max_position_embeddings="
                                              f"{limit}"):
        build_batch([SeqInput([1, 2], table, num_cached_tokens=limit - 1)], model.config,
                    block_size=BLOCK, num_blocks=len(table))


def test_shared_cached_blocks_are_allowed(model: LlamaForPagedLM) -> None:
    seqs = [SeqInput([1], [0, 1], num_cached_tokens=4), SeqInput([2], [0, 2], num_cached_tokens=4)]
    batch = build_batch(seqs, model.config, block_size=BLOCK, num_blocks=NUM_BLOCKS)
    assert batch.meta.slot_blocks.tolist() == [1, 2]
    assert batch.meta.positions.tolist() == [4, 4]
    assert batch.meta.block_tables.tolist() == [[0, 1], [0, 2]]


def test_block_tables_of_different_lengths_are_padded(model: LlamaForPagedLM) -> None:
    seqs = [SeqInput([1], [5]), SeqInput([2], [3, 6], num_cached_tokens=4), SeqInput([3], [7])]
    batch = build_batch(seqs, model.config, block_size=BLOCK, num_blocks=NUM_BLOCKS)
    assert batch.meta.block_tables.tolist() == [[5, 0], [3, 6], [7, 0]]
    assert batch.meta.block_tables.dtype == torch.int64 and batch.meta.max_block_id == 7


def _pool_rejects(model: LlamaForPagedLM, pool: Any, fragment: str, num_blocks: int = NUM_BLOCKS,
                  block_size: int = BLOCK) -> None:
    batch = build_batch([SeqInput([1, 2, 3], [num_blocks - 1])], model.config,
                        block_size=block_size, num_blocks=num_blocks)
    before = pool.clone() if isinstance(pool, torch.Tensor) else None
    with pytest.raises(InvalidArgument, match=fragment):
        model(batch, pool)
    if before is not None:
        assert torch.equal(pool, before)


def test_model_rejects_wrong_pool_dtype(model: LlamaForPagedLM, pool: torch.Tensor) -> None:
    _pool_rejects(model, pool.half(), "does not fit the model")


def test_model_rejects_wrong_pool_shape(model: LlamaForPagedLM) -> None:
    cfg: ModelConfig = model.config
    bad = torch.zeros(NUM_BLOCKS, cfg.num_layers, 2, BLOCK, cfg.num_kv_heads + 1, cfg.head_dim)
    _pool_rejects(model, bad, "does not fit the model")
    _pool_rejects(model, "not a tensor", "does not fit the model")


def test_model_rejects_block_size_mismatch(model: LlamaForPagedLM, pool: torch.Tensor) -> None:
    _pool_rejects(model, pool, "does not fit the model", block_size=8)


def test_model_rejects_block_beyond_pool(model: LlamaForPagedLM, pool: torch.Tensor) -> None:
    _pool_rejects(model, pool, "batch uses block 15, but kv_pool has 8 blocks", num_blocks=16)


def test_forward_writes_only_its_slots(model: LlamaForPagedLM, pool: torch.Tensor) -> None:
    before = pool.clone()
    batch = build_batch([SeqInput([5, 6], [2, 6], num_cached_tokens=3)], model.config,
                        block_size=BLOCK, num_blocks=NUM_BLOCKS)
    model(batch, pool)
    changed = (pool != before).flatten(2).any(-1)  # [num_blocks, num_layers]: any change
    assert changed.any(-1).nonzero().flatten().tolist() == [2, 6]
    assert torch.equal(pool[2, :, :, :3], before[2, :, :, :3])  # cached tokens untouched
    assert torch.equal(pool[6, :, :, 1:], before[6, :, :, 1:])
