"""ModelConfig presets and validation, HF config parsing (4.x and 5.x spellings), random init,
the backend registry and SDPA/torch_ref parity."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvstore.errors import ConfigError, UnknownComponent
from runtime import (
    MODEL_CONFIGS,
    LlamaForPagedLM,
    ModelConfig,
    RopeScaling,
    SeqInput,
    allocate_kv_pool,
    available_backends,
    build_batch,
    get_model_config,
    make_attention_backend,
    random_state_dict,
)


def test_presets() -> None:
    assert set(MODEL_CONFIGS) >= {"tiny", "small", "llama3-8b"}
    big = get_model_config("llama3-8b")
    assert (big.num_layers, big.hidden_size, big.num_heads, big.num_kv_heads, big.head_dim,
            big.intermediate_size, big.vocab_size, big.rope_theta, big.dtype) == (
        32, 4096, 32, 8, 128, 14336, 128256, 500000.0, "bfloat16")
    assert big.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    layout = big.kv_layout(16)
    assert layout.page_shape == (32, 2, 16, 8, 128)
    assert layout.page_bytes == 2 * 32 * 2 * 16 * 8 * 128
    with pytest.raises(ConfigError, match="known: llama3-8b, small, tiny"):
        get_model_config("huge")


def test_config_validation_names_field() -> None:
    base = get_model_config("tiny")
    with pytest.raises(ConfigError, match="num_kv_heads"):
        dataclasses.replace(base, num_kv_heads=3)
    with pytest.raises(ConfigError, match="hidden_size must be a positive int"):
        dataclasses.replace(base, hidden_size=0)
    with pytest.raises(ConfigError, match="dtype must be one of"):
        dataclasses.replace(base, dtype="int8")
    with pytest.raises(ConfigError, match="high_freq_factor"):
        RopeScaling(8.0, 4.0, 1.0, 8192)


def test_from_hf_config_transformers4_spelling() -> None:
    raw = {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    assert ModelConfig.from_hf_config(raw) == get_model_config("llama3-8b")
    with pytest.raises(ConfigError, match="my.json: llama3 rope scaling"):
        ModelConfig.from_hf_config({**raw, "rope_scaling": {"rope_type": "llama3"}},
                                   source="my.json")
    with pytest.raises(ConfigError, match="'tie_word_embeddings' must be bool"):
        ModelConfig.from_hf_config({**raw, "tie_word_embeddings": "yes"})


def test_random_init_is_deterministic_and_scaled() -> None:
    cfg = get_model_config("tiny")
    a, b, c = (random_state_dict(cfg, s) for s in (7, 7, 8))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    w = a["model.layers.0.mlp.down_proj.weight"]
    assert abs(w.std().item() - cfg.intermediate_size**-0.5) < 0.01
    assert a["lm_head.weight"].dtype == torch.float32
    assert random_state_dict(cfg, 7, dtype=torch.bfloat16)["model.norm.weight"].dtype == (
        torch.bfloat16)


def test_backend_registry() -> None:
    assert available_backends() == ["paged", "sdpa", "torch_ref"]
    with pytest.raises(UnknownComponent, match="known backends: paged, sdpa, torch_ref"):
        make_attention_backend("flash")


def test_sdpa_matches_torch_ref() -> None:
    cfg = get_model_config("tiny")
    ref = LlamaForPagedLM.from_random(cfg, seed=3, backend="torch_ref")
    fast = LlamaForPagedLM.from_random(cfg, seed=3, backend="sdpa")
    gen = torch.Generator().manual_seed(0)
    pools = [allocate_kv_pool(cfg, 32, 4) for _ in range(2)]
    seqs = [SeqInput(torch.randint(0, 512, (n,), generator=gen).tolist(), table, cached)
            for n, table, cached in ((9, [0, 1, 2], 0), (6, [3, 4, 5, 6], 8), (1, [7, 8], 5))]
    warm = [SeqInput(torch.randint(0, 512, (s.num_cached_tokens,), generator=gen).tolist(),
                     s.block_table, logits="none") for s in seqs if s.num_cached_tokens]
    for model, pool in zip((ref, fast), pools):
        model(build_batch(warm, cfg, block_size=4, num_blocks=32), pool)
    batch = build_batch([dataclasses.replace(s, logits="all") for s in seqs], cfg, block_size=4,
                        num_blocks=32)
    torch.testing.assert_close(fast(batch, pools[1]), ref(batch, pools[0]), rtol=1e-4,
                               atol=1e-5)
    torch.testing.assert_close(pools[1], pools[0])


def test_bf16_small_model_runs() -> None:
    cfg = get_model_config("small").with_dtype("bfloat16")
    model = LlamaForPagedLM.from_random(cfg, seed=0, backend="sdpa")
    pool = allocate_kv_pool(cfg, 8, 16)
    assert pool.dtype == torch.bfloat16
    out = model(build_batch([SeqInput(list(range(20)), [0, 1])], cfg, block_size=16,
                            num_blocks=8), pool)
    assert out.shape == (1, cfg.vocab_size) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_pool_blocks_are_kvstore_pages() -> None:
    cfg = get_model_config("tiny")
    pool = allocate_kv_pool(cfg, 5, 8)
    layout = cfg.kv_layout(8)
    page = pool[3]
    assert page.shape == layout.page_shape and page.is_contiguous()
    assert page.numel() * page.element_size() == layout.page_bytes
    assert layout.dtype == "float32"
