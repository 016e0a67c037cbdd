"""Attention through ``torch.nn.functional.scaled_dot_product_attention``, one sequence at a time.

SDPA's ``is_causal`` aligns the mask top-left, which is wrong once a prefix is cached (``n`` new
queries against ``L > n`` keys), so: no cached prefix -> ``is_causal=True``; one new token -> no
mask (it sees every key); otherwise an explicit boolean mask ``key_pos <= cached + i``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.attention.base import AttentionBackend
from runtime.attention.torch_ref import gather_kv
from runtime.batch import BatchMeta


class SDPABackend(AttentionBackend):
    """Fused SDPA kernels (flash / memory-efficient on GPU, the math kernel on CPU)."""

    name = "sdpa"

    def attend(
        self, q: torch.Tensor, kv_pool: torch.Tensor, layer: int, meta: BatchMeta, scale: float
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        for s in range(meta.num_seqs):
            lo, hi = meta.query_start_loc[s], meta.query_start_loc[s + 1]
            k, v = gather_kv(kv_pool, layer, meta, s)
            qs = q[lo:hi].transpose(0, 1)  # [num_heads, n, D]
            cached, n = meta.num_cached_tokens[s], hi - lo
            mask = None
            if cached and n > 1:
                q_pos = torch.arange(n, device=q.device) + cached
                mask = torch.arange(k.shape[0], device=q.device)[None, :] <= q_pos[:, None]
            o = F.scaled_dot_product_attention(
                qs, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                is_causal=cached == 0 and n > 1, scale=scale, enable_gqa=True,
            )
            out[lo:hi] = o.transpose(0, 1)
        return out
