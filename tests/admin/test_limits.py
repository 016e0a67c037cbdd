"""The admin API refuses before it reads: a request without the token gets 401 and a body over
the cap gets 413 without the server having read the body, on the live port of a real daemon
(raw HTTP over a socket: a client that announces a huge body and sends a few bytes, or
streams a chunked body with no end, gets its answer while the body is still unsent). In
process, over the ASGI interface: the app pulls at most the cap (plus the message that
crossed it) of an endless body, and nothing of a refused one."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kvstore import KVLayout, Metrics, TieredStore
from kvstore.errors import ConfigError
from kvstore.tiers.host import HostTier
from server.admin import app_for
from server.admin.guard import DEFAULT_MAX_BODY_BYTES
from tests.admin.conftest import TOKEN, AdminDaemon

#: how long a refused request may take to be answered before the test calls it unanswered
ANSWER_TIMEOUT_S = 30.0


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    sent_body_bytes: int  # how much of the body the client got to send before the answer


def exchange(port: int, head: str, body: Iterable[bytes]) -> Reply:
    """Send ``head`` (request line and headers, without the blank line), then the pieces of
    ``body`` until the server answers or the pieces run out, and read the answer. A reader
    thread takes the answer as it comes, while the body is still being sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
    got = bytearray()
    answered, complete = threading.Event(), threading.Event()

    def read() -> None:
        try:
            while chunk := sock.recv(1 << 16):
                got.extend(chunk)
                answered.set()
                if _complete(bytes(got)):
                    break
        except OSError:
            pass
        finally:
            answered.set()
            complete.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sent = 0
    try:
        sock.sendall(head.encode() + b"\r\n")
        for piece in body:
            if answered.is_set():
                break
            try:
                sock.sendall(piece)
            except OSError:  # the server answered and closed the connection
                break
            sent += len(piece)
        assert complete.wait(ANSWER_TIMEOUT_S), (
            f"no answer within {ANSWER_TIMEOUT_S}s: the server waits for the body")
    finally:
        sock.close()
        reader.join(5)
    assert got, "the server closed the connection without an answer"
    raw_head, _, payload = bytes(got).partition(b"\r\n\r\n")
    status_line, *lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return Reply(int(status_line.split()[1]), headers, payload, sent)


def _complete(raw: bytes) -> bool:
    head, sep, payload = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(payload) >= int(value)
    return False


