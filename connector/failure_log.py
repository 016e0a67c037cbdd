"""Rate-limited warnings for the connector's failed loads and saves. A failure is recomputed
(a load) or a later miss (a save), never fatal -- so without a log line a user sees only slower
requests. Each (what, reason) pair is logged at most once per ``interval_s``, with how many
were left unlogged since; every failure is counted where it happens, logged or not."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable


class FailureLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], float] = {}
        self._quiet: Counter[tuple[str, str]] = Counter()

    def failed(self, what: str, reason: str, blocks: int, detail: object = "") -> None:
        """``blocks`` blocks of a ``what`` ("load", "save") failed for ``reason``; ``detail``
        (an exception, say) says more."""
        key = (what, reason)
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._quiet[key] += 1
                return
            self._last[key] = now
            quiet = self._quiet.pop(key, 0)
        more = f" ({quiet} more since the last such line)" if quiet else ""
        text = f": {type(detail).__name__}: {detail}" if isinstance(detail, BaseException) else (
            f": {detail}" if detail else "")
        then = "they are recomputed" if what == "load" else "they are not stored (a later miss)"
        self._log.warning("kvstore %s of %d block(s) failed (reason %s)%s; %s%s",
                          what, blocks, reason, text, then, more)


__all__ = ["FailureLog"]
