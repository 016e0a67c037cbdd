"""Fixtures: a tiny Llama saved by transformers' ``save_pretrained`` (safetensors, sharded) with
our random weights, and the matching HF model as the reference. Nothing is downloaded: the HF
model is built from a ``LlamaConfig``."""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime import ModelConfig, get_model_config, random_state_dict
from runtime.hf import to_hf_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # belt and braces: nothing may reach a hub


def hf_config(cfg: ModelConfig) -> Any:
    return to_hf_config(cfg)


def make_hf_checkpoint(cfg: ModelConfig, path: Path, seed: int, shard: bool) -> Any:
    """Build a float32 HF Llama with our seeded weights (norms perturbed so they matter), save
    it to ``path`` with ``save_pretrained`` and return the HF model in eval mode."""
    transformers = importlib.import_module("transformers")
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(hf_config(cfg)).float().eval()
    sd = random_state_dict(cfg, seed, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    for name, t in sd.items():
        if name.endswith("norm.weight"):
            t.add_(0.2 * torch.randn(t.shape, generator=gen))
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if cfg.tie_word_embeddings:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    hf.save_pretrained(str(path), max_shard_size="200KB" if shard else "50GB")
    return hf


@pytest.fixture(scope="session")
def tiny_cfg() -> ModelConfig:
    return get_model_config("tiny")


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory, tiny_cfg: ModelConfig) -> tuple[Path, Any]:
    """A sharded checkpoint (with model.safetensors.index.json) of the tiny config, and its HF
    model."""
    path = tmp_path_factory.mktemp("tiny_ckpt")
    hf = make_hf_checkpoint(tiny_cfg, path, seed=1234, shard=True)
    return path, hf


@pytest.fixture(scope="session")
def tied_ckpt(tmp_path_factory: pytest.TempPathFactory, tiny_cfg: ModelConfig) -> tuple[Path, Any]:
    """A single-file checkpoint of a tied-embedding, unscaled-RoPE tiny variant."""
    cfg = dataclasses.replace(tiny_cfg, tie_word_embeddings=True, rope_scaling=None,
                              rope_theta=500.0)
    path = tmp_path_factory.mktemp("tied_ckpt")
    hf = make_hf_checkpoint(cfg, path, seed=99, shard=False)
    return path, hf


def hf_logits(hf: Any, token_ids: list[int]) -> torch.Tensor:
    """HF logits ``[len(token_ids), vocab]`` of one sequence, no cache."""
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([token_ids]), use_cache=False)
    return out.logits[0].float()


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny batches run faster on one intra-op thread, and are immune to a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_tokenizer_json(path: Path, texts: list[str], vocab_size: int) -> Any:
    """Train a word-level tokenizer on ``texts`` with the ``tokenizers`` library and save it as
    ``path / "tokenizer.json"``. Ids 0-3 are ``<pad> <s> </s> <unk>`` (so BOS 1 and EOS 2 match a
    default ``LlamaConfig``). Returns the ``tokenizers.Tokenizer``."""
    tokenizers = importlib.import_module("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path / "tokenizer.json"))
    return tok


@pytest.fixture(scope="session")
def chat_ckpt(tmp_path_factory: pytest.TempPathFactory, tiny_cfg: ModelConfig) -> tuple[Path, Any]:
    """A single-file checkpoint of the tiny config with a 1024-token context (room for the chat
    demo), saved by ``save_pretrained``, with a word-level ``tokenizer.json`` trained on the demo's
    texts. Returns the directory and the ``tokenizers.Tokenizer``."""
    from runtime.demo import SYSTEM_PROMPT, USER_TURNS

    cfg = dataclasses.replace(tiny_cfg, max_position_embeddings=1024)
    path = tmp_path_factory.mktemp("chat_ckpt")
    make_hf_checkpoint(cfg, path, seed=7, shard=False)
    tok = make_tokenizer_json(path, [SYSTEM_PROMPT, *USER_TURNS, "User: Assistant:"],
                              vocab_size=cfg.vocab_size)
    return path, tok
