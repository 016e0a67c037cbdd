"""The paged backend: Triton kernels (``runtime.attention.paged_kernels``) that write and attend
over the KV pool in place, driven by device-side step metadata (:class:`PagedStep`).

A :class:`PagedStep` holds everything the kernels read at run time as device tensors, and the
launch shape (``block_q``, ``num_splits``, the padded token count) as Python ints. The step
graphs (``runtime.step_graphs``) keep one in static buffers and refill it per step; the backend
also takes a plain :class:`~runtime.batch.BatchMeta` (it derives the step once per batch), so
``make_attention_backend("paged")`` works anywhere Triton runs: a GPU, or Triton's interpreter
(``TRITON_INTERPRET=1``) on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from runtime.attention.base import AttentionBackend
from runtime.attention.paged_kernels import (
    LOG2E,
    _attention_kernel,
    _combine_kernel,
    _write_kv_kernel,
)
from runtime.batch import BatchMeta

#: Keys per tile of the attention loop.
BLOCK_N = 64
#: Most splits of one sequence's key range.
MAX_SPLITS = 64


@dataclass(frozen=True, slots=True)
class PagedStep:
    """Device metadata of one step for the paged kernels (``S`` sequences, ``T`` token rows,
    padding included).

    ``slot_blocks``/``slot_offsets`` [T] int64: each token's page slot (block < 0: padding, not
    written); ``block_tables`` [S, W] int32; ``seq_lens`` [S] int32 (cached + new; 0 for a
    padding sequence); ``query_start_loc`` [S + 1] int32 (padding sequences are empty).
    ``block_q`` tokens per attention program; ``num_splits`` slices of each key range.
    """

    block_size: int
    slot_blocks: torch.Tensor
    slot_offsets: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    block_q: int
    num_splits: int

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def block_q_for(max_query_len: int, groups: int) -> int:
    """Tokens per attention program: rows are ``tokens x groups`` query heads, at least 16 (the
    smallest matrix tile); 16 rows for decode-sized queries, 64 for longer ones."""
    rows = 16 if max_query_len * groups <= 16 else 64
    return max(1, max(rows, _pow2(groups)) // groups)


@lru_cache(maxsize=8)
def _multiprocessors(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 2  # Triton's interpreter: few programs run fastest


def num_splits_for(num_q_blocks: int, num_kv_heads: int, max_seq_len: int,
                   device: torch.device) -> int:
    """Key-range splits so that about two programs run per multiprocessor: a power of two (few
    distinct graph shapes), at most one per key tile of the longest sequence."""
    want = -(-2 * _multiprocessors(device) // max(1, num_q_blocks * num_kv_heads))
    tiles = -(-max_seq_len // BLOCK_N)
    return max(1, min(_pow2(want), _pow2(tiles), MAX_SPLITS))


def step_from_meta(meta: BatchMeta, groups: int, num_kv_heads: int) -> PagedStep:
    """The paged step of a built batch (no padding)."""
    device = meta.positions.device
    block_q = block_q_for(max(meta.num_new_tokens), groups)
    q_blocks = sum(-(-n // block_q) for n in meta.num_new_tokens)
    host = torch.tensor([*meta.seq_lens, *meta.query_start_loc], dtype=torch.int32)
    host = host.to(device)
    return PagedStep(
        block_size=meta.block_size,
        slot_blocks=meta.slot_blocks,
        slot_offsets=meta.slot_offsets,
        block_tables=meta.block_tables.to(torch.int32),
        seq_lens=host[: meta.num_seqs],
        query_start_loc=host[meta.num_seqs:],
        block_q=block_q,
        num_splits=num_splits_for(q_blocks, num_kv_heads, max(meta.seq_lens), device),
    )


def write_kv(kv_pool: torch.Tensor, layer: int, k: torch.Tensor, v: torch.Tensor,
             slot_blocks: torch.Tensor, slot_offsets: torch.Tensor) -> None:
    """Write rows of ``k``/``v`` ``[T, num_kv_heads, head_dim]`` to their slots of ``layer``
    (``slot_blocks`` [T] < 0: not written)."""
    k_cache, v_cache = kv_pool[:, layer, 0], kv_pool[:, layer, 1]  # [NB, BS, KVH, D]
    row = k.shape[1] * k.shape[2]
    k2, v2 = k.reshape(k.shape[0], row), v.reshape(v.shape[0], row)
    _write_kv_kernel[(k.shape[0],)](
        k2, v2, k_cache, v_cache, slot_blocks, slot_offsets,
        k2.stride(0), v2.stride(0), k_cache.stride(0), k_cache.stride(1),
        ROW=row, ROW_P2=_pow2(row),
    )


def attention(q: torch.Tensor, kv_pool: torch.Tensor, layer: int, step: PagedStep,
              scale: float) -> torch.Tensor:
    """Causal attention of ``q`` ``[T, num_heads, head_dim]`` over the step's sequences in the
    pool; returns ``[T, num_heads, head_dim]`` in ``q``'s dtype (padding rows undefined)."""
    k_cache, v_cache = kv_pool[:, layer, 0], kv_pool[:, layer, 1]
    t, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    groups = heads // kv_heads
    out = torch.empty_like(q)
    splits = step.num_splits
    if splits > 1:
        part_out = torch.empty((splits, t, heads, dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((splits, t, heads), dtype=torch.float32, device=q.device)
    else:  # unused: the kernel writes `out` directly
        part_out = part_lse = out
    block_m = step.block_q * groups
    block_m = _pow2(block_m)
    grid = (t // step.block_q + step.num_seqs, kv_heads, splits)
    _attention_kernel[grid](
        q, k_cache, v_cache, out, part_out, part_lse,
        step.block_tables, step.seq_lens, step.query_start_loc,
        scale * LOG2E, step.num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), step.block_tables.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        G=groups, BLOCK_Q=step.block_q, BLOCK_M=block_m, BLOCK_N=BLOCK_N,
        HEAD_DIM=dim, D_P2=max(16, _pow2(dim)), BLOCK_SIZE=step.block_size, NUM_SPLITS=splits,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    if splits > 1:
        _combine_kernel[(t, heads)](
            part_out, part_lse, out, step.query_start_loc, step.num_seqs,
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
            HEAD_DIM=dim, D_P2=max(16, _pow2(dim)), NUM_SPLITS=splits,
            SPLITS_P2=max(2, _pow2(splits)),
        )
    return out


class PagedBackend(AttentionBackend):
    """Paged Triton kernels: no K/V gather, one launch per layer for the whole batch."""

    name = "paged"

    def __init__(self) -> None:
        self._last: tuple[BatchMeta, PagedStep] | None = None

    def write_kv(self, kv_pool: torch.Tensor, layer: int, k: torch.Tensor, v: torch.Tensor,
                 meta: BatchMeta | PagedStep) -> None:  # type: ignore[override]
        write_kv(kv_pool, layer, k, v, meta.slot_blocks, meta.slot_offsets)

    def attend(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
               kv_pool: torch.Tensor, layer: int, meta: BatchMeta | PagedStep,
               scale: float) -> torch.Tensor:  # type: ignore[override]
        if isinstance(meta, PagedStep):
            return attention(q, kv_pool, layer, meta, scale)
        # one step per batch, derived at its first layer (the model calls every layer with it)
        if self._last is None or self._last[0] is not meta:
            kv_heads = kv_pool.shape[4]
            self._last = (meta, step_from_meta(meta, q.shape[1] // kv_heads, kv_heads))
        return attention(q, kv_pool, layer, self._last[1], scale)
