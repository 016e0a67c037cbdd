"""The store's events (pages stored in and removed from tiers, :mod:`kvstore.events`) for the
admin API: fanned out to server-sent-event subscribers through bounded queues (a slow reader
loses events, counted, and never slows the store), with recent removals and per-namespace
counts kept for the dashboard."""

from __future__ import annotations

import asyncio
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


class Subscriber:
    """One SSE client, itself a store listener: the events of its namespace (all, for None)
    go to its event loop's queue. ``dropped``: events lost since the last one it was sent."""

    def __init__(self, loop: asyncio.AbstractEventLoop, namespace_id: bytes | None,
                 depth: int) -> None:
        self.loop = loop
        self.namespace_id = namespace_id
        self.queue: asyncio.Queue[StoreEvent | None] = asyncio.Queue(depth)
        self.dropped = 0

    def __call__(self, ev: StoreEvent) -> None:  # on the thread that changed the tier
        if self.namespace_id is not None:
            idx = [i for i, n in enumerate(ev.namespace_ids) if n == self.namespace_id]
            if not idx:
                return
            ev = StoreEvent(ev.kind, ev.tier, tuple(ev.keys[i] for i in idx),
                            tuple(ev.namespace_ids[i] for i in idx))
        self.post(ev)

    def post(self, ev: StoreEvent | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self._offer, ev)
        except RuntimeError:
            pass  # its loop is closed: the client is gone

    def _offer(self, event: StoreEvent | None) -> None:  # on the subscriber's loop
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1


class EventBroker:
    def __init__(self, store: TieredStore, depth: int = 1024, recent: int = 50) -> None:
        self.store = store
        self._depth = depth
        self._lock = threading.Lock()
        self._open: set[Subscriber] = set()  # to end their streams on close
        self.recent: deque[Removal] = deque(maxlen=recent)
        self.stored: Counter[bytes] = Counter()
        self.removed: Counter[bytes] = Counter()
        store.add_listener(self.on_event)

    def close(self) -> None:
        self.store.remove_listener(self.on_event)
        for sub in list(self._open):
            self.unsubscribe(sub)
            sub.post(None)

    def subscribe(self, namespace_id: bytes | None) -> Subscriber:
        sub = Subscriber(asyncio.get_running_loop(), namespace_id, self._depth)
        self._open.add(sub)
        self.store.add_listener(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.store.remove_listener(sub)
        self._open.discard(sub)

    def on_event(self, ev: StoreEvent) -> None:
        """The store's listener for the dashboard's counts: quick, on the thread that changed
        the tier."""
        known = [n for n in ev.namespace_ids if n is not None]
        with self._lock:
            (self.stored if ev.kind == "stored" else self.removed).update(known)
            if ev.kind == "removed":
                self.recent.appendleft(Removal(time.time(), ev.tier, len(ev.keys),
                                               tuple(dict.fromkeys(known))))
