"""The store's mover: one background thread for the copies a caller must not wait for
(promotions after a get, ``selective`` and write-through copies down), in submission order.
A copy that fails is logged and lost -- a later miss, never the caller's error."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger("kvstore.store")


class Mover:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvstore-mover")
        self._lock = threading.Lock()
        self._pending: set[Future[Any]] = set()

    def __len__(self) -> int:
        """Copies queued or running."""
        return len(self._pending)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        fut = self._pool.submit(_guarded, fn, *args)
        with self._lock:
            self._pending.add(fut)
        fut.add_done_callback(self._done)

    def _done(self, fut: Future[Any]) -> None:
        with self._lock:
            self._pending.discard(fut)

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait for the copies queued so far; False if ``timeout_s`` passed first."""
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
        self._pool.shutdown(wait=True)


def _guarded(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - a background copy that fails loses a copy, no more
        log.exception("background copy %s failed", getattr(fn, "__name__", fn))


__all__ = ["Mover"]
