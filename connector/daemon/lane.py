"""The local lane: the daemon's hot control calls (lookups, leases, the staging path) as framed
protobuf messages on a Unix socket of their own, beside the gRPC socket.

Why: on one node a gRPC call costs 0.5-1.5 ms of thread hand-offs (the request iterator's
thread, the completion queues, the server's handler pool) -- more than the lookup of a
32K-token prompt itself (0.3 ms), and a scheduler makes such a call for every request it
admits; a load or a save makes four. On a plain socket a call is a write and a blocking read
on each side: tens of microseconds.

What travels: the gRPC service's own request and reply messages (one schema, one servicer).
A frame is a header -- the payload's length (u32 LE) and a kind (u8) -- then the payload.
Requests: kind 0 is the hello, whose payload is the session id: the connection then serves
that session only (the session id a request carries is ignored); kind ``i + 1`` is
``LANE_METHODS[i]``. Replies: kind 0 is OK with the reply message; any other kind is a gRPC
status code number with a UTF-8 message, raised as the kvstore error the one mapping of
:mod:`.errors` names.

Shared memory: after its hello a connection may send a MAP frame (kind ``MAP``; payload empty,
or ``PROBE``: the address of 16 random bytes in the client's memory and those bytes). The reply
is OK with ``SEGMENTS`` (slab bytes, staging bytes, staging rows, flags: u64 LE each) and, as
``SCM_RIGHTS`` ancillary data of the same message, two descriptors: the slab (sealed: it maps
read-only) and the session's staging area (:mod:`.shm`). Flag ``PEER_COPY``: the daemon read the
probe's bytes back from the process on the other end of the socket, so the session's saves and
loads may name pages in the client's memory (:mod:`.peer_memory`). A daemon with its
lane calls turned off (``daemon.lane = false``) still answers the hello and MAP on this socket.

Who may connect: the socket is 0600 beside the gRPC socket, as that one is, and the hello must
name a live session, which only the client holding its session stream knows. TCP clients
(other nodes) have no lane: they keep gRPC.

Failure: a call that finds its connection broken, or gets no reply by its deadline (the daemon
died, stopped, or is stalled), raises DaemonUnavailable and drops the connection (a late reply
would answer the next call). A lane the daemon refuses (none served, an unknown session)
raises :class:`LaneRefused`; all of a client's connections busy, a hello not answered in time,
or a daemon at its connection limit (for ``FULL_BACKOFF_S``, then the lane is tried again)
raises :class:`LaneBusy`. Either way the caller makes the call over gRPC (after a refusal,
every later call of the session).

Thread-safety: :class:`Lane` is shared by a client's threads; each call takes a connection of
its own (up to ``max_connections``).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from connector.daemon.errors import DaemonUnavailable, error_of_status
from connector.daemon.peer_memory import allow_tracer, peer_pid
from connector.proto import kvstore_daemon_pb2 as pb

HEADER = struct.Struct("<IB")
#: request kind of the hello; reply kind of success
HELLO = OK = 0
#: the calls the lane carries, numbered from 1 in this order (append only: the number is wire)
LANE_METHODS = ("Lookup", "Release", "Narrow", "Contains", "PrepareLoad", "CompleteLoad",
                "PrepareStore", "CompleteStore", "Abort", "CountDeclined")
METHOD_NUMBER = {name: i + 1 for i, name in enumerate(LANE_METHODS)}
#: the longest hello (a session id) a daemon reads
MAX_HELLO = 256
#: seconds a client makes its calls over gRPC after the daemon's lane refused a connection for
#: being at its limit (then it tries the lane again)
FULL_BACKOFF_S = 1.0
#: the status a daemon refuses a connection with at its limit (RESOURCE_EXHAUSTED)
_FULL = 8
#: request kind: send this session's shared-memory descriptors (outside the method numbers)
MAP = 255
#: the MAP reply's payload: slab bytes, staging bytes, staging rows, flags
SEGMENTS = struct.Struct("<QQQQ")
#: a MAP request's payload that asks for peer copy: an address in the client and its 16 bytes
PROBE = struct.Struct("<Q16s")
#: SEGMENTS flag: the daemon may copy to and from this client's memory
PEER_COPY = 1


@dataclass(frozen=True, slots=True)
class Mapping:
    """A session's shared memory as the lane handed it over (the caller owns the two fds)."""

    slab_fd: int
    slab_bytes: int
    staging_fd: int
    staging_bytes: int
    staging_rows: int
    #: the daemon may read and write this process's memory for the session (peer copy)
    peer_copy: bool


def message_types(name: str) -> tuple[Any, Any]:
    """The request and reply message classes of the service's method ``name``."""
    method = pb.DESCRIPTOR.services_by_name["KVStoreDaemon"].methods_by_name[name]
    return getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)


