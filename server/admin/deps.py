"""Settings and authentication as FastAPI dependencies.

Every route but ``/healthz`` depends on :func:`require_token`: ``Authorization: Bearer
<token>``, or HTTP Basic with the token as the password (any user name) so that a browser can
open the dashboard. The token is compared in constant time and never logged or echoed."""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from server.admin.service import AdminService


@dataclass(frozen=True)
class AdminSettings:
    token: str = field(repr=False)


def get_settings(request: Request) -> AdminSettings:
    return request.app.state.settings  # type: ignore[no-any-return]


def get_service(request: Request) -> AdminService:
    return request.app.state.service  # type: ignore[no-any-return]


Settings = Annotated[AdminSettings, Depends(get_settings)]
Service = Annotated[AdminService, Depends(get_service)]

_DENIED = HTTPException(
    status.HTTP_401_UNAUTHORIZED,
    detail="missing or wrong token: send 'Authorization: Bearer <token>' (admin.token, "
           "KVSTORE_ADMIN__TOKEN), or HTTP Basic with the token as the password",
    headers={"WWW-Authenticate": 'Basic realm="kvstore admin", charset="UTF-8"'},
)


def sent_token(header: str) -> bytes:
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


def require_token(request: Request, settings: Settings) -> None:
    sent = sent_token(request.headers.get("authorization", ""))
    if not hmac.compare_digest(sent, settings.token.encode()):
        raise _DENIED


Auth = [Depends(require_token)]
