""":class:`Session`: a :class:`~connector.daemon.client.DaemonStore`'s connection to the daemon --
the gRPC channel, the session stream, the local lane and the lookup stream -- through which
every call of the client goes, and which reconnects after an outage.

Control over gRPC -- on one node, the hot calls (lookups, leases, the staging path) over the
daemon's local lane (:mod:`.lane`), a plain Unix socket that costs a fraction of a gRPC call --
data through shared memory: after the handshake (the session stream's first message) the
client asks the lane socket it names for the session's segments (:func:`.lane.map_segments`,
held by :class:`~connector.daemon.session_memory.SessionMemory`).

Sessions and failure: the client keeps one session stream open; handles and leases live in it,
and the daemon frees them when the stream ends (this process died). When the daemon cannot be
reached, a call raises DaemonUnavailable at once (the client degrades, see
:mod:`.client`); the session reconnects on a thread of its own (at most every
``reconnect_interval_s``) once the client holds no open handle, mapping the restarted daemon's
new segments at the old addresses (see :mod:`.shm`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc

from connector.daemon.errors import DaemonUnavailable, error_of, error_of_status
from connector.daemon.lane import METHOD_NUMBER, Lane, LaneBusy, LaneRefused
from connector.daemon.session_memory import SessionMemory
from connector.daemon.stream import CallStream, StreamEnded
from connector.proto import kvstore_daemon_pb2 as pb
from connector.proto import kvstore_daemon_pb2_grpc as pb_grpc
from kvstore.errors import KVStoreError, StoreClosed

# the client's logger: its messages kept their name when they moved out of client.py
log = logging.getLogger("connector.daemon.client")

#: seconds of unary lookups after the daemon refused a lookup stream (its limit was reached)
_STREAM_RETRY_S = 30.0


class Session:
    """The connection of one client to the daemon at ``target`` (``unix:///path/kvstore.sock``,
    or ``host:port``). ``memory``: the client's shared-memory mappings, mapped (or remapped)
    at each connect. ``busy``: whether the client holds an open handle (no reconnect then:
    copies must not straddle a remap). ``on_session``: called after each connect, on the
    connecting thread (the client tells a new daemon what it told the old one). Nothing
    connects until :meth:`connect`."""

    def __init__(self, target: str, *, memory: SessionMemory, busy: Callable[[], bool],
                 on_session: Callable[[], None], token: str | None, timeout_s: float,
                 connect_timeout_s: float, reconnect_interval_s: float,
                 max_message_bytes: int, lane: bool) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.connect_timeout_s, self.reconnect_interval_s = connect_timeout_s, reconnect_interval_s
        self.md = (("authorization", f"Bearer {token}"),) if token else ()
        self._options = [("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes),
                         # a restarted daemon is found within a second, not after grpc's
                         # default backoff (up to two minutes)
                         ("grpc.initial_reconnect_backoff_ms", 100),
                         ("grpc.max_reconnect_backoff_ms", 1000)]
        self._memory = memory
        self._busy = busy
        self._on_session = on_session
        self._lock = threading.Lock()
        self.session_id = ""
        self.connected = False
        self.closed = False
        self._channel: grpc.Channel | None = None
        self._stream: Any = None
        self._reconnector: threading.Thread | None = None
        #: lookups go as messages of one open call (see lookup_call), opened at the first
        self.lookup_stream: CallStream | None = None
        #: the daemon's local lane (a Unix-socket daemon that serves one; ``lane=False``: never)
        self._use_lane = lane and self.target.startswith("unix:")
        self.lane: Lane | None = None
        self._max_message_bytes = max_message_bytes
        #: calls answered, by path: "lane", "grpc"
        self.calls: Counter[str] = Counter()
        self._lookup_lock = threading.Lock()  # the stream's one caller at a time
        self.stream_refused_until = 0.0  # monotonic: the daemon had no stream to spare

    # ----------------------------------------------------------------- connection

    def connect(self) -> Any:
        """Open a channel and a session; map (or remap) the slab. Returns the handshake."""
        channel = grpc.insecure_channel(self.target, options=self._options)
        try:
            self._wait_ready(channel)
            stub = pb_grpc.KVStoreDaemonStub(channel)
            stream = stub.OpenSession(pb.OpenSessionRequest(), metadata=self.md)
            info = self._handshake(stream)
            if self.closed:  # closed while the reconnector was connecting: keep nothing
                stream.cancel()
                raise DaemonUnavailable("this DaemonStore was closed")
        except grpc.FutureTimeoutError:
            channel.close()
            raise DaemonUnavailable(f"no kvstore daemon answers at {self.target}") from None
        except grpc.RpcError as err:
            channel.close()
            raise error_of(err) from None
        except DaemonUnavailable:
            channel.close()
            raise
        try:
            self._memory.map(info, self.connect_timeout_s)
        except KVStoreError:
            stream.cancel()
            channel.close()
            raise
        self._memory.slab_pages = info.slab_pages
        self._memory.page_bytes = info.layout.page_bytes
        old = self._channel
        self._channel, self._stub, self._stream = channel, stub, stream
        self.session_id = info.session_id
        old_lane, self.lane = self.lane, None
        if self._use_lane and info.lane_socket:
            self.lane = Lane(info.lane_socket, info.session_id,
                             max_frame=self._max_message_bytes)
        self.connected = True
        if old_lane is not None:
            old_lane.close()
        if old is not None:
            old.close()
        threading.Thread(target=self._watch_session, args=(stream,), daemon=True,
                         name="kvstore-daemon-session").start()
        self._on_session()
        return info

    def _wait_ready(self, channel: grpc.Channel) -> None:
        """Wait up to ``connect_timeout_s`` for ``channel`` to connect, in short slices, so a
        :meth:`close` meanwhile ends the wait (it joins the reconnector). Raises
        grpc.FutureTimeoutError."""
        ready = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + self.connect_timeout_s
        try:
            while True:
                try:
                    ready.result(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                    return
                except grpc.FutureTimeoutError:
                    if self.closed or time.monotonic() >= deadline:
                        raise
        finally:
            ready.cancel()

    def _handshake(self, stream: Any) -> Any:
        """The session stream's first message, within ``connect_timeout_s``. The stream lives
        as long as the session, so it takes no deadline; its handshake does: a channel can be
        READY (another client of this process holds the connection) while the daemon is
        stopped and answers nothing. A timer cancels the stream then; it is joined before this
        returns or raises, so no cancel ever races the caller's close of the channel."""
        answered = threading.Lock()

        def give_up() -> None:
            if answered.acquire(blocking=False):  # not once the handshake has arrived
                stream.cancel()

        timer = threading.Timer(self.connect_timeout_s, give_up)
        timer.daemon = True
        timer.start()
        failed: grpc.RpcError | None = None
        try:
            info = next(stream)
        except grpc.RpcError as err:
            failed, info = err, None
        except StopIteration:
            info = None
        timer.cancel()
        if not answered.acquire(blocking=False):  # the timer fired: its cancel is done or under way
            timer.join()
            raise DaemonUnavailable(f"the kvstore daemon at {self.target} did not open a "
                                    f"session within {self.connect_timeout_s} s")
        if failed is not None:
            raise failed
        if info is None:
            raise DaemonUnavailable(f"the daemon at {self.target} ended the session")
        return info

    def _watch_session(self, stream: Any) -> None:
        try:
            for _ in stream:
                pass
        except grpc.RpcError:
            pass
        if self._stream is stream:
            self.lost()

    def ensure(self) -> Any:
        """The stub of a live session; fails fast while the daemon is unreachable (the
        reconnector thread, never the caller, waits for it)."""
        if self.closed:  # the caller's mistake, not an outage: refused, never a quiet miss
            raise StoreClosed("this DaemonStore")
        if not self.connected:
            self.lost()
            raise DaemonUnavailable(f"the kvstore daemon at {self.target} is unreachable")
        return self._stub

    # ----------------------------------------------------------------- calls

    def call(self, name: str, request: Any, timeout_s: float | None = None) -> Any:
        reply = self._lane_call(name, request, timeout_s)
        if reply is not None:
            return reply
        self.calls["grpc"] += 1
        try:
            stub = self.ensure()
            if "session_id" in request.DESCRIPTOR.fields_by_name:
                request.session_id = self.session_id  # the session now (it may be a new one)
            return getattr(stub, name)(request, timeout=timeout_s or self.timeout_s,
                                       metadata=self.md)
        except grpc.RpcError as err:
            exc = error_of(err)
            if isinstance(exc, DaemonUnavailable):
                self.lost()
            raise exc from None

    def _lane_call(self, name: str, request: Any, timeout_s: float | None) -> Any | None:
        """The reply over the local lane; None when the call must go over gRPC (no lane, not a
        lane call, every lane connection busy, the daemon refused the lane). Raises what
        :meth:`call` raises."""
        lane = self.lane
        if lane is None or name not in METHOD_NUMBER:
            return None
        self.ensure()
        try:
            reply = lane.call(name, request, timeout_s or self.timeout_s)
        except LaneRefused as exc:
            log.info("the daemon's local lane is not open to this client (%s): using gRPC", exc)
            with self._lock:
                if self.lane is lane:
                    self.lane = None
            lane.close()
            return None
        except LaneBusy:
            return None
        except DaemonUnavailable:
            self.lost()
            raise
        self.calls["lane"] += 1
        return reply

    def lookup_call(self, req: Any) -> Any:
        """The reply to a LookupRequest: a message on the lookup stream (about half the cost of
        a unary call, see :mod:`.stream`), opened on the live channel when there is none; a
        unary call when another thread's lookup is using the stream, so a slow lookup (a
        remote tier) never holds up another. The local lane first, when there is one. Raises
        what :meth:`call` raises."""
        reply = self._lane_call("Lookup", req, None)
        if reply is not None:
            return reply
        if time.monotonic() < self.stream_refused_until or not self._lookup_lock.acquire(
                blocking=False):
            return self.call("Lookup", req)
        try:
            stub = self.ensure()
            stream = self.lookup_stream
            if stream is None or not stream.alive or stream.channel is not self._channel:
                if stream is not None:
                    stream.close()
                stream = self.lookup_stream = CallStream(stub.LookupStream, self._channel,
                                                         self.md)
            req.session_id = self.session_id  # the session now (it may be a new one)
            self.calls["grpc"] += 1
            try:
                r = stream.ask(req, self.timeout_s)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    # the daemon has as many lookup streams open as it allows: unary calls,
                    # and another try at a stream later
                    self.lookup_stream = None
                    self.stream_refused_until = time.monotonic() + _STREAM_RETRY_S
                    return self.call("Lookup", req)
                exc = error_of(err)
                if isinstance(exc, DaemonUnavailable):
                    self.lost()
                raise exc from None
            except StreamEnded:
                self.lost()
                raise DaemonUnavailable(f"the daemon at {self.target} ended the lookup stream") from None
        finally:
            self._lookup_lock.release()
        if r.HasField("error"):
            exc = error_of_status(r.error.code, r.error.message)
            if isinstance(exc, DaemonUnavailable):
                self.lost()
            raise exc
        return r

    # ----------------------------------------------------------------- outage, reconnect

    def lost(self) -> None:
        with self._lock:
            self.connected = False
            if self.closed or (self._reconnector is not None and self._reconnector.is_alive()):
                return
            self._reconnector = threading.Thread(target=self._reconnect, daemon=True,
                                                 name="kvstore-daemon-reconnect")
            self._reconnector.start()

    def _reconnect(self) -> None:
        """Reconnector thread: every ``reconnect_interval_s``, once no handle is open (copies
        must not straddle a remap), try to open a new session."""
        while not self.closed and not self.connected:
            time.sleep(self.reconnect_interval_s)
            if self._busy():
                continue
            try:
                self.connect()
            except KVStoreError as exc:
                log.debug("reconnect to %s failed: %s", self.target, exc)
                continue
            log.info("reconnected to the kvstore daemon at %s", self.target)

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a live session (after an outage); True if there is one."""
        deadline = time.monotonic() + timeout_s
        while not self.connected and time.monotonic() < deadline:
            if self._reconnector is None or not self._reconnector.is_alive():
                self.lost()
            time.sleep(0.02)
        return self.connected

    # ----------------------------------------------------------------- close

    def stop(self) -> None:
        """The first half of closing: no call or reconnect from now on; an attempt in flight
        is waited for."""
        self.closed = True
        with self._lock:
            reconnector = self._reconnector
        if reconnector is not None and reconnector is not threading.current_thread():
            # its attempt in flight ends within connect_timeout_s and then sees closed: until
            # then it may map the slab and open a channel, which must not outlive this close
            reconnector.join(self.connect_timeout_s + 1.0)

    def close(self) -> None:
        """The second half, after :meth:`stop`: end the session (the daemon frees what it
        still holds) and close the channel."""
        if self.lane is not None:
            self.lane.close()
        if self.lookup_stream is not None:
            self.lookup_stream.close()
        if self._stream is not None:
            self._stream.cancel()
        if self._channel is not None:
            self._channel.close()
