"""The check of the engine's block ids that both sides of the connector run on a plan."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.errors import InvalidArgument


#: The last tuple of block ids that passed :func:`check_block_ids`, and the bound it passed:
#: a load's ids are checked by the scheduler side and again when the worker binds the plan --
#: the same immutable tuple, looked at once (a 32K-token hit has 2048).
_last_checked: tuple[tuple[int, ...] | None, int] = (None, 0)


def check_block_ids(block_ids: Sequence[int], num_blocks: int) -> None:
    global _last_checked
    last, bound = _last_checked
    if block_ids is last and num_blocks >= bound:
        return
    # C-speed passes; the loop only finds the culprit for the message
    n = len(block_ids)
    if n and (list(map(type, block_ids)).count(int) != n or min(block_ids) < 0
              or max(block_ids) >= num_blocks):
        for b in block_ids:
            if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < num_blocks:
                raise InvalidArgument(
                    f"block id {b!r} is not in [0, {num_blocks})",
                    hint="pass block ids the engine allocated from its KV cache",
                )
    if len(set(block_ids)) != n:
        raise InvalidArgument(f"a block id appears twice: {list(block_ids)}")
    if type(block_ids) is tuple:
        _last_checked = (block_ids, num_blocks)
