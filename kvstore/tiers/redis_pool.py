"""Connections to one Redis server, and the pipelined exchange that every Redis tier call runs.

:class:`ServerPool` keeps idle connections to one server (host:port), its circuit breaker and
its counters. Connections are redis-py ``Connection`` objects — redis-py does the TCP/TLS
connect and the handshake (AUTH with an ACL user, SELECT) — whose socket is then driven by
:class:`~kvstore.tiers.redis_resp.RespIO`. A connection goes back to the idle list only after a
call consumed every reply it asked for; after any I/O error or timeout it is closed, because its
stream position is unknown.

:func:`run_exchange` sends one batch of commands to each server involved (all servers first,
then the replies are read round-robin), so a batch costs one round trip per server, not one per
key. Replies are consumed in order by a handler that may read a value straight into the caller's
buffer. Large-value reads keep at most ``window`` commands in flight per server, so a batch of
hundreds of pages never parks hundreds of MiB in the server's output buffer.

Failure handling, per server and per call:

* every wait for a server is bounded by ``wait_s``, and the whole call by ``deadline``;
* a connection failure (refused, reset, closed: a restarted server, a stale pooled socket) is
  retried up to ``retries`` times with exponential backoff, only for the commands not yet
  answered, and only while the deadline allows; a timeout is not retried (the budget is spent);
* the server's breaker records exactly one success or one failure per call that it let
  through, on every path — a call that raises something unexpected (a bug) is reported as a
  failure before the exception propagates, so a half-open breaker never waits for ever on a
  probe that is gone; while it is open the server is skipped at once (its items are reported
  as failed without any I/O);
* a reply that breaks the protocol (garbled, or of the wrong type) is a failure like a broken
  connection: the items are misses or refused puts, never an exception.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.exceptions

from kvstore.metrics import ServerStats
from kvstore.tiers.redis_breaker import CircuitBreaker
from kvstore.tiers.redis_resp import ProtocolError, RespIO

#: Errors that mean "the server did not answer properly": unreachable, timed out, a broken stream
#: (:class:`ProtocolError`), or a handshake that redis-py could not complete (a garbled or error
#: reply to CLIENT SETINFO, AUTH or SELECT: any ``RedisError``). Anything else is a bug and
#: propagates — after the exchange has reported it to the server's breaker.
NET_ERRORS: tuple[type[BaseException], ...] = (OSError, redis.exceptions.RedisError)
_NOT_RETRIED: tuple[type[BaseException], ...] = (TimeoutError, socket.timeout,
                                                 redis.exceptions.TimeoutError,
                                                 redis.exceptions.AuthenticationError,
                                                 redis.exceptions.InvalidResponse,
                                                 redis.exceptions.ResponseError,
                                                 ProtocolError)
#: Send what was built once this much is pending (an exchange may ask for less: ``flush``).
#: Measured on the 2-core machine (MAC on, 1 lane, against LMCache's client in the same
#: rounds): 256 KiB pages put 0.61-0.71 of LMCache when sent 4 MiB at a time, 0.39-0.52 when
#: sent one page at a time: each send wakes the server's thread, and fewer, larger sends cost
#: both processes less per byte.
FLUSH_BYTES = 4 << 20

log = logging.getLogger("kvstore.tiers.redis")


class Link:
    """One connected redis-py connection and the RESP I/O over its socket."""

    __slots__ = ("conn", "io")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.io = RespIO(conn._sock)


class ServerPool:
    """Idle connections, breaker and counters of one server. Logs one warning when the server
    becomes unavailable (its breaker opens) and one when it answers again (it closes)."""

    def __init__(
        self,
        name: str,
        factory: Callable[[], Any],
        breaker: CircuitBreaker,
        *,
        max_idle: int = 8,
        tier: str = "redis",
    ) -> None:
        self.name = name
        self.breaker = breaker
        self._factory = factory
        self._max_idle = max_idle
        self._tier = tier
        self._idle: list[Link] = []
        self._lock = threading.Lock()
        self.exchanges = 0
        self.failures = 0
        self.rejected = 0

    def succeeded(self) -> None:
        """A call let through by the breaker got every answer it asked for."""
        if self.breaker.success():
            log.warning("redis tier %r: server %s answers again; calls go to it again",
                        self._tier, self.name)

    def failed(self, exc: BaseException | None) -> None:
        """A call let through by the breaker ended without its answers (after its retries)."""
        self.failures += 1
        if self.breaker.failure():
            why = f"{type(exc).__name__}: {exc}" if exc is not None else "the call was abandoned"
            log.warning("redis tier %r: server %s is unavailable (%s); its calls fail at once "
                        "for %gs at a time, until it answers a probe", self._tier, self.name,
                        why, self.breaker.cooldown_s)

    def acquire(self, deadline: float, connect_timeout_s: float) -> Link:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        budget = min(connect_timeout_s, deadline - time.monotonic())
        if budget <= 0:
            raise TimeoutError("no time left to connect to redis")
        conn = self._factory()
        # Bound the TCP connect and the handshake (AUTH, SELECT) by what is left of the call.
        conn.socket_connect_timeout = budget
        conn.socket_timeout = budget
        try:
            conn.connect()
        except BaseException:
            conn.disconnect()
            raise
        return Link(conn)

    def release(self, link: Link) -> None:
        if link.io.pending():  # unread bytes: the stream is out of sync
            self.discard(link)
            return
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(link)
                return
        self.discard(link)

    @staticmethod
    def discard(link: Link) -> None:
        # Closing a broken socket may fail; it is gone either way.
        with contextlib.suppress(Exception):
            link.conn.disconnect()

    def drop_idle(self) -> None:
        """Close every idle connection (after one failed: the others are likely stale too)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for link in idle:
            self.discard(link)

    def stats(self) -> ServerStats:
        return ServerStats(self.name, self.breaker.state, self.exchanges, self.failures,
                           self.rejected, self.breaker.trips)

    def close(self) -> None:
        self.drop_idle()


