"""Argument checks shared by the store and its staging path: each names the bad argument."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.errors import InvalidArgument
from kvstore.keys import KEY_BYTES, BlockMeta, CheckedKeys
from kvstore.layout import KVLayout


def check_count(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidArgument(f"{name} must be an int >= {low}, got {value!r}")


def check_namespace(namespace_id: object) -> None:
    if not isinstance(namespace_id, bytes) or len(namespace_id) != KEY_BYTES:
        raise InvalidArgument(
            f"namespace id must be {KEY_BYTES} bytes, got {namespace_id!r:.60}",
            hint="pass Namespace.id",
        )


def check_metas(metas: Sequence[BlockMeta], layout: KVLayout) -> None:
    if isinstance(metas, (bytes, str)) or not isinstance(metas, Sequence):
        raise InvalidArgument(
            f"block identities must be a list or tuple of BlockMeta, got {type(metas).__name__}",
            hint="use BlockChain.metas()",
        )
    for m in metas:
        if not isinstance(m, BlockMeta):
            raise InvalidArgument(
                f"put takes BlockMeta identities, got {type(m).__name__}",
                hint="use BlockChain.metas()",
            )
        if len(m.token_ids) != 4 * layout.block_size or len(m.key) != KEY_BYTES:
            raise InvalidArgument(
                f"block {m.key.hex()} has {len(m.token_ids) // 4} tokens; layout block_size is "
                f"{layout.block_size}"
            )
        if not m.verify_chain():
            raise InvalidArgument(
                f"block {m.key.hex()}: key does not hash from its parent and tokens",
                hint="build identities with Namespace.chain(); never edit BlockMeta by hand",
            )


def check_keys(keys: Sequence[bytes]) -> None:
    # Two C-speed passes instead of a Python loop: lookups of 2K-key prompts are hot (counting
    # in a list is ~40 % cheaper than building a set of the types and one of the lengths).
    if type(keys) is CheckedKeys:
        return
    if isinstance(keys, (bytes, str)):
        raise InvalidArgument("keys must be a sequence of 16-byte keys, not a single key")
    if not isinstance(keys, (list, tuple)):
        raise InvalidArgument(
            f"keys must be a list or tuple of 16-byte keys, got {type(keys).__name__}",
            hint="pass BlockChain.keys (a generator can be read only once: make it a list)",
        )
    n = len(keys)
    if list(map(type, keys)).count(bytes) != n or list(map(len, keys)).count(KEY_BYTES) != n:
        bad = next(k for k in keys if type(k) is not bytes or len(k) != KEY_BYTES)
        raise InvalidArgument(
            f"block keys must be {KEY_BYTES}-byte bytes, got {bad!r:.60}",
            hint="compute keys with Namespace.chain()",
        )


__all__ = ["check_count", "check_keys", "check_metas", "check_namespace"]
