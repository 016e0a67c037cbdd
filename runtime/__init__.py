"""The bundled paged-attention runtime: a Llama-family model over a paged KV pool.

Data flow for one engine step::

    SeqInput per sequence --build_batch--> Batch(input_ids, BatchMeta)
    LlamaForPagedLM.forward(batch, kv_pool) -> logits; writes new K/V into kv_pool
    kv_pool [num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]  (= kvstore pages)

Serving: ``Engine`` (``engine``) runs requests with continuous batching and chunked prefill
(``scheduler``), sampling per request (``sampling``), prefix caching through the hbm tier's block
pool, or ``Engine.from_pretrained(directory)`` for a Hugging Face checkpoint; ``tokenizer`` is the
tokenizer interface and a byte-level tokenizer for demos, ``tokenizer_hf`` a checkpoint's
``tokenizer.json``; ``demo`` the multi-turn chat demo.

Modules: ``config`` (ModelConfig, presets, HF config parsing), ``weights`` (random init,
safetensors checkpoint loading), ``batch`` (batch metadata and validation), ``model`` (the
decoder), ``attention`` (backends by name: ``torch_ref``, ``sdpa``), ``errors``.
"""

from __future__ import annotations

from runtime.attention import (
    AttentionBackend,
    available_backends,
    make_attention_backend,
)
from runtime.batch import Batch, BatchMeta, SeqInput, build_batch
from runtime.config import MODEL_CONFIGS, ModelConfig, RopeScaling, get_model_config
from runtime.engine import Engine
from runtime.errors import CheckpointError
from runtime.model import LlamaForPagedLM, allocate_kv_pool
from runtime.request import RequestMetrics, RequestOutput
from runtime.sampling import SamplingParams
from runtime.tokenizer import ByteTokenizer, Tokenizer
from runtime.tokenizer_hf import HFTokenizer, load_tokenizer
from runtime.weights import (
    Checkpoint,
    checkpoint_tensor_shapes,
    load_checkpoint,
    load_checkpoint_config,
    random_state_dict,
)

__all__ = [
    "MODEL_CONFIGS", "AttentionBackend", "Batch", "BatchMeta", "ByteTokenizer", "Checkpoint",
    "CheckpointError", "Engine", "HFTokenizer", "RequestMetrics", "RequestOutput", "SamplingParams",
    "LlamaForPagedLM", "ModelConfig", "RopeScaling", "SeqInput", "Tokenizer", "allocate_kv_pool",
    "available_backends", "build_batch", "checkpoint_tensor_shapes", "get_model_config",
    "load_checkpoint", "load_checkpoint_config", "load_tokenizer", "make_attention_backend",
    "random_state_dict",
]
