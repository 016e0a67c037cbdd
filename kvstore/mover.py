"""The store's mover: the threads that move bytes a caller must not wait for.

Work runs on *lanes*, each one thread, in submission order within a lane: promotions after a
get and ``selective`` / write-through copies down share the ``copies`` lane; each tier's
cleaner (:mod:`kvstore.cleaner`, eviction with its write-back ahead of need) has a lane of its
own, so a slow tier below (a disk waiting on fsync, a stalled Redis) holds up only the cleaning
that writes into it, never the cleaning of the tiers above. A job that fails is logged and its
copy lost -- a later miss, never a caller's error.

The lanes run Python (the store's bookkeeping for each page they move) beside the engine's own
thread, and CPython hands the GIL to a waiting thread only when its holder blocks or after the
interpreter's switch interval (5 ms by default). An engine thread coming back from its GPU work
waited up to that long behind a cleaner's bookkeeping (H100, ``bench.writeback``, 32 pages of
write-back per step: engine time per step p99 1.7 ms against 0.5 ms bare; 0.4 ms with a 0.5 ms
interval). So when its first lane starts, the mover lowers the interval to
``switch_interval_ms`` (``store.switch_interval_ms``; never raises it; 0 leaves it alone).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger("kvstore.store")

#: the lane of background copies (promotions, selective and write-through copies down)
COPIES = "copies"
#: the interpreter's thread switch interval, in ms, once the mover runs (see the module docstring)
DEFAULT_SWITCH_INTERVAL_MS = 0.5


def lower_switch_interval(ms: float) -> None:
    """Make the interpreter's thread switch interval at most ``ms`` milliseconds (0: leave it)."""
    if ms > 0 and sys.getswitchinterval() > ms / 1e3:
        sys.setswitchinterval(ms / 1e3)


class Mover:
    def __init__(self, switch_interval_ms: float = DEFAULT_SWITCH_INTERVAL_MS) -> None:
        self._switch_interval_ms = switch_interval_ms
        self._lanes: dict[str, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()
        self._pending: set[Future[Any]] = set()
        self._closed = False

    def __len__(self) -> int:
        """Jobs queued or running, on every lane."""
        return len(self._pending)

    def submit(self, fn: Callable[..., Any], *args: Any, lane: str = COPIES) -> bool:
        """Queue ``fn(*args)`` on ``lane`` (started on first use). False, and nothing queued,
        once the mover is closed."""
        with self._lock:
            if self._closed:
                return False
            pool = self._lanes.get(lane)
            if pool is None:
                if not self._lanes:
                    lower_switch_interval(self._switch_interval_ms)
                pool = self._lanes[lane] = ThreadPoolExecutor(
                    1, thread_name_prefix=f"kvstore-mover-{lane}")
            fut = pool.submit(_guarded, fn, *args)
            self._pending.add(fut)
        fut.add_done_callback(self._done)
        return True

    def _done(self, fut: Future[Any]) -> None:
        with self._lock:
            self._pending.discard(fut)

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait for the jobs queued so far, and those they queue; False if ``timeout_s`` passed
        first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return True
            for fut in pending:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    fut.result(timeout=left)
                except TimeoutError:
                    return False

    def close(self) -> None:
        """Run what is queued, then stop every lane. Later submissions are refused."""
        with self._lock:
            self._closed = True
            lanes = list(self._lanes.values())
        for pool in lanes:
            pool.shutdown(wait=True)


def _guarded(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - a background job that fails loses a copy, no more
        log.exception("background job %s failed", getattr(fn, "__name__", fn))


__all__ = ["COPIES", "Mover"]
