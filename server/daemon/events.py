"""Cache events (pages stored/removed per tier) fanned out to watchers, each through a bounded
queue: a watcher that reads too slowly loses events (counted and reported to it), never slows
the daemon."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CacheEvent:
    namespace_id: bytes
    kind: str  # "stored" | "removed"
    tier: str
    keys: tuple[bytes, ...]


class Watcher:
    def __init__(self, namespace_id: bytes, depth: int) -> None:
        self.namespace_id = namespace_id
        self.queue: queue.Queue[CacheEvent | None] = queue.Queue(depth)
        self.dropped = 0

    def next(self, timeout_s: float) -> CacheEvent | None:
        """The next event, or None after ``timeout_s`` (or once the hub closed)."""
        try:
            return self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return None


class EventHub:
    def __init__(self, depth: int = 1024) -> None:
        self._depth = depth
        self._lock = threading.Lock()
        self._watchers: set[Watcher] = set()
        self.closed = False

    def watch(self, namespace_id: bytes) -> Watcher:
        w = Watcher(namespace_id, self._depth)
        with self._lock:
            self._watchers.add(w)
        return w

    def unwatch(self, w: Watcher) -> None:
        with self._lock:
            self._watchers.discard(w)

    def publish(self, event: CacheEvent) -> None:
        if not event.keys:
            return
        with self._lock:
            targets = [w for w in self._watchers if w.namespace_id == event.namespace_id]
        for w in targets:
            try:
                w.queue.put_nowait(event)
            except queue.Full:
                w.dropped += 1

    def close(self) -> None:
        self.closed = True
        with self._lock:
            watchers = list(self._watchers)
        for w in watchers:
            try:
                w.queue.put_nowait(None)
            except queue.Full:
                pass
