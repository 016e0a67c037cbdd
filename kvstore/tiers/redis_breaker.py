"""A circuit breaker per Redis server: a dead or hung server costs one timeout, then nothing.

States and transitions (``failures`` and ``cooldown_s`` come from the tier's settings)::

    closed ──(failures consecutive failed calls)──> open
    open ──(cooldown_s passed; the next call is let through as the probe)──> half_open
    half_open ──probe succeeds──> closed          half_open ──probe fails──> open (cooldown again)

While ``open`` — and while a probe is in flight in ``half_open`` — :meth:`allow` answers False at
once, so callers return misses / refuse puts without touching the network. A call that is let
through must end in exactly one :meth:`success` or :meth:`failure`. A "failure" is the server
being unreachable, timing out or breaking the protocol; error *replies* (out of memory, MOVED)
are answers, not failures. Thread-safe.
"""

from __future__ import annotations

import threading
import time

from kvstore.metrics import BreakerState


class CircuitBreaker:
    def __init__(self, failures: int, cooldown_s: float) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._consecutive = 0
        self._opened_at = 0.0
        self._probing = False
        #: How many times the breaker opened (for stats).
        self.trips = 0

    @property
    def state(self) -> BreakerState:
        with self._lock:
            if self._state == "open" and time.monotonic() - self._opened_at >= self.cooldown_s:
                return "half_open"
            return self._state

    def allow(self) -> bool:
        """Whether a call may go to the server now (False: fail fast)."""
        with self._lock:
            if self._state == "closed":
                return True
            if self._state == "open":
                if time.monotonic() - self._opened_at < self.cooldown_s:
                    return False
                self._state = "half_open"
            if self._probing:
                return False
            self._probing = True
            return True

    def success(self) -> bool:
        """Record a call that succeeded; True when this closed an open (or half-open) breaker."""
        with self._lock:
            closed = self._state != "closed"
            self._state = "closed"
            self._consecutive = 0
            self._probing = False
            return closed

    def failure(self) -> bool:
        """Record a call that failed; True when this opened a closed breaker (a failed probe
        re-opens a half-open one: not a new trip)."""
        with self._lock:
            self._consecutive += 1
            tripped = False
            if self._state == "half_open" or self._consecutive >= self.failures:
                if self._state != "open":
                    self.trips += 1
                    tripped = self._state == "closed"
                self._state = "open"
                self._opened_at = time.monotonic()
            self._probing = False
            return tripped


__all__ = ["BreakerState", "CircuitBreaker"]
