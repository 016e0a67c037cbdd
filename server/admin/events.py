"""What the dashboard shows of the store's events (:mod:`kvstore.events`): recent removals and
per-namespace counts. (The server-sent event stream reads the store's event log itself, see
:mod:`server.admin.routers.events`.)"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

from kvstore.events import StoreEvent
from kvstore.store import TieredStore


@dataclass(frozen=True, slots=True)
class Removal:
    at: float
    tier: str
    pages: int
    namespace_ids: tuple[bytes, ...]


class EventBroker:
    def __init__(self, store: TieredStore, recent: int = 50) -> None:
        self.store = store
        self._lock = threading.Lock()
        self.recent: deque[Removal] = deque(maxlen=recent)
        self.stored: Counter[bytes] = Counter()
        self.removed: Counter[bytes] = Counter()
        store.add_listener(self.on_event)

    def close(self) -> None:
        self.store.remove_listener(self.on_event)

    def on_event(self, ev: StoreEvent) -> None:
        """The store's listener for the dashboard's counts: quick, on the thread that changed
        the tier."""
        known = [n for n in ev.namespace_ids if n is not None]
        with self._lock:
            (self.stored if ev.kind == "stored" else self.removed).update(known)
            if ev.kind == "removed":
                self.recent.appendleft(Removal(time.time(), ev.tier, len(ev.keys),
                                               tuple(dict.fromkeys(known))))
