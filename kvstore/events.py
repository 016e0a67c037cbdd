"""Cache events: pages stored in or removed from a tier, for whoever watches the store (the
daemon's event stream, the admin API's server-sent events, a router that tracks where prefixes
live).

Listeners are called synchronously on the thread that changed the tier, outside the store lock,
so they must be quick (hand the event to a queue); an exception in a listener is logged and
never reaches the store's caller. With no listener, nothing is built.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoreEvent:
    kind: Literal["stored", "removed"]
    tier: str
    keys: tuple[bytes, ...]
    #: each key's namespace id, or None where it is not known cheaply (a shared tier's removal)
    namespace_ids: tuple[bytes | None, ...]


Listener = Callable[[StoreEvent], None]


class Listeners:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: tuple[Listener, ...] = ()

    def add(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def remove(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = tuple(x for x in self._listeners if x is not listener)

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def emit(self, kind: Literal["stored", "removed"], tier: str, keys: Sequence[bytes],
             namespace_ids: Sequence[bytes | None]) -> None:
        if not keys:
            return
        event = StoreEvent(kind, tier, tuple(keys), tuple(namespace_ids))
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # noqa: BLE001 - a watcher's failure is not the store's
                log.exception("store event listener %r failed", listener)


__all__ = ["Listener", "Listeners", "StoreEvent"]
