"""The staging capability: a tier whose pages live in numbered slots of one slab in this
process's memory (the host tier; in the daemon, a shared-memory segment every worker maps).

The store's staging API (:meth:`TieredStore.prepare_load` / ``prepare_store``) is built on it, and
connectors depend on this capability, never on a concrete tier: a load copies straight out of
pinned slots, a save copies (or DMAs) straight into reserved ones, with no bounce buffer.

Slot life cycle (every transition under the tier's lock, never during a copy)::

    free --reserve--> reserved --publish--> indexed (key -> slot) --delete/replace--> free
      ^                  |                        |                     (or zombie while pinned)
      +-----unreserve----+                        +--pin_leading/unpin: readers hold the bytes

* A reserved slot is invisible to readers and is never handed to another writer; its bytes are
  the reserver's to fill until it publishes or unreserves it.
* A pinned slot (reader count > 0) keeps its bytes: deleting or replacing its key unlinks it at
  once, but the slot returns to the free list only when the last reader unpins it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvstore.keys import BlockMeta


class SlabSlots(ABC):
    """Mixin of a tier that keeps its pages in the rows of one ``(capacity_pages, page_bytes)``
    uint8 slab. Every method is thread-safe."""

    @property
    @abstractmethod
    def slab(self) -> np.ndarray:
        """The slab itself, ``(capacity_pages, page_bytes)`` uint8, zero-copy."""

    @property
    def slab_tensor(self) -> Any:
        """:attr:`slab` as a torch tensor sharing its memory (pinned when the tier pinned it)."""
        import torch

        return torch.from_numpy(self.slab)

    @property
    def save_slab(self) -> np.ndarray:
        """Where a save writes the slots :meth:`reserve` hands it: the slab itself here. (Over
        the daemon a client's saves write its staging area instead, which the daemon copies
        into the slab: clients map the slab read-only.)"""
        return self.slab

    @property
    def save_slab_tensor(self) -> Any:
        """:attr:`save_slab` as a torch tensor."""
        return self.slab_tensor

    @abstractmethod
    def pin_leading(self, keys: Sequence[bytes], namespace_id: bytes) -> list[int]:
        """Pin the slots of the leading ``keys`` held under ``namespace_id`` (up to the first
        that is not) and return them. Each returned slot keeps its bytes until :meth:`unpin`."""

    @abstractmethod
    def unpin(self, slots: Sequence[int]) -> None:
        """Drop one reader pin from each slot (freeing slots unlinked meanwhile)."""

    @abstractmethod
    def reserve(self, n: int) -> list[int]:
        """Take up to ``n`` free slots (ascending, so a batch copies in few contiguous runs)."""

    @abstractmethod
    def publish(self, slots: Sequence[int], metas: Sequence[BlockMeta]) -> None:
        """Index reserved ``slots[i]`` under ``metas[i].key`` (replacing an older page of that
        key). The slots' bytes must be complete: readers see them from now on."""

    @abstractmethod
    def unreserve(self, slots: Sequence[int]) -> None:
        """Give reserved slots back unpublished."""

    @abstractmethod
    def pages_of(self, namespace_id: bytes) -> int:
        """How many published pages the tier holds under ``namespace_id``, exactly and at once
        (a per-namespace quota asks this on every save)."""


__all__ = ["SlabSlots"]
