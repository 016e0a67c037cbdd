"""``Engine.from_pretrained``: a Hugging Face checkpoint directory (config.json + safetensors) with
its ``tokenizer.json`` when present; greedy tokens equal transformers' ``generate`` (fp32, CPU)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime import CheckpointError, Engine, SamplingParams
from runtime.tokenizer_hf import HFTokenizer

from .conftest import make_tokenizer_json


def _prompt(n: int, seed: int, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _hf_greedy(hf: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate``, never stopping early at an EOS."""
    gen = copy.deepcopy(hf.generation_config)
    gen.update(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), generation_config=gen)
    assert out.shape[1] == len(prompt) + max_new_tokens
    return out[0, len(prompt):].tolist()


def test_greedy_tokens_equal_transformers_generate(
    tiny_ckpt: tuple[Path, Any], one_torch_thread: None,
) -> None:
    path, hf = tiny_ckpt  # sharded, with model.safetensors.index.json
    engine = Engine.from_pretrained(path, num_blocks=64, block_size=4)
    assert engine.model.config.dtype == "float32"
    prompts = [_prompt(11, seed=0), _prompt(29, seed=1), _prompt(3, seed=2)]
    params = SamplingParams(max_tokens=12)
    expected = [_hf_greedy(hf, p, 12) for p in prompts]
    first = engine.generate(prompts, params)  # one continuous batch
    assert [o.output_token_ids for o in first] == expected
    again = engine.generate(prompts, params)  # full blocks now come from the prefix cache
    assert sum(sum(o.metrics.num_tokens_reused.values()) for o in again) > 0
    assert [o.output_token_ids for o in again] == expected


def test_without_tokenizer_json_the_engine_takes_token_ids(tiny_ckpt: tuple[Path, Any]) -> None:
    engine = Engine.from_pretrained(tiny_ckpt[0], num_blocks=16, block_size=4)
    assert engine.tokenizer is None
    (out,) = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    assert len(out.output_token_ids) == 2


def test_tokenizer_json_is_loaded_with_the_tokenizers_library(
    chat_ckpt: tuple[Path, Any],
) -> None:
    path, ref = chat_ckpt
    engine = Engine.from_pretrained(path, num_blocks=32, block_size=4)
    tok = engine.tokenizer
    assert isinstance(tok, HFTokenizer)
    text = "What does the hbm tier hold?"
    ids = ref.encode(text, add_special_tokens=False).ids
    assert tok.encode(text) == ids
    assert tok.encode(text, add_bos=True, add_eos=True) == [1, *ids, 2]  # config.json's ids
    assert tok.bos_id == 1 and tok.eos_ids == (2,)
    assert tok.decode([1, *ids, 2]) == ref.decode(ids)
    assert tok.vocab_size == ref.get_vocab_size()
    (out,) = engine.generate([tok.encode(text, add_bos=True)], SamplingParams(max_tokens=3))
    assert isinstance(tok.decode(out.output_token_ids), str)


@pytest.fixture
def ckpt_copy(tmp_path: Path, chat_ckpt: tuple[Path, Any]) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(chat_ckpt[0], dst)
    return dst


def test_unreadable_tokenizer_json_names_the_file(ckpt_copy: Path) -> None:
    (ckpt_copy / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError) as info:
        Engine.from_pretrained(ckpt_copy)
    assert str(info.value).startswith(f"cannot read {str(ckpt_copy / 'tokenizer.json')!r}: ")
    assert info.value.hint


def test_tokenizer_larger_than_the_model_vocabulary_is_refused(
    ckpt_copy: Path, tiny_cfg: Any,
) -> None:
    words = [f"w{i}" for i in range(tiny_cfg.vocab_size + 100)]
    make_tokenizer_json(ckpt_copy, [" ".join(words)], vocab_size=tiny_cfg.vocab_size + 100)
    with pytest.raises(CheckpointError) as info:
        Engine.from_pretrained(ckpt_copy)
    assert info.value.message == (
        f"{str(ckpt_copy / 'tokenizer.json')!r} has {tiny_cfg.vocab_size + 100} tokens, more "
        f"than the model's vocab_size {tiny_cfg.vocab_size}")


def test_bad_special_token_id_in_config_is_refused(ckpt_copy: Path) -> None:
    cfg_path = ckpt_copy / "config.json"
    raw = json.loads(cfg_path.read_text())
    raw["eos_token_id"] = [2, "x"]
    cfg_path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError) as info:
        Engine.from_pretrained(ckpt_copy)
    assert info.value.message == (
        f"{str(cfg_path)!r}: field 'eos_token_id' must be a token id or a list of them, "
        "got [2, 'x']")


def test_checkpoints_get_their_own_namespace_and_a_store(
    tiny_ckpt: tuple[Path, Any], chat_ckpt: tuple[Path, Any],
) -> None:
    a = Engine.from_pretrained(tiny_ckpt[0], num_blocks=8, block_size=4)
    b = Engine.from_pretrained(chat_ckpt[0], num_blocks=8, block_size=4)
    assert a.namespace.model_id == f"hf/{tiny_ckpt[0].resolve()}"
    assert a.namespace.id != b.namespace.id
    assert a.store is not None and a.store.tiers[0] is a.pool
    named = Engine.from_pretrained(tiny_ckpt[0], num_blocks=8, block_size=4, model_id="mine")
    assert named.namespace.model_id == "mine"
