"""Settings and the request's context as FastAPI dependencies. The token itself is checked in
front of every route by :mod:`.guard`, before a body is read; a route that answers more to a
client with the token (``/readyz``) asks :data:`Authenticated`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from server.admin.guard import DEFAULT_MAX_BODY_BYTES, has_token
from server.admin.service import AdminService


@dataclass(frozen=True)
class AdminSettings:
    token: str = field(repr=False)
    #: the cap on a request body (:mod:`.guard`)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


def get_settings(request: Request) -> AdminSettings:
    return request.app.state.settings  # type: ignore[no-any-return]


def get_service(request: Request) -> AdminService:
    return request.app.state.service  # type: ignore[no-any-return]


Settings = Annotated[AdminSettings, Depends(get_settings)]
Service = Annotated[AdminService, Depends(get_service)]


def sent_the_token(request: Request, settings: Settings) -> bool:
    return has_token(request.headers, settings.token)


Authenticated = Annotated[bool, Depends(sent_the_token)]
