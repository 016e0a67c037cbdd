"""Tiers whose I/O waits for the test: a real tier whose ``write`` (and a disk's ``delete``)
blocks on ``gate`` and says that it started -- to show which thread waits for a slow tier."""

from __future__ import annotations

import threading
from typing import Any

from kvstore.tiers.disk import DiskTier
from kvstore.tiers.host import HostTier


class _GatedWrites:
    gate: threading.Event
    in_write: threading.Event
    writers: list[str]

    def _init_gate(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.in_write = threading.Event()
        self.writers = []  # the name of each thread that wrote

    def _wait_to_write(self) -> None:
        self.writers.append(threading.current_thread().name)
        self.in_write.set()
        assert self.gate.wait(30)


class GatedDisk(_GatedWrites, DiskTier):
    """A disk tier whose deletes and writes wait for ``gate`` (and say they started)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._init_gate()
        self.in_delete = threading.Event()
        self.deleted = threading.Event()  # a delete did its work (then waits for after_delete)
        self.after_delete = threading.Event()
        self.after_delete.set()

    def delete(self, keys: Any) -> int:
        self.in_delete.set()
        assert self.gate.wait(30)
        n = super().delete(keys)
        self.deleted.set()
        assert self.after_delete.wait(30)
        return n

    def write(self, metas: Any, pages: Any) -> Any:
        self._wait_to_write()
        return super().write(metas, pages)


class GatedHost(_GatedWrites, HostTier):
    """A host tier whose writes wait for ``gate``."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._init_gate()

    def write(self, metas: Any, pages: Any) -> Any:
        self._wait_to_write()
        return super().write(metas, pages)
