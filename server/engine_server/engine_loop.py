"""The engine loop: one thread owns the :class:`~runtime.engine.Engine` (which is not
thread-safe) and drives it; HTTP handlers on the asyncio side talk to it through a queue.

::

    handler --submit--> inbox (queue.Queue) --> loop thread: add_request / step() ...
    handler <--events-- asyncio.Queue  <-- call_soon_threadsafe(put_nowait, event)

Events per request, in order: :class:`Accepted` (``add_request`` took it) or :class:`Failed`
(it raised: an ``InvalidArgument`` is the client's fault, anything else the engine's), then
:class:`Tokens` as they are sampled, then :class:`Finished` with the engine's RequestOutput.

Continuous batching is the engine's: every request submitted while others run is added
before the next ``step()``, and joins the running batch there.

Streaming reads engine state: ``Engine.step()`` returns only the requests that *finished* in
the step, so the tokens of still-running requests are read (never written) from
``engine.scheduler.running`` after each step -- see :func:`_progress`. A public per-step
output (vLLM's ``RequestOutput`` with ``finished=False``) would replace that.

Cancelling: a request whose client went away is aborted (``Engine.abort``) before the next
step: it leaves the queue or gives its blocks back at once (transfers in flight delay them), and
its "abort" output is dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvstore.errors import InvalidArgument
from runtime.engine import Engine
from runtime.request import RequestOutput
from runtime.sampling import SamplingParams

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Accepted:
    request_id: str


@dataclass(frozen=True, slots=True)
class Tokens:
    token_ids: list[int]


@dataclass(frozen=True, slots=True)
class Finished:
    output: RequestOutput


@dataclass(frozen=True, slots=True)
class Failed:
    error: Exception


Event = Accepted | Tokens | Finished | Failed


@dataclass(eq=False)
class RequestStream:
    """One request's way back to its handler: events land in ``events`` on ``loop``."""

    request_id: str
    prompt: Sequence[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    sent: int = 0  # output tokens delivered so far
    cancelled: bool = False

    def push(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the handler's event loop is closed (server shutting down)
            self.cancelled = True


@dataclass(frozen=True, slots=True)
class _Cancel:
    request_id: str


_STOP = object()


class EngineLoop:
    """Owns ``engine`` on a daemon thread from :meth:`start` to :meth:`stop`."""

    def __init__(self, engine: Engine, *, idle_poll_s: float = 0.05) -> None:
        self.engine = engine
        self._inbox: queue.Queue[object] = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._ids = itertools.count()
        self._idle_poll_s = idle_poll_s
        self._thread: threading.Thread | None = None
        #: the exception that stopped the loop (the engine failed), or None
        self.error: BaseException | None = None
        #: requests whose client went away before they finished (they ran on; see module doc)
        self.num_aborted = 0  # requests ended early: their clients went away
        #: finished requests, for tests and /health
        self.num_finished = 0
        #: callbacks on every finished output (metrics); run on the loop thread
        self.on_finished: list[Callable[[RequestOutput], None]] = []

    # ----------------------------------------------------------------- asyncio side

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop (requests in flight get :class:`Failed`), then close the engine."""
        if self._thread is not None:
            self._inbox.put(_STOP)
            self._thread.join(timeout_s)
            self._thread = None
        self.engine.close()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> RequestStream:
        """Queue a request; its events arrive on the returned stream's ``events``. Must be
        called from inside a running asyncio loop (the handler's)."""
        if not self.alive:
            raise RuntimeError("the engine loop is not running")
        stream = RequestStream(f"cmpl-{next(self._ids)}", prompt, params,
                               asyncio.get_running_loop())
        self._inbox.put(stream)
        return stream

    def cancel(self, request_id: str) -> None:
        """The client went away: deliver nothing more to it (thread-safe, idempotent)."""
        self._inbox.put(_Cancel(request_id))

    # ----------------------------------------------------------------- engine thread

    def held_blocks(self) -> int:
        """Pool blocks held by requests (not free, not merely cached for reuse)."""
        pool = self.engine.pool
        return pool.num_blocks - pool.num_free - pool.num_evictable

    def _busy(self) -> bool:
        # delayed frees (blocks waiting on connector saves) are reaped only by step()
        return self.engine.has_unfinished() or self.engine.num_pending_frees > 0

    def _run(self) -> None:
        try:
            while True:
                if not self._take_commands():
                    break
                if self._busy():
                    self._publish(self.engine.step())
        except BaseException as exc:  # the engine is in an unknown state: fail everyone
            _log.exception("engine loop failed")
            self.error = exc
            self._fail_all(RuntimeError(f"engine failed: {exc}"))
            return
        self._fail_all(RuntimeError("the server is shutting down"))

    def _fail_all(self, error: Exception) -> None:
        """Answer every tracked request, and every one still in the inbox (its handler
        waits for an answer)."""
        for stream in self._streams.values():
            stream.push(Failed(error))
        self._streams.clear()
        while True:
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, RequestStream):
                cmd.push(Failed(error))

    def _take_commands(self) -> bool:
        """Handle everything in the inbox (waiting for one when the engine is idle); False
        on stop."""
        cmds: list[object] = []
        try:
            if not self._busy():
                cmds.append(self._inbox.get(timeout=self._idle_poll_s))
            while True:
                cmds.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        for cmd in cmds:
            if cmd is _STOP:
                return False
            if isinstance(cmd, _Cancel):
                stream = self._streams.get(cmd.request_id)
                if stream is not None and not stream.cancelled:
                    stream.cancelled = True
                    if self.engine.abort(cmd.request_id):
                        self.num_aborted += 1
            elif isinstance(cmd, RequestStream):
                self._add(cmd)
        return True

    def _add(self, stream: RequestStream) -> None:
        try:
            self.engine.add_request(stream.prompt, stream.params, request_id=stream.request_id)
        except InvalidArgument as exc:  # nothing was queued (add_request's contract)
            stream.push(Failed(exc))
            return
        self._streams[stream.request_id] = stream
        stream.push(Accepted(stream.request_id))

    def _publish(self, finished: list[RequestOutput]) -> None:
        for rid, new in _progress(self.engine, self._streams):
            stream = self._streams[rid]
            stream.sent += len(new)
            if not stream.cancelled:
                stream.push(Tokens(new))
        for out in finished:
            self.num_finished += 1
            for cb in self.on_finished:
                try:
                    cb(out)
                except Exception:  # a metrics bug must not stop the engine
                    _log.exception("on_finished callback failed")
            ended = self._streams.pop(out.request_id, None)
            if ended is None or ended.cancelled:
                continue
            rest = out.output_token_ids[ended.sent:]
            if rest:
                ended.push(Tokens(rest))
            ended.push(Finished(out))


def _progress(engine: Engine, streams: dict[str, RequestStream]) -> list[tuple[str, list[int]]]:
    """New output tokens of the still-running requests since they were last delivered.
    Read-only access to the scheduler's running list (see the module docstring): output
    tokens are only ever appended, preemption keeps them, so a count is enough."""
    new: list[tuple[str, list[int]]] = []
    for req in engine.scheduler.running:
        stream = streams.get(req.request_id)
        if stream is None:
            continue
        have = len(req.token_ids) - req.num_prompt_tokens
        if have > stream.sent:
            new.append((req.request_id,
                        req.token_ids[req.num_prompt_tokens + stream.sent:].tolist()))
    return new