@dataclass(slots=True)
class Exchange:
    """What one call sends and how it reads the answers.

    ``build(item)`` returns the buffers of item's command; ``handle(io, item)`` consumes exactly
    one reply and returns True when the item must be re-routed (a cluster MOVED/ASK answer).
    ``window``: most commands in flight per server (None: send everything at once).
    ``flush``: send once this many bytes are built (at most ``FLUSH_BYTES``).
    """

    build: Callable[[int], Sequence[Any]]
    handle: Callable[[RespIO, int], bool]
    window: int | None = None
    flush: int = FLUSH_BYTES


@dataclass(slots=True)
class Outcome:
    failed: list[int]  # items whose server was unavailable (no answer)
    moved: list[int]  # items answered with MOVED/ASK


class _Flow:
    __slots__ = ("pool", "link", "items", "sent", "done")

    def __init__(self, pool: ServerPool, link: Link, items: list[int]) -> None:
        self.pool = pool
        self.link = link
        self.items = items
        self.sent = 0
        self.done = 0


def run_exchange(
    groups: dict[ServerPool, list[int]],
    ex: Exchange,
    *,
    deadline: float,
    wait_s: float,
    retries: int,
    backoff_s: float,
    connect_timeout_s: float,
) -> Outcome:
    """Run one pipelined batch: ``groups`` maps each server to the items it owns. No single
    wait for a server lasts more than ``wait_s``; nothing runs past ``deadline``."""
    out = Outcome([], [])
    todo = groups
    owed: set[ServerPool] = set()  # let through by their breaker, outcome not reported yet
    try:
        for attempt in range(retries + 1):
            rnd = _Round(out, owed, deadline, backoff_s * (1 << attempt), attempt < retries)
            _attempt(todo, ex, rnd, owed, first=attempt == 0, wait_s=wait_s,
                     connect_timeout_s=connect_timeout_s)
            if not rnd.retry:
                break
            time.sleep(min(rnd.delay_s, max(0.0, deadline - time.monotonic())))
            todo = rnd.retry
    finally:
        for pool in owed:  # only when something unexpected was raised: never leave a probe open
            pool.failed(None)
    return out