_REPLY = {name: message_types(name)[1] for name in LANE_METHODS}


class FrameTooLarge(Exception):
    """A frame's header announced more bytes than the reader takes; its payload is unread."""

    def __init__(self, size: int, kind: int, limit: int) -> None:
        super().__init__(f"a frame of {size} bytes; the limit is {limit}")
        self.size, self.kind, self.limit = size, kind, limit


def send_frame(sock: socket.socket, kind: int, payload: bytes | bytearray) -> None:
    header = HEADER.pack(len(payload), kind)
    sent = sock.sendmsg([header, payload])  # one system call for header and payload
    if sent < len(header) + len(payload):  # the kernel took a big frame in parts
        sock.sendall((header + bytes(payload))[sent:])


def _recv_exact(sock: socket.socket, n: int, *, at_start: bool = False,
                deadline: float | None = None) -> bytearray | None:
    """``n`` bytes; None when the peer closed the connection before the first one and
    ``at_start`` (between frames). ConnectionError when it closed mid-frame; TimeoutError
    once ``deadline`` (monotonic) has passed, however the bytes trickle in."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the frame did not arrive in time")
            sock.settimeout(left)
        k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0 and at_start:
                return None
            raise ConnectionError("the peer closed the connection in the middle of a frame")
        got += k
    return buf


def recv_frame(sock: socket.socket, limit: int, *,
               deadline: float | None = None) -> tuple[int, bytearray] | None:
    """The next frame as (kind, payload); None at a clean end of the connection. Raises
    FrameTooLarge (the payload left unread: :func:`discard` it or drop the connection),
    ConnectionError and OSError (socket.timeout included; TimeoutError once ``deadline``, a
    monotonic time for the whole frame, has passed)."""
    header = _recv_exact(sock, HEADER.size, at_start=True, deadline=deadline)
    if header is None:
        return None
    size, kind = HEADER.unpack(header)
    if size > limit:
        raise FrameTooLarge(size, kind, limit)
    payload = _recv_exact(sock, size, deadline=deadline) if size else bytearray()
    assert payload is not None
    return kind, payload


def discard(sock: socket.socket, n: int) -> None:
    """Read and drop ``n`` bytes (an oversized frame's payload) in bounded chunks."""
    chunk = bytearray(min(n, 1 << 20))
    while n:
        k = sock.recv_into(chunk, min(n, len(chunk)))
        if k == 0:
            raise ConnectionError("the peer closed the connection in the middle of a frame")
        n -= k


def map_segments(path: str, session_id: str, timeout_s: float, *,
                 peer_copy: bool = True) -> Mapping:
    """Ask the daemon at ``path`` for session ``session_id``'s shared memory and, with
    ``peer_copy``, whether it may copy to and from this process's memory (the probe). The
    caller owns (and closes) the two descriptors. Raises the kvstore error the daemon answered;
    DaemonUnavailable when it did not answer by ``timeout_s``."""
    fds: list[int] = []
    probe = np.frombuffer(os.urandom(PROBE.size), np.uint8).copy()  # alive until the reply
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.settimeout(timeout_s)
            sock.connect(path)
            send_frame(sock, HELLO, session_id.encode())
            hello = recv_frame(sock, 1 << 16)
            if hello is not None and hello[0] == OK:
                payload = b""
                if peer_copy:
                    allow_tracer(peer_pid(sock))
                    payload = PROBE.pack(probe.ctypes.data, probe[:16].tobytes())
                send_frame(sock, MAP, payload)
                # the descriptors ride on the reply's first bytes: one recvmsg takes them
                data, fds, _, _ = socket.recv_fds(sock, 1 << 12, 2)
                if len(data) >= HEADER.size:
                    want = HEADER.size + min(HEADER.unpack(data[: HEADER.size])[0], 1 << 12)
                    if len(data) < want:
                        data += _recv_exact(sock, want - len(data)) or b""
                _close_handshake(sock)
            else:
                data, fds = b"", []
        except (OSError, FrameTooLarge) as exc:
            for fd in fds:
                os.close(fd)
            raise DaemonUnavailable(f"the daemon's lane {path}: {exc}") from None
    if hello is None or hello[0] != OK:
        raise error_of_status(hello[0] if hello else 5, "the lane refused the session: " + (
            hello[1].decode("utf-8", "replace") if hello else "it closed the connection"))
    size, kind = HEADER.unpack(data[: HEADER.size]) if len(data) >= HEADER.size else (0, -1)
    if kind != OK or len(fds) != 2 or size != SEGMENTS.size or len(data) != HEADER.size + size:
        for fd in fds:
            os.close(fd)
        if kind > 0 and len(data) >= HEADER.size:
            raise error_of_status(kind, bytes(data[HEADER.size:]).decode("utf-8", "replace"))
        raise DaemonUnavailable(f"the daemon's lane {path} sent no shared memory")
    slab_bytes, staging_bytes, rows, flags = SEGMENTS.unpack(data[HEADER.size:])
    return Mapping(fds[0], slab_bytes, fds[1], staging_bytes, rows, bool(flags & PEER_COPY))


def _close_handshake(sock: socket.socket) -> None:
    """End a connection and wait until the daemon has ended its side too: it frees the
    connection's slot before it closes, so a lane call right after this one finds the slot free
    (with a daemon at its connection limit, the session's first call would be refused)."""
    try:
        sock.settimeout(min(sock.gettimeout() or 1.0, 1.0))  # a stalled daemon costs 1 s at most
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(4096):
            pass
    except OSError:
        pass  # gone already, or slow: the slot frees when the daemon reads the end


class LaneBusy(Exception):
    """Every connection this client may open is in a call: use gRPC for this one."""


class LaneRefused(LaneBusy):
    """The daemon serves this client no lane (none, too many connections, unknown session)."""


class Lane:
    """A client's connections to the daemon's lane at ``path`` for session ``session_id``.
    ``max_frame``: the longest reply read."""

    def __init__(self, path: str, session_id: str, *, max_frame: int,
                 max_connections: int = 4, connect_timeout_s: float = 2.0) -> None:
        self.path, self.session_id = path, session_id
        self.max_frame, self.max_connections = max_frame, max_connections
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = []
        self._open = 0  # connections open, idle or in a call
        self._closed = False
        self._full_until = 0.0  # monotonic: the daemon had no connection to spare until then

    def call(self, name: str, request: Any, timeout_s: float) -> Any:
        """The reply to ``request`` (a message of method ``name``, one of LANE_METHODS).
        Raises the kvstore error the daemon answered, DaemonUnavailable (broken or late),
        LaneBusy or LaneRefused (nothing was sent: make the call another way)."""
        sock = self._take()
        try:
            sock.settimeout(timeout_s)
            send_frame(sock, METHOD_NUMBER[name], request.SerializeToString())
            frame = recv_frame(sock, self.max_frame)
            if frame is None:
                raise ConnectionError("the daemon closed the lane")
        except (OSError, FrameTooLarge) as exc:  # socket.timeout and ConnectionError included
            self._drop(sock)
            raise DaemonUnavailable(f"the daemon's lane {self.path}: {exc}") from None
        self._give(sock)
        kind, payload = frame
        if kind != OK:
            raise error_of_status(kind, payload.decode("utf-8", "replace"))
        return _REPLY[name].FromString(bytes(payload))

    def _take(self) -> socket.socket:
        with self._lock:
            if self._closed:
                raise LaneRefused("the lane was closed")
            if self._idle:
                return self._idle.pop()
            if time.monotonic() < self._full_until:
                raise LaneBusy("the daemon's lane was full a moment ago")
            if self._open >= self.max_connections:
                raise LaneBusy(f"all {self.max_connections} lane connections are in calls")
            self._open += 1
        try:
            return self._connect()
        except BaseException:
            with self._lock:
                self._open -= 1
            raise

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.connect_timeout_s)
            sock.connect(self.path)
            send_frame(sock, HELLO, self.session_id.encode())
            frame = recv_frame(sock, self.max_frame)
        except TimeoutError:  # a stalled daemon: gRPC for this call, the lane again later
            sock.close()
            raise LaneBusy(f"the lane at {self.path} did not answer its hello") from None
        except (OSError, FrameTooLarge) as exc:
            sock.close()
            raise LaneRefused(f"no lane at {self.path}: {exc}") from None
        if frame is None or frame[0] != OK:
            sock.close()
            why = "it closed the connection" if frame is None else frame[1].decode("utf-8", "replace")
            if frame is not None and frame[0] == _FULL:  # other clients' connections: it passes
                with self._lock:
                    self._full_until = time.monotonic() + FULL_BACKOFF_S
                raise LaneBusy(f"the daemon's lane is full: {why}")
            raise LaneRefused(f"the daemon refused the lane: {why}")
        return sock

    def _give(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(sock)
                return
            self._open -= 1
        sock.close()

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._open -= 1
        sock.close()

    def close(self) -> None:
        """Close the idle connections now and each busy one when its call returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for sock in idle:
            sock.close()


__all__ = ["HEADER", "FrameTooLarge", "HELLO", "LANE_METHODS", "Lane", "LaneBusy", "LaneRefused", "MAP",
           "MAX_HELLO", "METHOD_NUMBER", "Mapping", "OK", "PEER_COPY", "PROBE", "SEGMENTS", "discard", "map_segments",
           "message_types", "recv_frame", "send_frame"]
