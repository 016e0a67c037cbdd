"""A minimal RESP2 reader/writer on a connected socket, for the Redis tier's pipelined data path.

redis-py opens and authenticates the connection (AUTH / ACL user, TLS, SELECT, cluster topology);
this module then speaks RESP2 on its socket for the hot commands only, because it can do what
redis-py cannot:

* **read a bulk reply straight into the caller's buffer** — ``read_into`` copies what is already
  buffered and receives the rest of a 2 MiB page directly into the destination array with a few
  ``recv(MSG_WAITALL)`` calls of 256 KiB, hashing each piece while it is hot in cache; redis-py +
  hiredis receives 64 KiB at a time (a ``poll`` and a ``recv`` each), copies the value into
  hiredis' buffer and again into a ``bytes`` object, and the caller copies it once more;
* **write a value from several buffers** (record header, the caller's page, CRLF) with one
  ``sendmsg`` gather write, so a page is never concatenated into a temporary;
* **bound the whole call by one deadline** (``RespIO.deadline``, monotonic seconds) and every
  single wait by ``RespIO.wait_s``, so a hung server costs one ``wait_s``, never a socket
  timeout per read.
  On plain TCP the socket is blocking and the kernel enforces the remaining budget
  (``SO_RCVTIMEO`` / ``SO_SNDTIMEO``); TLS sockets use Python's timeout mode.

Contract: one ``RespIO`` belongs to one connection and is used by one thread at a time. Any
exception raised by a method (``OSError`` — including ``TimeoutError`` — or :class:`ProtocolError`)
leaves the stream at an unknown position: the caller must close the connection. Error replies
(``-ERR ...``) are not exceptions; they are returned as :class:`ReplyError` values, and the
stream stays in sync.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Sequence
from typing import Any

_CRLF = b"\r\n"
_IOV_MAX = 512  # iovecs per sendmsg call (Linux allows 1024)
_COALESCE = 16 * 1024  # parts smaller than this are joined before a (TLS) sendall
_TIMEVAL = struct.Struct("@ll")  # struct timeval for SO_RCVTIMEO / SO_SNDTIMEO


class ProtocolError(ConnectionError):
    """The server sent bytes that are not the RESP2 reply we expected; the stream is lost."""


class ReplyError:
    """An error reply (``-PREFIX message``). Returned, not raised."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    @property
    def prefix(self) -> str:
        return self.message.split(" ", 1)[0]

    def __repr__(self) -> str:
        return f"ReplyError({self.message!r})"


