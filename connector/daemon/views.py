"""Views of a :class:`~connector.daemon.client.DaemonStore`: one of the daemon's tiers
(:class:`RemoteTier`) and one namespace (:class:`DaemonNamespace`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from connector.daemon.session_memory import SessionMemory
from kvstore.errors import InvalidArgument
from kvstore.results import LookupResult

if TYPE_CHECKING:
    from connector.daemon.client import DaemonStore


class RemoteTier:
    """One of the daemon's tiers: its name and size, and membership checks over the wire
    (``contains(tier name, keys)``: the client's). The staging tier also has the client's
    mappings (``memory``): of the slab (``slab``, ``slab_tensor``: read-only, loads copy from
    it) and of the session's staging area (``save_slab``, ``save_slab_tensor``: saves write
    it)."""

    def __init__(self, memory: SessionMemory,
                 contains: Callable[[str, Sequence[bytes]], tuple[list[bool], int]],
                 info: Any) -> None:
        self._memory = memory
        self._contains = contains
        self.name: str = info.name
        self.kind: str = info.kind
        self.capacity_pages: int = info.capacity_pages
        self.shared = False

    @property
    def slab(self) -> np.ndarray:
        return self._memory.slab_view()

    @property
    def slab_tensor(self) -> Any:
        return self._memory.tensor(self._memory.slab)

    @property
    def save_slab(self) -> np.ndarray:
        return self._memory.staging_view()

    @property
    def save_slab_tensor(self) -> Any:
        return self._memory.tensor(self._memory.stage)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        return self._contains(self.name, keys)[0]

    def count_leading(self, keys: Sequence[bytes]) -> int:
        return self._contains(self.name, keys)[1]


class DaemonNamespace:
    """One namespace's view of a :class:`DaemonStore` (see :meth:`DaemonStore.scoped`): its
    ``lookup``, ``lookup_async`` and ``delete`` are under ``namespace_id``; every other
    attribute is the client's, so it stands wherever the client does (a per-namespace
    :class:`~connector.inprocess.InProcessScheduler`). Closing it is a no-op: the client owns
    the connection."""

    def __init__(self, client: DaemonStore, namespace_id: bytes) -> None:
        self.client = client
        self.namespace_id = namespace_id

    def _own(self, namespace_id: bytes | None) -> bytes:
        """This view's namespace; a call that names another one is refused (a scheduler of
        one namespace passes its own, as it does to a store)."""
        if namespace_id is not None and namespace_id != self.namespace_id:
            raise InvalidArgument(
                f"namespace {namespace_id.hex()} asked of the view of {self.namespace_id.hex()}",
                hint="use DaemonStore.scoped(namespace_id) for another namespace")
        return self.namespace_id

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, local_only: bool = False,
               namespace_id: bytes | None = None) -> LookupResult:
        return self.client.lookup(keys, lease=lease, local_only=local_only,
                                  namespace_id=self._own(namespace_id))

    def lookup_async(self, keys: Sequence[bytes], *, lease: bool = False,
                     namespace_id: bytes | None = None) -> Future[LookupResult]:
        return self.client.lookup_async(keys, lease=lease, namespace_id=self._own(namespace_id))

    def delete(self, keys: Sequence[bytes], *, namespace_id: bytes | None = None) -> int:
        return self.client.delete(keys, namespace_id=self._own(namespace_id))

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)
