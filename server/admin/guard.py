"""The admin app's gate: the token and the body-size cap, checked in front of every route as a
pure ASGI middleware, before any byte of a request body is read.

Why a middleware and not a dependency: FastAPI reads and parses a route's body before it
solves the route's dependencies, so a token dependency let an anonymous client make the
server buffer and parse a body of any size (and answer 422 to malformed JSON instead of 401).

Per HTTP request, in this order:

1. a path in ``open_paths`` (liveness, readiness) needs no token; any other path, known or
   not, needs ``Authorization: Bearer <token>`` or HTTP Basic with the token as the password
   (any user name), so that a browser can open the dashboard. The token is compared in
   constant time and never logged or echoed. Refused: 401, ``WWW-Authenticate: Basic``.
2. a ``Content-Length`` over ``max_body_bytes``: 413 without reading the body.
3. the body is read here, at most ``max_body_bytes`` of it (a chunked body that grows past
   the cap: 413 as soon as it does) and handed to the app as one message.

An early refusal of a request that announced a body answers ``Connection: close``: the server
then drops the connection instead of reading (and discarding) the rest of the body.
A websocket needs the token too (the app has no websocket route; this keeps it so if one is
added). Lifespan passes through."""

from __future__ import annotations

import base64
import binascii
import hmac

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: the default cap on a request body: a /v1/lookup of a 1M-token prompt fits (token ids of up
#: to 6 digits, as json.dumps writes a list: 8 bytes each); every other body is under 1 KiB
DEFAULT_MAX_BODY_BYTES = 8 << 20

DENIED_DETAIL = ("missing or wrong token: send 'Authorization: Bearer <token>' (admin.token, "
                 "KVSTORE_ADMIN__TOKEN), or HTTP Basic with the token as the password")
_CHALLENGE = 'Basic realm="kvstore admin", charset="UTF-8"'


def sent_token(header: str) -> bytes:
    """The token an ``Authorization`` header carries (empty: none, or not decodable)."""
    scheme, _, value = header.partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        return value.strip().encode()
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            return b""
        return decoded.partition(b":")[2]
    return b""


def has_token(headers: Headers, token: str) -> bool:
    """Whether ``headers`` carry ``token`` (constant-time in the token's bytes)."""
    return hmac.compare_digest(sent_token(headers.get("authorization", "")), token.encode())


class Guard:
    """The gate above (module docstring). ``token``: non-empty; ``max_body_bytes``: > 0."""

    def __init__(self, app: ASGIApp, *, token: str, open_paths: frozenset[str],
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        assert token and max_body_bytes > 0, "checked by server.admin.app_for"
        self.app = app
        self.token = token
        self.open_paths = open_paths
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            if not has_token(Headers(scope=scope), self.token):
                await send({"type": "websocket.close", "code": 1008})  # answered as 403
                return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        announced = _announces_body(headers)
        if _route_path(scope) not in self.open_paths and not has_token(headers, self.token):
            await _refuse(scope, receive, send, 401, {"detail": DENIED_DETAIL},
                          {"WWW-Authenticate": _CHALLENGE}, close=announced)
            return
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await self._too_large(scope, receive, send)
            return
        if not announced:
            await self.app(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left: nobody to answer
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                await self._too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(bytes(body), receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        n = self.max_body_bytes
        await _refuse(scope, receive, send, 413, {
            "detail": f"the request body is over the admin API's limit of {n} bytes",
            "hint": "send a smaller body (a lookup of a long prompt: its block_keys instead of "
                    "its token_ids), or raise max_body_bytes of server.admin.app_for / "
                    "serve_admin"}, {}, close=True)


def _route_path(scope: Scope) -> str:
    """The path the app routes on: without the prefix it is mounted under (``root_path``),
    which newer servers and Starlette's Mount keep in ``path``."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def _announces_body(headers: Headers) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0")


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, body: dict[str, str],
                  headers: dict[str, str], *, close: bool) -> None:
    if close:  # the body is left unread: the connection cannot carry another request
        headers = {**headers, "Connection": "close"}
    await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that first gives the whole ``body``, then the client's later messages (a
    disconnect: a streaming response watches for it)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
