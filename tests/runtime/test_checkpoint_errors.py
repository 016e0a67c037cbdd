"""Malformed checkpoint directories raise CheckpointError naming the file/tensor and what was
expected; pickles are never loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from kvstore.errors import KVStoreError
from runtime import CheckpointError, LlamaForPagedLM, get_model_config, load_checkpoint
from runtime.weights import INDEX_FILE


@pytest.fixture
def ckpt(tmp_path: Path, tiny_ckpt: tuple[Path, Any]) -> Path:
    """A writable copy of the sharded tiny checkpoint."""
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt[0], dst)
    return dst


def _single_file(ckpt: Path, edit: Any) -> None:
    """Rewrite ``ckpt`` as one model.safetensors holding ``edit(tensors)``."""
    tensors = {k: v.contiguous() for k, v in load_checkpoint(ckpt).tensors.items()}
    edit(tensors)
    for f in ckpt.glob("*.safetensors"):
        f.unlink()
    (ckpt / INDEX_FILE).unlink()
    save_file(tensors, str(ckpt / "model.safetensors"))


def _raises(path: Path, *fragments: str) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))
    assert isinstance(info.value, KVStoreError) and info.value.hint
    return info.value


def test_valid_copy_loads(ckpt: Path) -> None:
    assert load_checkpoint(ckpt).config == get_model_config("tiny")


def test_missing_directory(tmp_path: Path) -> None:
    _raises(tmp_path / "nope", "does not exist")


def test_missing_config(ckpt: Path) -> None:
    (ckpt / "config.json").unlink()
    _raises(ckpt, "config.json", "missing")


def test_bad_json(ckpt: Path) -> None:
    (ckpt / "config.json").write_text('{"vocab_size": 512,,}')
    _raises(ckpt, "config.json", "not valid JSON", "line 1")


@pytest.mark.parametrize("field, value, fragment", [
    ("num_attention_heads", "four", "'num_attention_heads' must be int"),
    ("num_key_value_heads", 3, "multiple of num_kv_heads"),
    ("vocab_size", None, "'vocab_size' is missing"),
    ("hidden_act", "gelu", "'hidden_act'"),
    ("model_type", "gpt2", "'model_type'"),
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0}, "rope type 'yarn'"),
    ("dtype", "int4", "dtype must be one of"),
])
def test_bad_config_field(ckpt: Path, field: str, value: Any, fragment: str) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    if value is None:
        del cfg[field]
    else:
        cfg[field] = value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    _raises(ckpt, "config.json", fragment)


def test_no_safetensors(ckpt: Path) -> None:
    for f in ckpt.glob("*.safetensors"):
        f.unlink()
    (ckpt / INDEX_FILE).unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"pickle bytes that must never be unpickled")
    _raises(ckpt, "no *.safetensors", "pytorch_model.bin", "never loaded")


def test_index_names_missing_shard(ckpt: Path) -> None:
    victim = sorted(ckpt.glob("*.safetensors"))[1]
    victim.unlink()
    _raises(ckpt, INDEX_FILE, victim.name, "missing")


def test_index_maps_tensor_to_wrong_shard(ckpt: Path) -> None:
    index = json.loads((ckpt / INDEX_FILE).read_text())
    shards = sorted({*index["weight_map"].values()})
    name = next(n for n, f in index["weight_map"].items() if f == shards[0])
    index["weight_map"][name] = shards[1]
    (ckpt / INDEX_FILE).write_text(json.dumps(index))
    _raises(ckpt, name, shards[1], "does not hold it")


def test_truncated_safetensors(ckpt: Path) -> None:
    victim = sorted(ckpt.glob("*.safetensors"))[0]
    victim.write_bytes(victim.read_bytes()[:50])
    _raises(ckpt, "cannot read safetensors file", victim.name)


def test_missing_tensor(ckpt: Path) -> None:
    _single_file(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    _raises(ckpt, "missing tensors", "model.layers.1.mlp.up_proj.weight")


def test_missing_lm_head_when_untied(ckpt: Path) -> None:
    _single_file(ckpt, lambda t: t.pop("lm_head.weight"))
    _raises(ckpt, "missing tensors", "lm_head.weight", "tie_word_embeddings=False")


def test_extra_tensor(ckpt: Path) -> None:
    _single_file(ckpt, lambda t: t.update({"model.layers.2.mlp.up_proj.weight": torch.zeros(2)}))
    _raises(ckpt, "unexpected tensors", "model.layers.2.mlp.up_proj.weight", "model.safetensors")


def test_misshaped_tensor(ckpt: Path) -> None:
    _single_file(ckpt, lambda t: t.update({"model.norm.weight": torch.ones(65)}))
    _raises(ckpt, "'model.norm.weight'", "shape [65]", "expected [64]")


def test_integer_tensor(ckpt: Path) -> None:
    _single_file(ckpt, lambda t: t.update({"model.norm.weight": torch.ones(64, dtype=torch.int8)}))
    _raises(ckpt, "'model.norm.weight'", "floating point")


def test_tensor_in_two_files(ckpt: Path) -> None:
    (ckpt / INDEX_FILE).unlink()
    save_file({"model.norm.weight": torch.ones(64)}, str(ckpt / "stray.safetensors"))
    _raises(ckpt, "'model.norm.weight'", "stray.safetensors", "both")


def test_load_weights_rejects_bad_state_dict(tiny_ckpt: tuple[Path, Any]) -> None:
    model = LlamaForPagedLM.from_checkpoint(tiny_ckpt[0])
    tensors = dict(load_checkpoint(tiny_ckpt[0]).tensors)
    before = model.model.norm.weight.clone()
    tensors["model.norm.weight"] = torch.zeros(64)
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match="model.layers.0.mlp.up_proj.weight"):
        model.load_weights(tensors)
    assert torch.equal(model.model.norm.weight, before)  # nothing copied
