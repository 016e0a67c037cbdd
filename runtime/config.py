"""ModelConfig: the shape of a Llama-family decoder, named presets, and HF ``config.json`` parsing.

Presets (:data:`MODEL_CONFIGS`):

- ``tiny``: 2 layers, hidden 64, 4 heads / 2 KV heads of 16, vocab 512, Llama-3 RoPE scaling with a
  64-token original context (so all three frequency bands of the scaling are exercised). Tests.
- ``small``: 4 layers, hidden 256, 8 heads / 2 KV heads of 32, vocab 32000. CPU demos.
- ``llama3-8b``: the real Llama-3-8B shape (bf16).

Every field is validated at construction; a bad value raises
:class:`~kvstore.errors.ConfigError` naming the field, the value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvstore.errors import ConfigError
from kvstore.layout import KVLayout

#: Model (weight and activation) dtypes the runtime supports, by torch name.
MODEL_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama-3 style RoPE frequency scaling (HF ``rope_type: "llama3"``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            _positive_number(f"rope_scaling.{name}", getattr(self, name))
        _positive_int(
            "rope_scaling.original_max_position_embeddings", self.original_max_position_embeddings
        )
        if self.high_freq_factor <= self.low_freq_factor:
            raise ConfigError(
                f"rope_scaling.high_freq_factor ({self.high_freq_factor}) must be greater than "
                f"rope_scaling.low_freq_factor ({self.low_freq_factor})",
                hint="use the model's values, e.g. low_freq_factor=1, high_freq_factor=4",
            )


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU, no biases)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in (
            "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
            "num_kv_heads", "head_dim", "max_position_embeddings",
        ):
            _positive_int(name, getattr(self, name))
        _positive_number("rope_theta", self.rope_theta)
        _positive_number("rms_norm_eps", self.rms_norm_eps)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})",
                hint="grouped-query attention shares each KV head among num_heads/num_kv_heads "
                "query heads",
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"head_dim must be even for RoPE, got {self.head_dim}", hint="use the model's value"
            )
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ConfigError(
                f"rope_scaling must be a RopeScaling or None, got {self.rope_scaling!r}",
                hint="build it with RopeScaling(factor=..., ...)",
            )
        if not isinstance(self.tie_word_embeddings, bool):
            raise ConfigError(
                f"tie_word_embeddings must be a bool, got {self.tie_word_embeddings!r}",
                hint="use true or false",
            )
        dtype = str(self.dtype).removeprefix("torch.")
        if dtype not in MODEL_DTYPES:
            raise ConfigError(
                f"dtype must be one of {MODEL_DTYPES}, got {self.dtype!r}",
                hint="set dtype to float32 (tests), bfloat16 or float16",
            )
        object.__setattr__(self, "dtype", dtype)

    @property
    def torch_dtype(self) -> Any:
        """The ``torch.dtype`` of weights, activations and the KV pool."""
        import torch

        return getattr(torch, self.dtype)

    def kv_layout(self, block_size: int) -> KVLayout:
        """The kvstore page layout of this model's KV cache with ``block_size``-token pages."""
        return KVLayout(
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            block_size=block_size,
            dtype=self.dtype,
        )

    def with_dtype(self, dtype: str) -> ModelConfig:
        """A copy of this config with another dtype."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        fields["dtype"] = dtype
        return ModelConfig(**fields)

    @classmethod
    def from_hf_config(cls, data: Mapping[str, Any], *, source: str = "config.json") -> ModelConfig:
        """Parse a Hugging Face Llama ``config.json`` (transformers 4.x or 5.x spelling).

        RoPE is read from ``rope_parameters`` (5.x) or ``rope_theta`` + ``rope_scaling`` (4.x);
        rope types ``default`` and ``llama3`` are supported. The dtype is ``dtype`` or
        ``torch_dtype``, float32 when absent (as transformers does). Raises
        :class:`~kvstore.errors.ConfigError` whose message starts with ``source`` and names the
        field.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{source}: expected a JSON object, got {type(data).__name__}",
                hint="point at a Hugging Face model directory's config.json",
            )
        return _parse_hf(data, source)


