"""A real TCP server in a thread that sits in front of a real redis-server and, on demand,
answers chosen commands with malformed RESP bytes instead of forwarding them.

It reads each command the client sends (a RESP array of bulk strings, as redis-py and the tier's
data path write them). A command whose name is in ``garble`` is answered with those bytes and
never reaches the server; every other command is forwarded as it came, and the server's replies
are relayed back untouched. So the handshake (``CLIENT SETINFO``, ``SELECT``, ``INFO``) and the
data commands can each be garbled separately, and clearing ``garble`` heals the server.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import BinaryIO

from tests.redis_servers import DelayProxy


class GarblingProxy(DelayProxy):
    """``DelayProxy``'s listener and relay (without delay), plus the garbling of commands."""

    def __init__(self, target_port: int) -> None:
        #: Upper-case command name (b"GET", b"CLIENT", ...) -> the raw bytes sent back instead.
        self.garble: dict[bytes, bytes] = {}
        super().__init__(target_port)

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        threading.Thread(target=self._commands, args=(client, upstream), daemon=True).start()
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _commands(self, client: socket.socket, upstream: socket.socket) -> None:
        reader = client.makefile("rb")
        try:
            while True:
                raw, name = _read_command(reader)
                if not raw:
                    break
                bad = self.garble.get(name)
                if bad is None:
                    upstream.sendall(raw)
                else:
                    client.sendall(bad)
        except (OSError, ValueError):
            pass
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _read_command(reader: BinaryIO) -> tuple[bytes, bytes]:
    """One command as sent (raw bytes) and its upper-cased name; (b"", b"") at end of stream."""
    head = reader.readline()
    if not head:
        return b"", b""
    if not head.startswith(b"*"):  # an inline command (redis-cli style)
        return head, head.split(b" ", 1)[0].strip().upper()
    parts = [head]
    args = []
    for _ in range(int(head[1:])):
        size_line = reader.readline()
        body = reader.read(int(size_line[1:]) + 2)
        parts += [size_line, body]
        args.append(body[:-2])
    return b"".join(parts), args[0].upper() if args else b""


__all__ = ["GarblingProxy"]
