"""Batch metadata for the paged forward pass, built and validated from per-sequence inputs.

A batch is a flattened run of new tokens from several sequences. Sequence ``s`` already has
``num_cached_tokens[s]`` tokens' K/V in the pool and brings ``num_new_tokens[s]`` new ones (a
prefill chunk, or one decode token), so its new tokens sit at positions
``cached .. cached + new - 1``. Token ``p`` of a sequence lives in the pool at::

    block  = block_table[p // block_size]       offset = p % block_size
    slot   = block * block_size + offset         (flat slot id, unique per pool)

    block_table:  [ b7 | b2 | b9 ]      block_size = 4, cached = 6, new = 3
    positions:     0 1 2 3 4 5 6 7 8
                   \\-cached--/ \\new/   -> new tokens go to (b2, 2), (b2, 3), (b9, 0)

:func:`build_batch` validates everything at this boundary (token ids, lengths, block ids, slot
collisions), so a bad request raises :class:`~kvstore.errors.InvalidArgument` before any tensor is
created and the KV pool is never touched.
"""

from __future__ import annotations

import array
import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from kvstore.errors import InvalidArgument
from runtime.config import ModelConfig

#: Which of a sequence's new tokens get logits: the last one, every one, or none (a prefill
#: chunk that does not finish the prompt).
LogitsMode = Literal["last", "all", "none"]


@dataclass(frozen=True, slots=True)
class SeqInput:
    """One sequence's part of a batch.

    ``token_ids``: the new tokens (>= 1). ``block_table``: the pool block ids holding this
    sequence's tokens in order; it must cover ``num_cached_tokens + len(token_ids)`` tokens.
    ``num_cached_tokens``: tokens whose K/V are already in those blocks (a prefix-cache hit, an
    earlier prefill chunk, or earlier decode steps).
    """

    token_ids: Sequence[int]
    block_table: Sequence[int]
    num_cached_tokens: int = 0
    logits: LogitsMode = "last"


@dataclass(frozen=True, slots=True)
class BatchMeta:
    """What attention backends need. ``S`` = num_seqs, ``T`` = num_tokens (all new tokens).

    Tensors (on the batch's device):
      positions      [T] int64   absolute position of each new token
      slot_blocks    [T] int64   pool block each new token's K/V is written to
      slot_offsets   [T] int64   offset inside that block
      block_tables   [S, max_blocks] int64  each row a sequence's block table, padded with 0
      logits_indices [num_logits] int64     rows of the flattened tokens that get logits
    Host-side tuples (length ``S``; ``query_start_loc`` has ``S + 1``): ``num_cached_tokens``,
    ``num_new_tokens``, ``num_blocks_used`` (blocks covering cached + new tokens),
    ``query_start_loc`` (sequence ``s``'s new tokens are rows ``[qsl[s], qsl[s+1])``),
    ``num_logits`` (logits rows per sequence, in order).
    """

    block_size: int
    positions: torch.Tensor
    slot_blocks: torch.Tensor
    slot_offsets: torch.Tensor
    block_tables: torch.Tensor
    logits_indices: torch.Tensor
    num_cached_tokens: tuple[int, ...]
    num_new_tokens: tuple[int, ...]
    num_blocks_used: tuple[int, ...]
    query_start_loc: tuple[int, ...]
    num_logits: tuple[int, ...]
    max_block_id: int

    @property
    def num_seqs(self) -> int:
        return len(self.num_new_tokens)

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]

    @property
    def seq_lens(self) -> tuple[int, ...]:
        """Tokens in the cache per sequence after this step: cached + new."""
        return tuple(c + n for c, n in zip(self.num_cached_tokens, self.num_new_tokens))


@dataclass(frozen=True, slots=True)
class Batch:
    """Model input: ``input_ids`` [T] int64, and the metadata of those tokens."""

    input_ids: torch.Tensor
    meta: BatchMeta


