"""Attention through ``torch.nn.functional.scaled_dot_product_attention``, one sequence at a time.

SDPA's ``is_causal`` aligns the mask top-left, which is wrong once a prefix is cached (``n`` new
queries against ``L > n`` keys), so a cached prefix uses torch's lower-right causal bias
(``causal_lower_right``: query i sees keys ``<= L - n + i``), which still dispatches to the fused
flash / memory-efficient kernels — an explicit boolean mask would force the slow math kernel.
One new token needs no mask. Grouped-query attention: on CUDA the fused kernels take the K/V heads
as they are (``enable_gqa``); on CPU ``enable_gqa`` would select the math kernel, so K/V heads
are repeated to the query heads there (as transformers does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from runtime.attention.base import AttentionBackend
from runtime.attention.torch_ref import gather_kv
from runtime.batch import BatchMeta


class SDPABackend(AttentionBackend):
    """Fused SDPA kernels (flash / memory-efficient on GPU, the math kernel on CPU)."""

    name = "sdpa"

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
        out = torch.empty_like(q)
        for s in range(meta.num_seqs):
            lo, hi = meta.query_start_loc[s], meta.query_start_loc[s + 1]
            if meta.num_cached_tokens[s] == 0:  # every K/V of the sequence is new: no gather
                k, v = k_new[lo:hi], v_new[lo:hi]
            else:
                k, v = gather_kv(kv_pool, layer, meta, s)
            qs = q[lo:hi].transpose(0, 1)[None]  # [1, num_heads, n, D]
            ks, vs = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, kv_heads, L, D]
            gqa = qs.shape[1] != ks.shape[1]
            if gqa and not q.is_cuda:
                groups = qs.shape[1] // ks.shape[1]
                ks = ks.repeat_interleave(groups, dim=1)
                vs = vs.repeat_interleave(groups, dim=1)
                gqa = False
            cached, n = meta.num_cached_tokens[s], hi - lo
            if n == 1:
                o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale, enable_gqa=gqa)
            elif cached == 0:
                o = F.scaled_dot_product_attention(
                    qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa
                )
            else:
                bias = causal_lower_right(n, ks.shape[2])
                o = F.scaled_dot_product_attention(
                    qs, ks, vs, attn_mask=bias, scale=scale, enable_gqa=gqa
                )
            o = o[0]
            out[lo:hi] = o.transpose(0, 1)
        return out
