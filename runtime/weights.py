"""Model weights: deterministic random init, and loading a Hugging Face checkpoint directory.

Tensor names are Hugging Face Llama's, so a state dict from here loads into
:class:`runtime.model.LlamaForPagedLM` and into ``transformers.LlamaForCausalLM`` alike::

    model.embed_tokens.weight                        [vocab_size, hidden_size]
    model.layers.{i}.self_attn.q_proj.weight         [num_heads * head_dim, hidden_size]
    model.layers.{i}.self_attn.{k,v}_proj.weight     [num_kv_heads * head_dim, hidden_size]
    model.layers.{i}.self_attn.o_proj.weight         [hidden_size, num_heads * head_dim]
    model.layers.{i}.mlp.{gate,up}_proj.weight       [intermediate_size, hidden_size]
    model.layers.{i}.mlp.down_proj.weight            [hidden_size, intermediate_size]
    model.layers.{i}.{input,post_attention}_layernorm.weight   [hidden_size]
    model.norm.weight                                [hidden_size]
    lm_head.weight                                   [vocab_size, hidden_size]  (absent when tied)

A checkpoint directory holds ``config.json`` and one or more ``*.safetensors`` files, optionally
with ``model.safetensors.index.json`` mapping each tensor to its shard. Pickled ``*.bin`` files
are never loaded. Every problem raises :class:`runtime.errors.CheckpointError` naming the file or
tensor and what was expected; nothing is half-loaded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from kvstore.errors import ConfigError
from runtime.config import ModelConfig
from runtime.errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
#: Buffers some older checkpoints carry; recomputed from the config, so ignored when present.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A loaded checkpoint: its parsed config and HF-named tensors in the requested dtype."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor]


def checkpoint_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name a checkpoint of ``config`` must hold, with its shape (see module doc)."""
    h, q, kv = config.hidden_size, config.num_heads * config.head_dim, (
        config.num_kv_heads * config.head_dim
    )
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (q, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        shapes[p + "mlp.gate_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, config.intermediate_size)
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def random_state_dict(
    config: ModelConfig,
    seed: int,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Deterministic random weights for ``config``: the same ``seed`` gives the same tensors on
    every machine (drawn in float32 on CPU in name order, then cast and moved).

    Matrices are ``N(0, 1/fan_in)`` so activations and logits stay O(1) at any width; norm
    weights are ones. ``dtype`` defaults to ``config.torch_dtype``.
    """
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    out: dict[str, torch.Tensor] = {}
    for name, shape in checkpoint_tensor_shapes(config).items():
        if len(shape) == 1:
            t = torch.ones(shape)
        else:
            t = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
        out[name] = t.to(device=device, dtype=dtype or config.torch_dtype)
    return out


def load_checkpoint_config(path: str | Path) -> ModelConfig:
    """The :class:`ModelConfig` of the checkpoint directory ``path`` (its ``config.json``), no
    weight read. Raises :class:`CheckpointError` for a missing directory or ``config.json``, bad
    JSON or an invalid config field."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint directory {str(root)!r} does not exist or is not a directory",
            hint="pass the directory that holds config.json and *.safetensors",
        )
    raw = read_json_object(root / "config.json")
    try:
        return ModelConfig.from_hf_config(raw, source=str(root / "config.json"))
    except ConfigError as exc:
        raise CheckpointError(exc.message, hint=exc.hint) from None


def load_checkpoint(
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> Checkpoint:
    """Load ``config.json`` and the safetensors weights of the directory ``path``.

    Tensors are cast to ``dtype`` (default: the config's dtype) and moved to ``device``. Raises
    :class:`CheckpointError` for a missing directory or ``config.json``, bad JSON, an invalid
    config field, no ``*.safetensors`` file, an index naming a missing shard or a tensor its shard
    lacks, a tensor in two files, an unreadable safetensors file, and a missing, unexpected or
    misshaped tensor.
    """
    root = Path(path)
    config = load_checkpoint_config(root)
    locations = _tensor_locations(root)
    expected = checkpoint_tensor_shapes(config)
    present = {n for n in locations if not n.endswith(_IGNORED_SUFFIXES)}
    if config.tie_word_embeddings:
        present.discard("lm_head.weight")  # some writers save the tied copy too; it is unused
    missing = sorted(set(expected) - present)
    extra = sorted(present - set(expected))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing tensors {_preview(missing)}")
        if extra:
            parts.append(
                f"unexpected tensors {_preview(extra)} "
                f"(first in {locations[extra[0]].name!r})"
            )
        raise CheckpointError(
            f"checkpoint {str(root)!r} does not match its config.json: " + "; ".join(parts),
            hint="the safetensors files must hold exactly the HF Llama tensors for "
            f"{config.num_layers} layers (tie_word_embeddings={config.tie_word_embeddings})",
        )
    return Checkpoint(config, _read_tensors(locations, expected, dtype or config.torch_dtype,
                                            device))


def read_json_object(path: Path) -> dict:  # type: ignore[type-arg]
    """The JSON object in ``path``; :class:`CheckpointError` names the file when it is missing,
    unreadable, not JSON or not an object."""
    if not path.is_file():
        raise CheckpointError(
            f"{str(path)!r} is missing", hint="a checkpoint directory needs a config.json"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            hint="repair or regenerate the file",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {str(path)!r}: {exc}", hint="check the file") from None
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{str(path)!r} must hold a JSON object, got {type(data).__name__}",
            hint="repair or regenerate the file",
        )
    return data


def _tensor_locations(root: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it (validated against the index if any)."""
    from safetensors import safe_open

    index_path = root / INDEX_FILE
    if index_path.exists():
        weight_map = read_json_object(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(
                f"{str(index_path)!r} has no 'weight_map' object",
                hint="it must map every tensor name to its shard file",
            )
        files = sorted({root / str(f) for f in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise CheckpointError(
                    f"{str(index_path)!r} names shard {f.name!r}, which is missing",
                    hint="copy every shard the index lists into the directory",
                )
    else:
        weight_map = None
        files = sorted(root.glob("*.safetensors"))
        if not files:
            pickles = sorted(p.name for p in root.glob("*.bin"))
            raise CheckpointError(
                f"no *.safetensors file in {str(root)!r}"
                + (f" (found pickled {pickles[:3]}, which are never loaded)" if pickles else ""),
                hint="save the model with save_pretrained (safetensors) or convert it",
            )
    locations: dict[str, Path] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as handle:
                names = list(handle.keys())
        except Exception as exc:  # safetensors raises its own SafetensorError / OSError
            raise CheckpointError(
                f"cannot read safetensors file {str(f)!r}: {exc}",
                hint="the file is truncated or not a safetensors file; re-download or re-save it",
            ) from None
        for name in names:
            if name in locations:
                raise CheckpointError(
                    f"tensor {name!r} is in both {locations[name].name!r} and {f.name!r}",
                    hint="remove the stray file from the checkpoint directory",
                )
            locations[name] = f
    if weight_map is not None:
        for name, fname in weight_map.items():
            if locations.get(name) != root / str(fname):
                raise CheckpointError(
                    f"{INDEX_FILE} maps tensor {name!r} to {fname!r}, which does not hold it",
                    hint="regenerate the index or the shards",
                )
    return locations


def _read_tensors(
    locations: dict[str, Path],
    expected: dict[str, tuple[int, ...]],
    dtype: torch.dtype,
    device: torch.device | str,
) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name in expected:
        by_file.setdefault(locations[name], []).append(name)
    out: dict[str, torch.Tensor] = {}
    for f, names in sorted(by_file.items()):
        with safe_open(str(f), framework="pt", device="cpu") as handle:
            for name in names:  # check every shape before reading any data
                shape = tuple(handle.get_slice(name).get_shape())
                if shape != expected[name]:
                    raise CheckpointError(
                        f"tensor {name!r} in {f.name!r} has shape {list(shape)}, expected "
                        f"{list(expected[name])}",
                        hint="the weights do not match config.json",
                    )
            for name in names:
                t = handle.get_tensor(name)
                if not t.is_floating_point():
                    raise CheckpointError(
                        f"tensor {name!r} in {f.name!r} has dtype {t.dtype}, expected floating "
                        "point",
                        hint="quantized checkpoints are not supported",
                    )
                out[name] = t.to(device=device, dtype=dtype)
    return out


def _preview(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return f"[{shown}{f', ... ({len(names)} in all)' if len(names) > limit else ''}]"