class _Slots:
    """Positions and pool slots of a batch's new tokens, in batch order: long chunks as numpy
    arrays, short ones (decode tokens) as Python ints gathered into one array at the end."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pos: list[int] = []
        self._blk: list[int] = []
        self._off: list[int] = []

    def add_list(self, positions: range, table: list[int], block_size: int) -> None:
        for p in positions:
            self._pos.append(p)
            self._blk.append(table[p // block_size])
            self._off.append(p % block_size)

    def add_array(self, pos: np.ndarray, blk: np.ndarray, off: np.ndarray) -> None:
        self._flush()
        self._parts.append((pos, blk, off))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._flush()
        if len(self._parts) == 1:
            return self._parts[0]
        pos, blk, off = zip(*self._parts)
        return np.concatenate(pos), np.concatenate(blk), np.concatenate(off)

    def _flush(self) -> None:
        if self._pos:
            self._parts.append(tuple(np.array(v, dtype=np.int64)  # type: ignore[misc, arg-type]
                                     for v in (self._pos, self._blk, self._off)))
            self._pos, self._blk, self._off = [], [], []


ID_OK: Any = object()  # first_bad_id's "all good" (None could be the offender)


def id_array(ids: Sequence[Any], limit: int) -> array.array[int] | None:
    """``ids`` as an array of unsigned 32-bit ids when every one is an integer (an ``int`` or a
    numpy integer; bools excluded) in ``[0, limit)``; None when some id is not (then
    :func:`first_bad_id` names it). In C: a per-element Python check of a 32K-token prompt
    costs milliseconds of TTFT (a type census alone ~1 ms). A bool passes the conversion as 0
    or 1, so the types of the ids that are 0 or 1 are looked at."""
    try:
        arr = array.array("I", ids)  # rejects non-integers and negative ids in C
    except (TypeError, OverflowError, ValueError):
        return None
    if arr.itemsize != 4:  # pragma: no cover - every supported platform has a 4-byte C int
        return None
    view = np.frombuffer(arr, dtype=np.uint32)
    if len(view) and (int(view.max()) >= limit
                      or (int(view.min()) <= 1 and _holds_bool(ids, view))):
        return None
    return arr


def _holds_bool(ids: Sequence[Any], view: np.ndarray) -> bool:
    """Whether one of ``ids`` that converted to 0 or 1 is a bool: only those are looked at (a
    prompt whose first token is a BOS of id 1 would pay a type census of every id otherwise)."""
    return any(type(ids[i]) is bool for i in np.flatnonzero(view <= 1).tolist())


def int32le(ids: array.array[int]) -> bytes:
    """The int32 little-endian bytes of ids from :func:`id_array` (all below 2^31: a
    vocabulary bound), as keys hash them (``kvstore.keys.token_bytes``)."""
    if sys.byteorder == "little":
        return ids.tobytes()
    swapped = array.array("I", ids)  # pragma: no cover - no supported platform is big-endian
    swapped.byteswap()  # pragma: no cover
    return swapped.tobytes()  # pragma: no cover


def first_bad_id(ids: Sequence[Any], limit: int) -> Any:
    """The first element of ``ids`` that is not an integer (an ``int`` or a numpy integer;
    bools excluded) in ``[0, limit)``, or ``ID_OK``. Checked in bulk first
    (:func:`id_array`); the loop runs only to find the offender."""
    if len(ids) >= 64 and id_array(ids, limit) is not None:  # short: the loop is cheaper
        return ID_OK
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < limit:
            return t
    return ID_OK


def build_batch(
    seqs: Sequence[SeqInput],
    config: ModelConfig,
    *,
    block_size: int,
    num_blocks: int,
    device: torch.device | str = "cpu",
) -> Batch:
    """Validate ``seqs`` against the model and a pool of ``num_blocks`` blocks of ``block_size``
    tokens, and build the flattened :class:`Batch`.

    Raises :class:`~kvstore.errors.InvalidArgument` (naming the sequence and the value) for: an
    empty batch or sequence, a token id outside ``[0, vocab_size)``, a negative cached count, a
    sequence longer than ``max_position_embeddings``, a block table too short for its tokens, a
    block id outside ``[0, num_blocks)`` or repeated in one table, and two new tokens of the
    batch writing the same pool slot.
    """
    if not seqs:
        raise InvalidArgument("a batch needs at least one sequence", hint="pass >= 1 SeqInput")
    for name, value in (("block_size", block_size), ("num_blocks", num_blocks)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgument(f"{name} must be a positive int, got {value!r}",
                                  hint="pass the KV pool's geometry")
    # every block table checked at once (one C conversion, not one per sequence: a batch-32
    # decode step has 32); the per-sequence check below runs only to name an offender
    tables_ok = len(seqs) > 1 and id_array(
        list(itertools.chain.from_iterable(seq.block_table for seq in seqs)), num_blocks) is not None
    ids: list[int] = []
    slots = _Slots()
    logits_rows: list[int] = []
    cached_t, new_t, used_t, qsl, nlog = [], [], [], [0], []
    for s, seq in enumerate(seqs):
        tokens, table, cached = list(seq.token_ids), list(seq.block_table), seq.num_cached_tokens
        if not tokens:
            raise InvalidArgument(f"sequence {s} has no new tokens", hint="drop it from the batch")
        if not isinstance(cached, int) or isinstance(cached, bool) or cached < 0:
            raise InvalidArgument(f"sequence {s}: num_cached_tokens must be an int >= 0, got "
                                  f"{cached!r}", hint="count the tokens already in the cache")
        bad = first_bad_id(tokens, config.vocab_size)
        if bad is not ID_OK:
            raise InvalidArgument(
                f"sequence {s}: token id {bad!r} is outside [0, {config.vocab_size})",
                hint="tokenize with the model's tokenizer",
            )
        total = cached + len(tokens)
        if total > config.max_position_embeddings:
            raise InvalidArgument(
                f"sequence {s} would hold {total} tokens, more than max_position_embeddings="
                f"{config.max_position_embeddings}",
                hint="truncate the prompt or stop generating earlier",
            )
        used = -(-total // block_size)
        if len(table) < used:
            raise InvalidArgument(
                f"sequence {s}: block table has {len(table)} blocks, {used} needed for {total} "
                f"tokens at block_size {block_size}",
                hint="allocate blocks before scheduling the tokens",
            )
        bad = ID_OK if tables_ok else first_bad_id(table, num_blocks)
        if bad is not ID_OK:
            raise InvalidArgument(f"sequence {s}: block id {bad!r} is outside [0, {num_blocks})",
                                  hint="use block ids from the KV pool")
        if len(set(table)) != len(table):
            raise InvalidArgument(f"sequence {s}: block table {table} repeats a block",
                                  hint="each block holds one slice of one sequence")
        start = len(ids)
        if total - cached >= 64:
            pos = np.arange(cached, total, dtype=np.int64)
            slots.add_array(pos, np.asarray(table, dtype=np.int64)[pos // block_size],
                            pos % block_size)
        else:  # a decode token or a short chunk: numpy's per-call cost would dominate
            slots.add_list(range(cached, total), table, block_size)
        ids.extend(tokens)
        mode = seq.logits
        if mode == "last":
            rows = [len(ids) - 1]
        elif mode == "all":
            rows = list(range(start, len(ids)))
        elif mode == "none":
            rows = []
        else:
            raise InvalidArgument(f"sequence {s}: logits must be 'last', 'all' or 'none', got "
                                  f"{mode!r}", hint="pick one of the three")
        logits_rows.extend(rows)
        cached_t.append(cached)
        new_t.append(len(tokens))
        used_t.append(used)
        qsl.append(len(ids))
        nlog.append(len(rows))
    # Within a sequence every slot is distinct (distinct positions, a table without repeats);
    # across sequences two new tokens must not write one slot.
    positions, slot_blocks, slot_offsets = slots.arrays()
    if len(seqs) > 1:
        flat = slot_blocks * block_size + slot_offsets
        uniq, counts = np.unique(flat, return_counts=True)
        if (counts > 1).any():
            code = int(uniq[counts > 1][0])
            where = np.flatnonzero(flat == code)[1]  # the second writer
            s = int(np.searchsorted(np.cumsum(new_t), where, side="right"))
            raise InvalidArgument(
                f"sequence {s}: slot (block {code // block_size}, offset {code % block_size}) is "
                "written twice in this batch",
                hint="sequences may share cached blocks, never blocks they write")
    width = max(len(seq.block_table) for seq in seqs)
    # rows filled in numpy: a torch.tensor and a slice assignment per row cost ~0.4 ms of a
    # batch-32 decode step on the H200's host
    table_rows = np.zeros((len(seqs), width), dtype=np.int64)
    for s, seq in enumerate(seqs):
        table_rows[s, : len(seq.block_table)] = seq.block_table
    tables = torch.from_numpy(table_rows)

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64).to(device)

    def joined(values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(values).to(device)

    meta = BatchMeta(
        block_size=block_size,
        positions=joined(positions),
        slot_blocks=joined(slot_blocks),
        slot_offsets=joined(slot_offsets),
        block_tables=tables.to(device),
        logits_indices=tensor(logits_rows),
        num_cached_tokens=tuple(cached_t),
        num_new_tokens=tuple(new_t),
        num_blocks_used=tuple(used_t),
        query_start_loc=tuple(qsl),
        num_logits=tuple(nlog),
        max_block_id=int(tables.max()),
    )
    return Batch(input_ids=tensor(ids), meta=meta)
