"""The daemon's tenancy rules for what a client stores (the rules in full:
:mod:`server.daemon.service`, "Tenancy"): a namespace id is 16 bytes, a stored block chains from
its own namespace, and one namespace holds at most its quota of staging-tier pages.
"""

from __future__ import annotations

from collections.abc import Callable

from kvstore.api import LocalStagingSlab
from kvstore.errors import InvalidArgument, QuotaExceeded
from kvstore.keys import KEY_BYTES, BlockMeta
from kvstore.store import TieredStore


def check_namespace(ns: object) -> bytes:
    if not isinstance(ns, bytes) or len(ns) != KEY_BYTES:
        raise InvalidArgument(
            f"namespace id must be {KEY_BYTES} bytes, got {len(ns) if isinstance(ns, bytes) else ns!r}",
            hint="send Namespace.id")
    return ns


def chained(store: TieredStore, ns: bytes, metas: list[BlockMeta],
            writing_under: Callable[[bytes], set[bytes]]) -> tuple[list[BlockMeta], int]:
    """The blocks of ``metas`` that chain from ``ns`` (see the module docstring), and how
    many were dropped for an unknown parent. Raises InvalidArgument for a block whose key
    or parent another namespace holds. ``writing_under(ns)``: the keys being written under
    ``ns`` (asked at most once, and only for a parent no tier holds)."""
    ok, seen, dropped = [], {ns}, 0
    writing: set[bytes] | None = None
    for m in metas:
        holder = store.namespace_of(m.key)
        if holder is not None and holder != ns:
            raise InvalidArgument(f"block {m.key.hex()} is held under another namespace")
        if m.parent not in seen:
            holder = store.namespace_of(m.parent)
            if holder is not None and holder != ns:
                raise InvalidArgument(
                    f"block {m.key.hex()} chains from a block of another namespace")
            if holder is None:
                writing = writing_under(ns) if writing is None else writing
                if m.parent not in writing:
                    dropped += 1
                    continue
        seen.add(m.key)
        ok.append(m)
    return ok, dropped


def check_quota(staging: LocalStagingSlab, quota: int | None, ns: bytes,
                metas: list[BlockMeta], writing_under: Callable[[bytes], set[bytes]]) -> None:
    """Raise QuotaExceeded if storing ``metas`` would put ``ns`` over ``quota`` pages of the
    staging tier (stored plus being written; None: no quota)."""
    if quota is None:
        return
    t = staging
    # the tier counts its pages per namespace: no scan of every page it holds per save
    held = t.pages_of(ns) + len(writing_under(ns))
    present = t.contains([m.key for m in metas]) if metas else []
    new = sum(1 for p in present if not p)
    if held + new > quota:
        raise QuotaExceeded(
            f"namespace {ns.hex()[:16]} holds {held} of its {quota} pages; {new} more asked",
            hint="raise daemon.namespace_quota, or delete pages of this namespace")