def _attempt(
    todo: dict[ServerPool, list[int]],
    ex: Exchange,
    rnd: _Round,
    owed: set[ServerPool],
    *,
    first: bool,
    wait_s: float,
    connect_timeout_s: float,
) -> None:
    """One attempt at every server of ``todo``: send, then read the replies round-robin."""
    out, deadline = rnd.out, rnd.deadline
    flows: list[_Flow] = []
    try:
        for pool, items in todo.items():
            if first:
                if not pool.breaker.allow():
                    pool.rejected += 1
                    out.failed.extend(items)
                    continue
                owed.add(pool)
            pool.exchanges += 1
            try:
                link = pool.acquire(deadline, connect_timeout_s)
            except NET_ERRORS as exc:
                rnd.failed(pool, items, exc)
                continue
            link.io.deadline = deadline
            link.io.wait_s = wait_s
            flow = _Flow(pool, link, items)
            try:
                _pump(flow, ex)
            except NET_ERRORS as exc:
                pool.discard(link)
                rnd.failed(pool, items, exc)
                continue
            flows.append(flow)
        while flows:  # one reply from each server in turn
            for flow in list(flows):
                try:
                    item = flow.items[flow.done]
                    if ex.handle(flow.link.io, item):
                        out.moved.append(item)
                    flow.done += 1
                    if flow.sent < len(flow.items):
                        _pump(flow, ex)
                except NET_ERRORS as exc:
                    flows.remove(flow)
                    flow.pool.discard(flow.link)
                    rnd.failed(flow.pool, flow.items[flow.done :], exc)
                    continue
                if flow.done == len(flow.items):
                    flows.remove(flow)
                    flow.pool.release(flow.link)
                    owed.discard(flow.pool)
                    flow.pool.succeeded()
    finally:
        for flow in flows:  # only non-empty when a handler raised something unexpected
            flow.pool.discard(flow.link)


class _Round:
    """One attempt of an exchange: decides, per failed server, between retry and failure."""

    __slots__ = ("out", "owed", "deadline", "delay_s", "may_retry", "retry")

    def __init__(
        self, out: Outcome, owed: set[ServerPool], deadline: float, delay_s: float,
        may_retry: bool,
    ) -> None:
        self.out = out
        self.owed = owed
        self.deadline = deadline
        self.delay_s = delay_s
        self.may_retry = may_retry
        self.retry: dict[ServerPool, list[int]] = {}

    def failed(self, pool: ServerPool, items: list[int], exc: BaseException) -> None:
        pool.drop_idle()  # after one failure the other idle connections are likely stale too
        if (
            self.may_retry
            and not isinstance(exc, _NOT_RETRIED)
            and self.deadline - time.monotonic() > self.delay_s
        ):
            self.retry[pool] = items
        else:
            self.owed.discard(pool)
            pool.failed(exc)
            self.out.failed.extend(items)


def _pump(flow: _Flow, ex: Exchange) -> None:
    """Send the next commands of ``flow`` (up to its window)."""
    n = len(flow.items)
    stop = n if ex.window is None else min(n, flow.done + ex.window)
    parts: list[Any] = []
    pending = 0
    io = flow.link.io
    while flow.sent < stop:
        for p in ex.build(flow.items[flow.sent]):
            parts.append(p)
            pending += len(p) if isinstance(p, bytes) else memoryview(p).nbytes
        flow.sent += 1
        if pending >= ex.flush:
            io.send(parts)
            parts, pending = [], 0
    if parts:
        io.send(parts)


__all__ = [
    "FLUSH_BYTES", "NET_ERRORS", "Exchange", "Link", "Outcome", "ServerPool", "ServerStats",
    "run_exchange",
]
