"""Tokenizers: the :class:`Tokenizer` interface, and a byte-level tokenizer for demos and tests.

A checkpoint's own ``tokenizer.json`` is read by :mod:`runtime.tokenizer_hf`. The byte-level
tokenizer maps UTF-8 bytes to ids, plus three special ids:

::

    id 0 = PAD    id 1 = BOS    id 2 = EOS    id 3 + b = byte b (0..255)     vocab_size = 259

Ids of a larger model vocabulary that are not bytes decode to U+FFFD (a random-weight model may
emit them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kvstore.errors import InvalidArgument


class Tokenizer(Protocol):
    """Text <-> token ids. ``encode`` adds no special token unless asked: ``add_bos`` prepends the
    BOS id and ``add_eos`` appends the EOS id (each only where the tokenizer has one).
    ``decode`` drops special tokens unless ``skip_special=False``; ids it does not know decode to
    nothing or U+FFFD, never an error (a random-weight model emits any id of its vocabulary)."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str: ...


class ByteTokenizer:
    pad_id = 0
    bos_id = 1
    eos_id = 2
    byte_offset = 3
    vocab_size = 259

    def check_fits(self, model_vocab_size: int) -> None:
        """Raise InvalidArgument when this tokenizer's ids do not fit a model vocabulary."""
        if model_vocab_size < self.vocab_size:
            raise InvalidArgument(
                f"the byte tokenizer needs vocab_size >= {self.vocab_size}, the model has "
                f"{model_vocab_size}", hint="use a model config with a larger vocabulary",
            )

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise InvalidArgument(f"encode takes a str, got {type(text).__name__}")
        ids = [b + self.byte_offset for b in text.encode("utf-8")]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        out = bytearray()
        names = {self.pad_id: "<pad>", self.bos_id: "<s>", self.eos_id: "</s>"}
        for i in ids:
            if i in names:
                if not skip_special:
                    out += names[i].encode()
            elif self.byte_offset <= i < self.vocab_size:
                out.append(i - self.byte_offset)
            else:
                out += "\ufffd".encode()
        return out.decode("utf-8", errors="replace")


__all__ = ["ByteTokenizer", "Tokenizer"]
