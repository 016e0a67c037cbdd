"""Handles of the store's staging path (see :meth:`TieredStore.prepare_load` and
:meth:`TieredStore.prepare_store`): what a connector needs to copy straight out of, or into, the
staging tier's slab, and nothing of the store's internals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvstore.keys import BlockMeta
from kvstore.results import Lease


@dataclass(frozen=True, slots=True, eq=False)
class LoadHandle:
    """Pages of a prefix pinned in the staging tier's slab until ``complete_load``.

    ``slots[i]`` is the slab row holding ``keys[i]``; ``keys`` is the leading run of the keys
    asked for that the tier holds (possibly empty: a miss ends the run). ``unavailable``: why
    the store could not be asked at all (a daemon unreachable), "" when it answered."""

    id: int
    owner: int  # the store that issued it
    tier: str
    namespace_id: bytes
    keys: tuple[bytes, ...]
    slots: tuple[int, ...]
    lease: Lease | None
    slab: np.ndarray  # (capacity_pages, page_bytes) uint8, zero-copy
    unavailable: str = ""

    @property
    def num_blocks(self) -> int:
        return len(self.keys)


@dataclass(frozen=True, slots=True, eq=False)
class StoreHandle:
    """Slab rows reserved for new pages until ``complete_store`` or ``abort``.

    ``slots[i]`` is where the page of ``metas[i]`` must be written (every byte of it) before
    ``complete_store``. ``existing``: pages of the request the tier already held (or another
    open handle is writing), not reserved; ``refused``: pages no room could be made for.
    ``unavailable``: why the store could not be asked at all (a daemon unreachable; every
    page is refused then), "" when it answered."""

    id: int
    owner: int
    tier: str
    metas: tuple[BlockMeta, ...]
    slots: tuple[int, ...]
    existing: int
    refused: int
    slab: np.ndarray
    unavailable: str = ""

    @property
    def num_blocks(self) -> int:
        return len(self.metas)


def copy_in(handle: StoreHandle, pages: Sequence[np.ndarray]) -> None:
    """Write ``pages[i]`` (byte views, :func:`kvstore.buffers.page_views`) into the slot of
    ``handle.metas[i]``: what ``complete_store(pages=)`` does where no one copies for it."""
    for slot, page in zip(handle.slots, pages, strict=True):
        np.copyto(handle.slab[slot], page)


def copy_out(handle: LoadHandle, pages: Sequence[np.ndarray]) -> None:
    """Read the slot of ``handle.keys[i]`` into ``pages[i]``: ``complete_load(into=)``'s copy."""
    for slot, page in zip(handle.slots, pages, strict=True):
        np.copyto(page, handle.slab[slot])


__all__ = ["LoadHandle", "StoreHandle", "copy_in", "copy_out"]
