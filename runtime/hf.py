"""Interop with Hugging Face transformers (imported lazily: it is a test and bench dependency,
not a runtime one)."""

from __future__ import annotations

import dataclasses
from typing import Any

from runtime.config import ModelConfig


def to_hf_config(cfg: ModelConfig, *, attn_implementation: str = "eager") -> Any:
    """The ``transformers.LlamaConfig`` of ``cfg``, spelled for transformers 4.x or 5.x."""
    import transformers

    rope: dict[str, Any] = {"rope_type": "default"}
    if cfg.rope_scaling is not None:
        rope = {"rope_type": "llama3", **dataclasses.asdict(cfg.rope_scaling)}
    kwargs: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings, attn_implementation=attn_implementation,
    )
    if int(transformers.__version__.split(".")[0]) >= 5:
        kwargs["rope_parameters"] = {**rope, "rope_theta": cfg.rope_theta}
    else:
        kwargs["rope_theta"] = cfg.rope_theta
        kwargs["rope_scaling"] = None if cfg.rope_scaling is None else rope
    return transformers.LlamaConfig(**kwargs)
