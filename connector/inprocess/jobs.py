"""What :class:`~connector.inprocess.worker.InProcessWorker` keeps of one load or save in flight:
the job its threads work on, and how far a load's layers are queued."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from connector.base import LoadSpec, SaveSpec
from kvstore.transfer import SaveBuffer
from kvstore.staging import LoadHandle, StoreHandle


class LayersQueued:
    """How many of a load's layers have their copies queued (on the CPU: done), in layer
    order; ``wait(layer)`` returns once that layer's are. One condition for every layer: a
    load used to build one Event per layer before its first copy."""

    __slots__ = ("_cond", "_n")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._n = 0

    def reach(self, n: int) -> None:
        with self._cond:
            if n > self._n:
                self._n = n
                self._cond.notify_all()

    def wait(self, layer: int) -> None:
        if self._n > layer:  # the usual case on a GPU: every layer queued before the forward
            return
        with self._cond:
            self._cond.wait_for(lambda: self._n > layer)


@dataclass(eq=False)
class LoadJob:
    spec: LoadSpec
    layers: LayersQueued
    gate: Any = None  # what the copies wait for (LayerTransfer.gate)
    ctx: Any = None  # the transfer's context once copies are queued
    handle: LoadHandle | None = None  # the store's pins on the host slots copied from
    done: threading.Event = field(default_factory=threading.Event)
    failed: list[int] = field(default_factory=list)
    reason: str = ""
    queued: tuple[int, str] | None = None  # (blocks loading, reason) once queued on the caller
    error: BaseException | None = None  # why it failed whole ("error")


@dataclass(eq=False)
class SaveJob:
    spec: SaveSpec
    handle: StoreHandle  # the host slots reserved for the pages host does not hold yet
    buf: SaveBuffer