def command(*args: bytes) -> bytes:
    """One RESP2 command (an array of bulk strings) as bytes; for small arguments."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n" % len(a))
        out.append(a)
        out.append(_CRLF)
    return b"".join(out)


def command_head(args: Sequence[bytes], value_nbytes: int, n_after: int = 0) -> bytes:
    """The start of a command whose value (``value_nbytes`` long) is sent from separate buffers:
    ``head + value + b"\\r\\n" + <n_after more bulk strings>`` is the whole command. ``args`` are
    the arguments before the value."""
    out = [b"*%d\r\n" % (len(args) + 1 + n_after)]
    for a in args:
        out.append(b"$%d\r\n" % len(a))
        out.append(a)
        out.append(_CRLF)
    out.append(b"$%d\r\n" % value_nbytes)
    return b"".join(out)


class RespIO:
    """Buffered RESP2 I/O over one socket. Every blocking call waits at most ``wait_s`` for the
    server to make progress, and nothing runs past ``deadline`` (``time.monotonic()`` seconds).

    On a plain TCP socket the socket is put in blocking mode and each wait is bounded by the
    kernel (``SO_RCVTIMEO`` / ``SO_SNDTIMEO`` set to what is left of the deadline), so a bulk
    value arrives with a few ``recv(MSG_WAITALL)`` calls of ``CHUNK`` bytes instead of a
    ``poll`` + ``recv`` pair per segment. TLS sockets keep Python's timeout mode.
    """

    #: Bytes per receive of a bulk value: small enough to hash while it is hot in L2.
    CHUNK = 256 * 1024
    #: Largest bulk string ``read_reply`` accepts (a record header is a few KiB at most).
    MAX_SMALL = 1 << 20

    __slots__ = ("sock", "deadline", "wait_s", "_buf", "_mv", "_pos", "_end", "_plain")

    def __init__(self, sock: Any, bufsize: int = 32 * 1024) -> None:
        self.sock = sock
        self.deadline = float("inf")
        self.wait_s = 3600.0
        self._buf = bytearray(bufsize)
        self._mv = memoryview(self._buf)
        self._pos = 0
        self._end = 0
        self._plain = hasattr(sock, "sendmsg") and not isinstance(sock, ssl.SSLSocket)
        if self._plain:
            sock.settimeout(None)  # blocking: waits are bounded by SO_RCVTIMEO / SO_SNDTIMEO

    # ----------------------------------------------------------------- sending

    def send(self, parts: Sequence[Any]) -> None:
        """Write every buffer of ``parts`` in order (bytes, bytearray, memoryview, or a 1-D uint8
        numpy array); gather-writes without copying on plain sockets."""
        views = [p if isinstance(p, bytes) else memoryview(p).cast("B") for p in parts]
        if not self._plain:
            self._send_coalesced(views)
            return
        sock = self.sock
        i, n = 0, len(views)
        while i < n:
            self._budget(socket.SO_SNDTIMEO)
            try:
                sent = sock.sendmsg(views[i : i + _IOV_MAX])
            except BlockingIOError:
                raise TimeoutError("redis call ran past its timeout (send)") from None
            while sent:
                size = len(views[i])
                if sent >= size:
                    sent -= size
                    i += 1
                else:
                    views[i] = memoryview(views[i])[sent:]
                    sent = 0

    def _send_coalesced(self, views: list[Any]) -> None:
        pending: list[Any] = []
        pending_n = 0
        for v in views:
            if len(v) < _COALESCE:
                pending.append(v)
                pending_n += len(v)
                if pending_n < _COALESCE:
                    continue
                v = b"".join(pending)
                pending, pending_n = [], 0
            elif pending:
                self._sendall(b"".join(pending))
                pending, pending_n = [], 0
            self._sendall(v)
        if pending:
            self._sendall(b"".join(pending))

    def _sendall(self, data: Any) -> None:
        self._budget(socket.SO_SNDTIMEO)
        self.sock.sendall(data)  # the socket timeout bounds the whole sendall (Python >= 3.5)

    # ----------------------------------------------------------------- receiving

    def read_reply(self) -> Any:
        """One whole reply: ``bytes`` (simple or bulk string), ``int``, ``None`` (nil),
        ``list`` (array) or :class:`ReplyError`. For small replies (a bulk string of at most
        ``MAX_SMALL`` bytes); bulk strings are copied."""
        line = self._line()
        kind = line[:1]
        if kind == b"$":
            n = _length(line)
            if n < 0:
                return None
            if n > self.MAX_SMALL:
                raise ProtocolError(f"a {n}-byte bulk string where a small reply belongs")
            data = bytearray(n)
            self.read_into(memoryview(data))
            self.expect_crlf()
            return bytes(data)
        if kind == b":":
            return _integer(line)
        if kind == b"+":
            return line[1:]
        if kind == b"-":
            return ReplyError(line[1:].decode("utf-8", "replace"))
        if kind == b"*":
            n = _length(line)
            return None if n < 0 else [self.read_reply() for _ in range(n)]
        raise ProtocolError(f"unexpected RESP reply type {line[:16]!r}")

    def read_flag(self) -> bool | ReplyError:
        """The ``:0`` / ``:1`` answer of a one-key EXISTS or DEL, or the error reply; any other
        reply breaks the protocol (:class:`ProtocolError`)."""
        reply = self.read_reply()
        if isinstance(reply, ReplyError):
            return reply
        if type(reply) is not int or reply not in (0, 1):
            raise ProtocolError(f"expected :0 or :1, got {_show(reply)}")
        return reply == 1

    def read_ok(self) -> ReplyError | None:
        """The ``+OK`` of a command that stores (SET): None, or the error reply; any other
        reply breaks the protocol (:class:`ProtocolError`)."""
        reply = self.read_reply()
        if isinstance(reply, ReplyError):
            return reply
        if reply != b"OK":
            raise ProtocolError(f"expected +OK, got {_show(reply)}")
        return None

    def read_bulk_len(self) -> int | ReplyError:
        """The header of a bulk-string reply: its length (-1 for nil), or the error reply. The
        caller then consumes exactly that many bytes (``read_into`` / ``skip``) and the CRLF."""
        line = self._line()
        kind = line[:1]
        if kind == b"$":
            return _length(line)
        if kind == b"-":
            return ReplyError(line[1:].decode("utf-8", "replace"))
        raise ProtocolError(f"expected a bulk string, got {line[:16]!r}")

    def read_into(self, dst: memoryview, hasher: Any = None) -> None:
        """Fill ``dst`` (a writable byte memoryview) with the next ``len(dst)`` bytes: what is
        buffered is copied, the rest is received straight into ``dst``. ``hasher`` (an object
        with ``update``) is fed each piece right after it lands, while it is still in cache."""
        n = len(dst)
        off = min(self._end - self._pos, n)
        if off:
            dst[:off] = self._mv[self._pos : self._pos + off]
            self._pos += off
            if hasher is not None:
                hasher.update(dst[:off])
        sock = self.sock
        chunk = self.CHUNK
        flags = socket.MSG_WAITALL if self._plain else 0
        while off < n:
            want = min(n - off, chunk)
            self._budget(socket.SO_RCVTIMEO)
            try:
                got = sock.recv_into(dst[off : off + want], want, flags)
            except BlockingIOError:
                raise TimeoutError("redis call ran past its timeout (receive)") from None
            if not got:
                raise ConnectionError("redis server closed the connection")
            if hasher is not None:
                hasher.update(dst[off : off + got])
            off += got

    def skip(self, n: int) -> None:
        """Discard the next ``n`` bytes."""
        while n:
            if self._pos == self._end:
                self._fill()
            take = min(self._end - self._pos, n)
            self._pos += take
            n -= take

    def expect_crlf(self) -> None:
        while self._end - self._pos < 2:
            self._fill()
        if self._buf[self._pos : self._pos + 2] != _CRLF:
            raise ProtocolError("bulk string not terminated by CRLF")
        self._pos += 2

    def pending(self) -> int:
        """Bytes received but not consumed yet (0 when the stream is in sync between calls)."""
        return self._end - self._pos

    # ----------------------------------------------------------------- internals

    def _line(self) -> bytes:
        buf = self._buf
        while True:
            i = buf.find(_CRLF, self._pos, self._end)
            if i >= 0:
                line = bytes(self._mv[self._pos : i])
                self._pos = i + 2
                if not line:
                    raise ProtocolError("empty RESP line")
                return line
            if self._pos == 0 and self._end == len(buf):
                raise ProtocolError("RESP line longer than the read buffer")
            self._fill()

    def _fill(self) -> None:
        """Receive at least one more byte into the buffer (compacting it first if needed)."""
        if self._pos == self._end:
            self._pos = self._end = 0
        elif self._end == len(self._buf):
            keep = self._end - self._pos
            self._buf[:keep] = self._buf[self._pos : self._end]
            self._pos, self._end = 0, keep
        self._budget(socket.SO_RCVTIMEO)
        try:
            got = self.sock.recv_into(self._mv[self._end :])
        except BlockingIOError:
            raise TimeoutError("redis call ran past its timeout (receive)") from None
        if not got:
            raise ConnectionError("redis server closed the connection")
        self._end += got

    def _budget(self, which: int) -> None:
        """Bound the next blocking socket call by ``wait_s`` and what is left of the deadline."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("redis call ran past its timeout")
        left = min(left, self.wait_s)
        if self._plain:  # a zero timeval would mean "wait forever": at least 1 us
            sec, usec = divmod(max(1, int(left * 1e6)), 1_000_000)
            self.sock.setsockopt(socket.SOL_SOCKET, which, _TIMEVAL.pack(sec, usec))
        else:
            self.sock.settimeout(left)


def _integer(line: bytes) -> int:
    """The number of a ``:<n>`` line."""
    try:
        return int(line[1:])
    except ValueError:
        raise ProtocolError(f"not an integer reply: {line[:32]!r}") from None


def _length(line: bytes) -> int:
    """The length of a ``$<n>`` or ``*<n>`` line: -1 for nil, else >= 0."""
    n = _integer(line)
    if n < -1:
        raise ProtocolError(f"negative length: {line[:32]!r}")
    return n


def _show(reply: Any) -> str:
    return repr(reply)[:40]


__all__ = ["ProtocolError", "ReplyError", "RespIO", "command", "command_head"]
