""":class:`CallStream`: request/reply pairs as messages of one long-lived stream-stream call.

On one node the fixed cost of a gRPC unary call (a new call, its headers, a completion queue,
the server's hand-off to a handler thread) is about 0.5 ms on a small machine; a message on a
call that is already open costs about half of that. The daemon client sends its lookups this
way (``LookupStream``), the call a scheduler makes for every request it admits.

Contract: the server answers every request with exactly one reply, in order, and keeps the
stream open after a failed request (the failure is in the reply). A failure of the call itself
(the daemon went away, the channel closed, the deadline passed) kills the stream: :attr:`alive`
turns False and the caller opens another.

Deadlines: each :meth:`ask` has one. A watchdog thread checks it every ``poll_s`` and cancels the
call when the reply is late, so a caller waits at most ``timeout_s + poll_s`` and then gets the
call's CANCELLED status as a ``grpc.RpcError``.

Thread-safety: one :meth:`ask` at a time (the caller serializes them); :meth:`close` may be
called from any thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

_END = object()  # the request iterator's end: the client half-closes the call


class StreamEnded(Exception):
    """The call ended without failing (the server finished it: the daemon is stopping), or
    this stream was closed."""


class CallStream:
    """An open stream-stream call of ``method`` (a stub's multi-callable) on ``channel``."""

    def __init__(self, method: Callable[..., Any], channel: grpc.Channel,
                 metadata: Sequence[tuple[str, str]] = (), poll_s: float = 0.1) -> None:
        self.channel = channel
        self.alive = True
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._call = method(iter(self._requests.get, _END), metadata=metadata)
        self._deadline = 0.0  # monotonic deadline of the ask in flight; 0.0: none
        self._closed = threading.Event()
        threading.Thread(target=self._watch, args=(poll_s,), daemon=True,
                         name="kvstore-daemon-stream-watchdog").start()

    def ask(self, request: Any, timeout_s: float) -> Any:
        """Send ``request`` and return its reply. Raises grpc.RpcError when the call failed
        (cancelled at the deadline included) and StreamEnded when the server ended it or it was
        closed; the stream is then dead."""
        if not self.alive:
            raise StreamEnded("the stream was closed")
        self._deadline = time.monotonic() + timeout_s
        self._requests.put(request)
        try:
            return next(self._call)
        except StopIteration:
            self.close()
            raise StreamEnded("the server ended the stream") from None
        except BaseException:
            self.close()
            raise
        finally:
            self._deadline = 0.0

    def _watch(self, poll_s: float) -> None:
        while not self._closed.wait(poll_s):
            deadline = self._deadline
            if deadline and time.monotonic() > deadline:
                self.close()

    def close(self) -> None:
        """End the call (idempotent): an :meth:`ask` waiting on it raises."""
        if self._closed.is_set():
            return
        self.alive = False
        self._closed.set()
        self._requests.put(_END)
        self._call.cancel()


__all__ = ["CallStream", "StreamEnded"]
