"""KVLayout: the shape of one page, and its fingerprint.

A page holds K and V of ``block_size`` tokens for *all* layers, page-first and contiguous::

    page[layer, kv, token, head, dim]      shape (num_layers, 2, block_size, num_kv_heads, head_dim)
                                            kv = 0 is K, kv = 1 is V

so ``page_bytes = num_layers * 2 * block_size * num_kv_heads * head_dim * itemsize``. Every tier
stores fixed-size pages of one layout, which makes every tier a slot allocator.

The fingerprint is ``xxh3_64`` over a canonical text of the fields and ``FORMAT_VERSION``; it is
part of every namespace, so pages of two layouts can never be confused.

``block_format`` names an engine's own per-layer block layout when pages hold an engine's blocks
verbatim rather than the layout above: the page is then ``num_layers`` opaque slices of
``page_bytes / num_layers`` bytes, slice ``l`` being the engine's block of layer ``l`` as it lies
in the engine's cache (e.g. ``"vllm-cpu"``: vLLM's CPU attention backend, per layer
``[num_kv_heads, block_size, 2 * head_dim]`` with K transposed inside the block; see
``connector/vllm/layout.py``). The empty default is the layout above. A non-empty format is part of the
fingerprint (``|fmt=<name>``), so pages of an engine's format never mix with others; the
default leaves the fingerprint as it always was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import xxhash

from kvstore.errors import InvalidArgument

if TYPE_CHECKING:
    import torch

#: Version of the page/key/record formats. Bumping it changes every fingerprint, hence every key.
FORMAT_VERSION = 1

_FORMAT_RE = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]{0,63})?")

#: dtype name -> bytes per element. Names are torch's (``torch.bfloat16`` -> ``"bfloat16"``).
DTYPE_SIZES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}


@dataclass(frozen=True, slots=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str = "bfloat16"
    block_format: str = ""
    page_bytes: int = field(init=False, repr=False, compare=False)
    fingerprint: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        dtype = _dtype_name(self.dtype)
        object.__setattr__(self, "dtype", dtype)
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(
                    f"KVLayout.{name} must be a positive int, got {value!r}",
                    hint=f"set layout.{name} to the model's value",
                )
        if self.block_size > 65535:
            raise InvalidArgument(
                f"KVLayout.block_size must be <= 65535 tokens, got {self.block_size}",
                hint="use a block size such as 16, 32 or 64",
            )
        if not isinstance(self.block_format, str) or not _FORMAT_RE.fullmatch(self.block_format):
            raise InvalidArgument(
                f"KVLayout.block_format must be '' or a name of letters, digits, '.', '_' and "
                f"'-' (at most 64), got {self.block_format!r}",
                hint="leave block_format empty for kvstore's own page layout",
            )
        nbytes = 1
        for dim in self.page_shape:
            nbytes *= dim
        object.__setattr__(self, "page_bytes", nbytes * DTYPE_SIZES[dtype])
        canonical = (
            f"kvstore-layout/v{FORMAT_VERSION}|L={self.num_layers}|H={self.num_kv_heads}"
            f"|D={self.head_dim}|B={self.block_size}|dtype={dtype}"
        ) + (f"|fmt={self.block_format}" if self.block_format else "")
        object.__setattr__(self, "fingerprint", xxhash.xxh3_64_digest(canonical.encode()))

    @property
    def page_shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)  # type: ignore[no-any-return]

    def describe(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "block_size": self.block_size,
            "dtype": self.dtype,
            "block_format": self.block_format,
            "page_bytes": self.page_bytes,
            "fingerprint": self.fingerprint.hex(),
        }


def _dtype_name(dtype: object) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_SIZES:
        raise InvalidArgument(
            f"unsupported KV dtype {dtype!r}",
            hint=f"use one of {sorted(DTYPE_SIZES)}",
        )
    return name
