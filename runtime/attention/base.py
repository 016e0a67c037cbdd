"""The attention-backend interface: write new K/V into the paged pool, attend over it.

The KV pool is page-first, exactly kvstore's page layout, so one block is one contiguous page::

    kv_pool  [num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]   (kv: 0 = K, 1 = V)

Per layer the model calls :meth:`AttentionBackend.write_kv` and then
:meth:`AttentionBackend.attend` with ``T = meta.num_tokens`` new tokens. Causality: new token
``i`` of sequence ``s`` (position ``p = num_cached_tokens[s] + i``) attends to that sequence's
positions ``0 .. p``, cached and new alike, and to nothing of any other sequence.

Backends hold no per-batch state and are safe to share between models; they never allocate the
pool. Inputs were validated by :func:`runtime.batch.build_batch` and the model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from runtime.batch import BatchMeta


class AttentionBackend(ABC):
    """Paged attention over ``kv_pool`` (see the module docstring for its shape)."""

    #: Registry name of the backend.
    name: str = ""

    def write_kv(
        self, kv_pool: torch.Tensor, layer: int, k: torch.Tensor, v: torch.Tensor, meta: BatchMeta
    ) -> None:
        """Store the new tokens' K and V of ``layer`` in their slots; mutates ``kv_pool`` only.

        ``k``, ``v``: ``[T, num_kv_heads, head_dim]`` (RoPE already applied to ``k``), in the
        pool's dtype. Slot of token ``t``: ``(meta.slot_blocks[t], meta.slot_offsets[t])``.
        """
        kv_pool[meta.slot_blocks, layer, 0, meta.slot_offsets] = k
        kv_pool[meta.slot_blocks, layer, 1, meta.slot_offsets] = v

    @abstractmethod
    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_pool: torch.Tensor,
        layer: int,
        meta: BatchMeta,
        scale: float,
    ) -> torch.Tensor:
        """Causal attention of the new tokens over their sequences' cached + new K/V.

        ``q``: ``[T, num_heads, head_dim]`` (RoPE applied); ``num_heads`` is a multiple of the
        pool's ``num_kv_heads`` (query head ``h`` reads KV head ``h // (num_heads //
        num_kv_heads)``). ``k``, ``v``: the new tokens' ``[T, num_kv_heads, head_dim]``, as
        given to :meth:`write_kv` — a backend may attend over them directly where a sequence has
        no cached tokens, instead of reading them back from the pool. ``scale`` multiplies
        ``q·k``. Reads ``kv_pool`` (after :meth:`write_kv` for this layer), mutates nothing.
        Returns ``[T, num_heads, head_dim]`` in ``q``'s dtype.
        """
