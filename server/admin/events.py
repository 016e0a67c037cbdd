"""What the dashboard shows of the store's events: recent removals and per-namespace counts,
read from the store's one event log (:mod:`kvstore.event_log`) on a thread of their own. (The
server-sent event stream reads the log itself, see :mod:`server.admin.routers.events`.)

Counts run from when the admin API started. A reader that falls behind the log's window (a
burst of more than ``store.event_log_events`` changes between two reads) skips what it missed:
the counts are then short by that much, and ``gaps`` says how often it happened. With the log
off (``store.event_log_events`` 0) there is nothing to count: ``log_off`` is set.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from dataclasses import dataclass

from kvstore.errors import InvalidArgument, KVStoreError, StoreClosed
from kvstore.event_log import CacheEvent
from kvstore.store import TieredStore

log = logging.getLogger("kvstore.admin")
#: how long one read of the log waits for an event (the thread's reaction time to close())
_WAIT_S = 0.5


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
        self.gaps = 0
        self._stop = threading.Event()
        try:
            start = store.read_events()
        except InvalidArgument:  # the log is off
            self.log_off = True
            self._thread: threading.Thread | None = None
            return
        self.log_off = False
        self._thread = threading.Thread(target=self._follow, args=(start.next_cursor, start.epoch),
                                        name="kvstore-admin-events", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * _WAIT_S + 1)

    def _follow(self, cursor: int, epoch: bytes) -> None:
        while not self._stop.is_set():
            try:
                batch = self.store.read_events(cursor, limit=1024, timeout_s=_WAIT_S, epoch=epoch)
            except StoreClosed:
                return
            except KVStoreError:  # not expected of an in-process store: say so, keep going
                log.exception("admin: reading the store's event log failed")
                self._stop.wait(_WAIT_S)
                continue
            if batch.gap:  # fell behind the log's window: go on from its oldest event
                self.gaps += 1
                cursor, epoch = batch.next_cursor, batch.epoch
                continue
            for ev in batch.events:
                self._count(ev)
            cursor = batch.next_cursor
            if batch.closed and not batch.events:
                return

    def _count(self, ev: CacheEvent) -> None:
        known = [n for n in ev.namespace_ids if n is not None]
        with self._lock:
            if ev.kind == "stored":
                self.stored.update(known)
            elif ev.kind in ("removed", "moved"):  # a page left the tier (moved: demoted)
                self.removed.update(known)
                self.recent.appendleft(Removal(ev.at, ev.tier, len(ev.keys),
                                               tuple(dict.fromkeys(known))))