def _parse_hf(data: Mapping[str, Any], source: str) -> ModelConfig:
    def field(name: str, default: Any = ..., kind: type = int) -> Any:
        if name not in data or data[name] is None:
            if default is ...:
                raise ConfigError(
                    f"{source}: required field {name!r} is missing",
                    hint=f"add {name!r} to {source}",
                )
            return default
        value = data[name]
        ok = isinstance(value, bool) if kind is bool else (
            isinstance(value, (int, float)) and not isinstance(value, bool)
            and (kind is float or isinstance(value, int))
        )
        if not ok:
            raise ConfigError(
                f"{source}: field {name!r} must be {kind.__name__}, got {value!r}",
                hint=f"fix {name!r} in {source}",
            )
        return value

    model_type = data.get("model_type", "llama")
    if model_type != "llama":
        raise ConfigError(
            f"{source}: field 'model_type' is {model_type!r}; only 'llama' is supported",
            hint="use a Llama-family checkpoint",
        )
    for name, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if name in data and data[name] not in (want, None):
            raise ConfigError(
                f"{source}: field {name!r} is {data[name]!r}; the runtime supports only {want!r}",
                hint="use a standard Llama checkpoint",
            )
    num_heads = field("num_attention_heads")
    hidden = field("hidden_size")
    rope = data.get("rope_parameters")
    if rope is None:
        rope = dict(data.get("rope_scaling") or {})
        rope.setdefault("rope_theta", data.get("rope_theta", 10000.0))
    if not isinstance(rope, Mapping):
        raise ConfigError(
            f"{source}: field 'rope_parameters'/'rope_scaling' must be an object, got {rope!r}",
            hint="fix the RoPE fields in config.json",
        )
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling: RopeScaling | None = None
    if rope_type == "llama3":
        try:
            scaling = RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"{source}: llama3 rope scaling field is missing or malformed: {exc}",
                hint="it needs factor, low_freq_factor, high_freq_factor and "
                "original_max_position_embeddings",
            ) from None
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc.message}", hint=exc.hint) from None
    elif rope_type != "default":
        raise ConfigError(
            f"{source}: rope type {rope_type!r} is not supported",
            hint="supported rope types: 'default', 'llama3'",
        )
    theta = rope.get("rope_theta", 10000.0)
    dtype = data.get("dtype") or data.get("torch_dtype") or "float32"
    try:
        return ModelConfig(
            vocab_size=field("vocab_size"),
            hidden_size=hidden,
            intermediate_size=field("intermediate_size"),
            num_layers=field("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=field("num_key_value_heads", num_heads),
            head_dim=field("head_dim", hidden // num_heads if num_heads > 0 else 0),
            rope_theta=float(theta) if isinstance(theta, (int, float)) else theta,
            rope_scaling=scaling,
            rms_norm_eps=float(field("rms_norm_eps", 1e-6, float)),
            max_position_embeddings=field("max_position_embeddings", 2048),
            tie_word_embeddings=field("tie_word_embeddings", False, bool),
            dtype=str(dtype),
        )
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc.message}", hint=exc.hint) from None


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            f"{name} must be a positive int, got {value!r}", hint=f"set {name} to the model's value"
        )


def _positive_number(name: str, value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ConfigError(
            f"{name} must be a positive number, got {value!r}",
            hint=f"set {name} to the model's value",
        )


#: Named presets. ``tiny`` is float32 (tests compare against transformers in float32).
MODEL_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rope_theta=10000.0,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 64), rms_norm_eps=1e-5,
        max_position_embeddings=256, tie_word_embeddings=False, dtype="float32",
    ),
    "small": ModelConfig(
        vocab_size=32000, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8,
        num_kv_heads=2, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-5,
        max_position_embeddings=4096, tie_word_embeddings=True, dtype="float32",
    ),
    "llama3-8b": ModelConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192), rms_norm_eps=1e-5,
        max_position_embeddings=131072, tie_word_embeddings=False, dtype="bfloat16",
    ),
}


def get_model_config(name: str) -> ModelConfig:
    """The preset called ``name``; :class:`~kvstore.errors.ConfigError` lists the known ones."""
    try:
        return MODEL_CONFIGS[name]
    except KeyError:
        raise ConfigError(
            f"unknown model config {name!r}; known: {', '.join(sorted(MODEL_CONFIGS))}",
            hint="pick a preset name or load a checkpoint directory",
        ) from None
