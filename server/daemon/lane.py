"""The daemon's end of the local lane (the protocol: :mod:`connector.daemon.lane`): a Unix
socket (0600) and one thread per connection, each answering its session's calls through the
same :class:`~server.daemon.servicer.Servicer` methods gRPC calls.

A connection serves the session its hello names, and ends when that session does; one that
sends no hello within ``hello_timeout_s`` is closed. A MAP frame is answered with the session's
shared-memory descriptors (:meth:`DaemonService.segments`); with ``calls`` off (``daemon.lane =
false``) that is all the socket answers.

Bad input gets a typed error reply and the connection goes on: an unknown call number or a
message that does not parse (INVALID_ARGUMENT), a frame over ``max_frame`` bytes (read and
dropped; RESOURCE_EXHAUSTED, as gRPC answers a message over its limit). A hello that
names no live session, or one past ``max_connections``, is refused and the connection closed.

Stop: :meth:`LaneServer.close` stops accepting and shuts the read side of every connection, so
a call in progress still sends its reply and the connection then ends.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from connector.daemon.errors import message_of, status_of
from connector.daemon.peer_memory import peer_pid
from connector.daemon.lane import (
    HELLO,
    LANE_METHODS,
    MAP,
    MAX_HELLO,
    OK,
    PEER_COPY,
    PROBE,
    SEGMENTS,
    FrameTooLarge,
    HEADER,
    discard,
    message_types,
    recv_frame,
    send_frame,
)
from kvstore.errors import ConfigError, KVStoreError
from server.daemon.servicer import Servicer

log = logging.getLogger("kvstore.daemon")
_REQUEST = {i + 1: (name, message_types(name)[0]) for i, name in enumerate(LANE_METHODS)}
#: an oversized request's status, as gRPC answers one over max_message_bytes
_TOO_LARGE = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


def _status(code: grpc.StatusCode, message: str) -> tuple[int, bytes]:
    return code.value[0], message.encode()


class LaneServer:
    def __init__(self, path: Path, servicer: Servicer, *, max_frame: int,
                 max_connections: int, hello_timeout_s: float = 5.0, calls: bool = True) -> None:
        self.path, self.servicer = path, servicer
        #: answer the service's calls (else only hello and MAP)
        self.calls = calls
        self.max_frame, self.max_connections = max_frame, max_connections
        #: a connection that names no session within this long is closed (it holds a slot)
        self.hello_timeout_s = hello_timeout_s
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._closed = False
        path.unlink(missing_ok=True)  # left by a daemon that died (the caller owns the socket dir)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # created 0600
        try:
            self._listener.bind(str(path))
        except OSError as exc:
            self._listener.close()
            raise ConfigError(f"cannot listen on the lane socket {path}: {exc}",
                              hint="shorten daemon.socket, or set daemon.lane = false") from None
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._listener.listen(128)
        self._acceptor = threading.Thread(target=self._accept, daemon=True,
                                          name="kvstore-lane-accept")
        self._acceptor.start()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                full = len(self._conns) >= self.max_connections
                if not (full or self._closed):
                    self._conns.add(conn)
            if full or self._closed:
                self._refuse(conn, grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"{self.max_connections} lane connections are open; use gRPC")
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="kvstore-lane").start()

    @staticmethod
    def _refuse(conn: socket.socket, code: grpc.StatusCode, message: str) -> None:
        try:
            conn.settimeout(1.0)
            send_frame(conn, *_status(code, message))
        except OSError:
            pass
        conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            session_id = self._hello(conn)
            while session_id is not None:
                try:
                    frame = recv_frame(conn, self.max_frame)
                except FrameTooLarge as exc:
                    discard(conn, exc.size)
                    send_frame(conn, _TOO_LARGE, (
                        f"a lane request of {exc.size} bytes; the limit is {exc.limit} "
                        "(daemon.max_message_bytes)").encode())
                    continue
                if frame is None:
                    return
                if not self.servicer.service.has_session(session_id):
                    # the session ended (its stream broke): so does its lane
                    send_frame(conn, *_status(grpc.StatusCode.NOT_FOUND,
                                              f"session {session_id[:8]!r} is closed"))
                    return
                if frame[0] == MAP:
                    self._map(conn, session_id, frame[1])
                else:
                    send_frame(conn, *self._answer(session_id, *frame))
        except OSError:
            pass  # the client went away, or close() shut the connection
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _hello(self, conn: socket.socket) -> str | None:
        """The session this connection serves; None (refused, replied) when there is none."""
        try:  # one deadline for the whole hello: a client trickling bytes holds no slot longer
            frame = recv_frame(conn, MAX_HELLO,
                               deadline=time.monotonic() + self.hello_timeout_s)
        except FrameTooLarge:
            frame = (HELLO, bytearray())
        except TimeoutError:
            return None  # silent: closed without a word
        conn.settimeout(None)
        if frame is None:
            return None
        kind, payload = frame
        session_id = payload.decode("ascii", "replace")
        if kind != HELLO or not self.servicer.service.has_session(session_id):
            send_frame(conn, *_status(grpc.StatusCode.NOT_FOUND,
                                      "the lane's hello names no open session"))
            return None
        send_frame(conn, OK, b"")
        return session_id

    def _map(self, conn: socket.socket, session_id: str, probe: bytearray) -> None:
        """Reply with the slab's and the session's staging area's descriptors and, when the
        request carries a probe the daemon reads back from the connected process, PEER_COPY."""
        service = self.servicer.service
        try:
            seg = service.segments(session_id)
            flags = 0
            if len(probe) == PROBE.size:
                address, expect = PROBE.unpack(bytes(probe))
                if service.attach_peer(session_id, peer_pid(conn), address, expect):
                    flags |= PEER_COPY
        except KVStoreError as exc:
            send_frame(conn, *_status(status_of(exc), message_of(exc)))
            return
        payload = SEGMENTS.pack(seg.slab.nbytes, seg.staging.segment.nbytes, seg.staging.pages,
                                flags)
        header = HEADER.pack(len(payload), OK)
        socket.send_fds(conn, [header + payload], [seg.slab.fd, seg.staging.segment.fd])

    def _answer(self, session_id: str, kind: int, payload: bytearray) -> tuple[int, bytes]:
        if not self.calls:
            return _status(grpc.StatusCode.UNIMPLEMENTED,
                           "this daemon's lane answers no calls (daemon.lane = false): use gRPC")
        method = _REQUEST.get(kind)
        if method is None:
            return _status(grpc.StatusCode.INVALID_ARGUMENT, f"no lane call number {kind}")
        name, request_cls = method
        try:
            request = request_cls.FromString(bytes(payload))
        except DecodeError:
            return _status(grpc.StatusCode.INVALID_ARGUMENT, f"a malformed {name} request")
        if "session_id" in request.DESCRIPTOR.fields_by_name:
            request.session_id = session_id
        try:
            reply = self.servicer.answer(name, request)
        except KVStoreError as exc:
            return _status(status_of(exc), message_of(exc))
        except Exception as exc:  # noqa: BLE001 - the daemon keeps serving
            log.exception("lane %s failed", name)
            return _status(grpc.StatusCode.INTERNAL, message_of(exc))
        return OK, reply.SerializeToString()

    def close(self) -> None:
        """Stop accepting, end every connection after its call in progress, remove the socket."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept
        except OSError:
            pass
        self._listener.close()
        self._acceptor.join(5)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        self.path.unlink(missing_ok=True)


__all__ = ["LaneServer"]
