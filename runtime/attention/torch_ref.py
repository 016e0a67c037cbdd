"""Pure-torch reference attention over the paged pool (CPU and GPU); the reference in tests.

Per sequence it gathers the blocks of ``block_tables[s, :num_blocks_used[s]]`` for the layer,
flattens them to ``[seq_len, num_kv_heads, head_dim]``, and runs softmax attention in float32
with the mask ``key_pos <= cached + i`` for new token ``i``.
"""

from __future__ import annotations

import torch

from runtime.attention.base import AttentionBackend
from runtime.batch import BatchMeta


def gather_kv(
    kv_pool: torch.Tensor, layer: int, meta: BatchMeta, s: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of sequence ``s`` at ``layer``, each ``[seq_lens[s], num_kv_heads, head_dim]``."""
    seq_len = meta.seq_lens[s]
    blocks = meta.block_tables[s, : meta.num_blocks_used[s]]
    pages = kv_pool[blocks, layer]  # [nb, 2, block_size, kv_heads, head_dim]
    k = pages[:, 0].flatten(0, 1)[:seq_len]
    v = pages[:, 1].flatten(0, 1)[:seq_len]
    return k, v


class TorchRefBackend(AttentionBackend):
    """Reference backend: explicit scores, mask and float32 softmax, one sequence at a time."""

    name = "torch_ref"

    def attend(
        self,
        q: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        kv_pool: torch.Tensor,
        layer: int,
        meta: BatchMeta,
        scale: float,
    ) -> torch.Tensor:
        # The reference always reads K/V back from the pool: it checks the paged layout too.
        out = torch.empty_like(q)
        groups = q.shape[1] // kv_pool.shape[4]
        for s in range(meta.num_seqs):
            lo, hi = meta.query_start_loc[s], meta.query_start_loc[s + 1]
            k, v = gather_kv(kv_pool, layer, meta, s)
            k = k.float().repeat_interleave(groups, dim=1)  # [L, num_heads, D]
            v = v.float().repeat_interleave(groups, dim=1)
            qs = q[lo:hi].float()  # [n, num_heads, D]
            scores = torch.einsum("qhd,khd->hqk", qs, k) * scale  # [num_heads, n, L]
            q_pos = torch.arange(hi - lo, device=q.device) + meta.num_cached_tokens[s]
            k_pos = torch.arange(k.shape[0], device=q.device)
            scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[lo:hi] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
        return out