def request_head(path: str, *, token: str | None, length: int | None = None) -> str:
    """A POST's head: ``length`` as its Content-Length, or chunked when None."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines.append(f"Content-Length: {length}" if length is not None else
                 "Transfer-Encoding: chunked")
    return "\r\n".join(lines) + "\r\n"


def chunked(pieces: Iterable[bytes], *, end: bool) -> Iterator[bytes]:
    for p in pieces:
        yield f"{len(p):x}\r\n".encode() + p + b"\r\n"
    if end:
        yield b"0\r\n\r\n"


def endless_token_ids(total_bytes: int) -> Iterator[bytes]:
    """The start of a lookup of a prompt that does not end: ``total_bytes`` of it."""
    yield b'{"token_ids": ['
    piece = b"1, " * 21_000  # 63 KB
    for _ in range(total_bytes // len(piece)):
        yield piece


# ------------------------------------------------------------------ on the live port


def test_no_token_is_refused_before_the_body_is_read(admin_daemon: AdminDaemon) -> None:
    # a body announced as a terabyte, of which 16 bytes come: the answer cannot wait for it
    huge = request_head("/v1/lookup", token=None, length=1 << 40)
    r = exchange(admin_daemon.port, huge, [b'{"token_ids": [1'])
    assert r.status == 401 and "missing or wrong token" in json.loads(r.body)["detail"]
    assert r.headers["www-authenticate"].startswith("Basic")
    assert r.headers["connection"] == "close"  # the rest of the body is never read
    assert r.headers["x-content-type-options"] == "nosniff"  # an early refusal too
    wrong = request_head("/v1/lookup", token="wrong", length=1 << 40)
    assert exchange(admin_daemon.port, wrong, [b"{"]).status == 401
    # malformed JSON without a token: the token is checked first (it was a 422)
    with admin_daemon.client(token=None) as anon:
        r2 = anon.post("/v1/lookup", content=b"{not json",
                       headers={"Content-Type": "application/json"})
        assert r2.status_code == 401, r2.text
        assert "missing or wrong token" in r2.json()["detail"]
        r3 = anon.post("/v1/tiers/host/policy", content=b"[" * 10_000)
        assert r3.status_code == 401, r3.text


def test_a_content_length_over_the_cap_is_refused_unread(admin_daemon: AdminDaemon) -> None:
    head = request_head("/v1/lookup", token=TOKEN, length=DEFAULT_MAX_BODY_BYTES + 1)
    r = exchange(admin_daemon.port, head, [b'{"token_ids": [1'])
    assert r.status == 413 and r.headers["connection"] == "close"
    assert r.headers["x-content-type-options"] == "nosniff"
    err = json.loads(r.body)
    assert f"limit of {DEFAULT_MAX_BODY_BYTES} bytes" in err["detail"]
    assert "max_body_bytes" in err["hint"]
    # a body of exactly the cap is read (and judged on its content)
    with admin_daemon.client() as api:
        at_cap = b'{"block_keys": []}'.ljust(DEFAULT_MAX_BODY_BYTES)
        r2 = api.post("/v1/lookup", content=at_cap, headers={"Content-Type": "application/json"})
        assert r2.status_code == 200 and r2.json()["num_blocks"] == 0, r2.text[:300]


def test_a_chunked_body_is_refused_once_it_passes_the_cap(admin_daemon: AdminDaemon) -> None:
    # the body never ends (no last chunk): only a server that stops at the cap can answer
    body = chunked(endless_token_ids(8 * DEFAULT_MAX_BODY_BYTES), end=False)
    r = exchange(admin_daemon.port, request_head("/v1/lookup", token=TOKEN), body)
    assert r.status == 413, r.body[:300]
    assert f"limit of {DEFAULT_MAX_BODY_BYTES} bytes" in json.loads(r.body)["detail"]
    assert r.headers["connection"] == "close"
    # and the server still serves
    with admin_daemon.client() as api:
        assert api.get("/v1/stats").status_code == 200


def test_a_chunked_body_under_the_cap_reaches_the_route(admin_daemon: AdminDaemon) -> None:
    pieces = [b'{"block_keys": ["', b"00" * 16, b'"], "namespace_id": "', b"11" * 16, b'"}']
    r = exchange(admin_daemon.port, request_head("/v1/lookup", token=TOKEN),
                 chunked(pieces, end=True))
    assert r.status == 200, r.body[:300]
    out = json.loads(r.body)
    assert out["num_blocks"] == 1 and out["blocks"][0]["key"] == "00" * 16
    assert out["namespace_id"] == "11" * 16


# ------------------------------------------------------------------ in process (ASGI)


@pytest.fixture
def store() -> Iterator[TieredStore]:
    layout = KVLayout(1, 1, 8, 4, "float16")
    s = TieredStore(layout, [HostTier.build("host", layout, 4, Metrics())])
    yield s
    s.close()


class Client:
    """One request to an ASGI app, counting the body bytes the app pulls: the body is
    ``pieces``, then (``endless``) 1000-byte pieces without end."""

    def __init__(self, pieces: list[bytes], *, endless: bool) -> None:
        self._pieces = pieces
        self._next = 0
        self._endless = endless
        self.pulled_bytes = 0
        self.status = 0
        self.body = b""

    async def receive(self) -> dict[str, Any]:
        if self._next < len(self._pieces):
            piece = self._pieces[self._next]
            self._next += 1
            more = self._endless or self._next < len(self._pieces)
        elif self._endless:
            piece, more = b"0" * 1000, True
        else:  # the body is whole: the client waits for its answer and never leaves
            await asyncio.sleep(3600)
        self.pulled_bytes += len(piece)
        return {"type": "http.request", "body": piece, "more_body": more}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")

    def run(self, app: Any, headers: dict[str, str], path: str = "/v1/lookup") -> Client:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "root_path": "", "query_string": b"", "client": ("127.0.0.1", 1),
                 "server": ("127.0.0.1", 80),
                 "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
        asyncio.run(asyncio.wait_for(app(scope, self.receive, self.send), 30))
        return self


def test_the_app_pulls_at_most_the_cap_of_an_endless_body(store: TieredStore) -> None:
    app = app_for(store, TOKEN, max_body_bytes=10_000)
    auth = {"Authorization": f"Bearer {TOKEN}", "Transfer-Encoding": "chunked"}
    c = Client([], endless=True).run(app, auth)
    assert c.status == 413 and "limit of 10000 bytes" in json.loads(c.body)["detail"]
    assert 10_000 < c.pulled_bytes <= 10_000 + 1000  # the piece that crossed the cap, no more


def test_the_app_pulls_nothing_of_a_refused_body(store: TieredStore) -> None:
    app = app_for(store, TOKEN, max_body_bytes=10_000)
    for headers, status in (
            ({"Transfer-Encoding": "chunked"}, 401),  # no token
            ({"Authorization": "Bearer wrong", "Content-Length": "5"}, 401),
            ({"Authorization": f"Bearer {TOKEN}", "Content-Length": "10001"}, 413)):
        c = Client([], endless=True).run(app, headers)
        assert (c.status, c.pulled_bytes) == (status, 0), headers


def test_a_body_in_pieces_within_the_cap_reaches_the_route_whole(store: TieredStore) -> None:
    app = app_for(store, TOKEN, max_body_bytes=10_000)
    body = json.dumps({"block_keys": ["ab" * 16] * 3, "namespace_id": "cd" * 16}).encode()
    c = Client([body[i:i + 7] for i in range(0, len(body), 7)], endless=False)
    c.run(app, {"Authorization": f"Bearer {TOKEN}", "Transfer-Encoding": "chunked",
                "Content-Type": "application/json"})
    assert c.status == 200, c.body
    out = json.loads(c.body)
    assert out["num_blocks"] == 3 and out["namespace_id"] == "cd" * 16
    assert c.pulled_bytes == len(body)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1MiB"])
def test_a_cap_that_is_not_a_positive_int_is_refused_at_build(store: TieredStore,
                                                                bad: object) -> None:
    with pytest.raises(ConfigError, match="max_body_bytes"):
        app_for(store, TOKEN, max_body_bytes=bad)  # type: ignore[arg-type]
