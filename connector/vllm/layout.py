"""The page layout of a vLLM engine's KV cache.

Page identity: a page holds one vLLM block of every layer, verbatim -- the engine's own block
layout, which :class:`~kvstore.layout.KVLayout` names in ``block_format``:

    ``vllm-cpu``  vLLM's CPU attention backend: per layer ``[num_blocks, num_kv_heads,
                  block_size, 2 * head_size]``, K transposed inside a block.

A cache of another shape (a GPU backend's ``[2, num_blocks, ...]``, say) is refused at
``register_kv_caches``: its blocks are not contiguous per layer, or not laid out as the format
says. The layout fingerprint, hence every key, differs from kvstore's own page layout's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvstore.errors import ConfigError, InvalidArgument
from kvstore.layout import KVLayout

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

#: vLLM block formats kvstore understands: name -> the per-layer block shape (after the block
#: dimension) as a function of (num_kv_heads, block_size, head_size).
BLOCK_FORMATS: dict[str, Any] = {
    "vllm-cpu": lambda h, b, d: (h, b, 2 * d),
}


def layout_for(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> tuple[KVLayout, list[str]]:
    """The page layout of this vLLM engine's KV cache, and its attention layers in model order.
    Raises ConfigError for a cache kvstore cannot hold (several cache groups, MLA, sliding
    window, a quantized cache) naming what it found."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ConfigError(
            f"the vLLM model has {len(groups)} KV cache groups; kvstore's connector holds the "
            "cache of models with one kind of full attention",
            hint="use a model with full attention in every layer")
    spec = groups[0].kv_cache_spec
    if type(spec) is not FullAttentionSpec or isinstance(spec, MLAAttentionSpec) or getattr(
            spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None):
        raise ConfigError(
            f"the vLLM KV cache spec is {type(spec).__name__} "
            f"(sliding_window={getattr(spec, 'sliding_window', None)}); kvstore's connector "
            "holds full-attention caches only")
    head_v = getattr(spec, "head_size_v", None)
    if head_v not in (None, spec.head_size):
        raise ConfigError(f"K and V head sizes differ ({spec.head_size} vs {head_v})")
    device = vllm_config.device_config.device_type
    fmt = f"vllm-{device}"
    dtype = str(spec.dtype).removeprefix("torch.")
    try:
        layout = KVLayout(len(groups[0].layer_names), spec.num_kv_heads, spec.head_size,
                          spec.block_size, dtype, fmt)
    except InvalidArgument as exc:
        raise ConfigError(f"vLLM's KV cache cannot be described as pages: {exc.message}",
                          hint=exc.hint) from None
    return layout, list(groups[0].layer_names)
