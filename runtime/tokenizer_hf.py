"""A checkpoint's own tokenizer: its ``tokenizer.json``, read with the Hugging Face ``tokenizers``
library (imported only when a checkpoint has one).

``load_tokenizer(directory, vocab_size)`` returns an :class:`HFTokenizer`, or None when the
directory holds no ``tokenizer.json`` (the engine then takes and returns token ids). The BOS and
EOS ids come from the directory's ``config.json`` (``bos_token_id``; ``eos_token_id``, an id or
a list of ids, as Llama-3.1 has), not from the tokenizer's post-processor: :meth:`encode` adds
special tokens only when asked, so pieces of a conversation encode and concatenate cleanly.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runtime.errors import CheckpointError
from runtime.weights import read_json_object

TOKENIZER_FILE = "tokenizer.json"


class HFTokenizer:
    """:class:`runtime.tokenizer.Tokenizer` over a ``tokenizers.Tokenizer``."""

    def __init__(self, tokenizer: Any, *, bos_id: int | None, eos_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        #: Every EOS id of the checkpoint (pass them as ``SamplingParams.stop_token_ids``).
        self.eos_ids = eos_ids

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer knows, added tokens included."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of ``text``; BOS/EOS (from config.json) only when asked and known."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        bos = [self.bos_id] if add_bos and self.bos_id is not None else []
        eos = [self.eos_ids[0]] if add_eos and self.eos_ids else []
        return bos + ids + eos

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special))


def load_tokenizer(directory: str | Path, vocab_size: int) -> HFTokenizer | None:
    """The tokenizer of the checkpoint ``directory``, or None without a ``tokenizer.json``.

    Raises :class:`CheckpointError` naming the file when ``tokenizer.json`` cannot be read, when
    it knows more ids than the model's ``vocab_size``, or when config.json's ``bos_token_id`` /
    ``eos_token_id`` is not an id in ``[0, vocab_size)``."""
    root = Path(directory)
    path = root / TOKENIZER_FILE
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise CheckpointError(f"{str(path)!r} needs the 'tokenizers' package, which is missing",
                              hint="pip install tokenizers") from None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust core raises a bare Exception for bad JSON or models
        raise CheckpointError(
            f"cannot read {str(path)!r}: {exc}",
            hint="it must be a Hugging Face tokenizers file: re-save it with Tokenizer.save or "
            "the tokenizer's save_pretrained",
        ) from None
    size = int(tok.get_vocab_size(with_added_tokens=True))
    if size > vocab_size:
        raise CheckpointError(
            f"{str(path)!r} has {size} tokens, more than the model's vocab_size {vocab_size}",
            hint="the tokenizer belongs to another model: use the one saved with this checkpoint",
        )
    config_path = root / "config.json"
    raw = read_json_object(config_path)
    bos = _token_ids(raw, "bos_token_id", config_path, vocab_size)
    if len(bos) > 1:
        raise CheckpointError(f"{str(config_path)!r}: field 'bos_token_id' must be one token id, "
                              f"got {raw['bos_token_id']!r}", hint="fix it in config.json")
    return HFTokenizer(tok, bos_id=bos[0] if bos else None,
                       eos_ids=_token_ids(raw, "eos_token_id", config_path, vocab_size))


def _token_ids(raw: dict[str, Any], field: str, source: Path, vocab_size: int) -> tuple[int, ...]:
    """config.json's ``field`` as a tuple of ids (empty when absent or null)."""
    value = raw.get(field)
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise CheckpointError(
            f"{str(source)!r}: field {field!r} must be a token id or a list of them, got "
            f"{value!r}", hint=f"fix {field!r} in config.json")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise CheckpointError(
            f"{str(source)!r}: field {field!r} holds {bad[0]}, outside [0, {vocab_size})",
            hint=f"fix {field!r} in config.json")
    return tuple(ids)


__all__ = ["TOKENIZER_FILE", "HFTokenizer", "load_tokenizer"]
