"""Builds the admin app: includes one router per resource, owns the lifespan (the stats
sampler), maps kvstore's errors to HTTP once, puts :mod:`.guard` (the token, the body cap) in
front of every route and :mod:`.headers` on every response, and serves the OpenAPI schema
and docs behind the token like every route but ``/healthz`` and ``/readyz``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.types import ASGIApp

from kvstore.errors import InvalidArgument, KVStoreError
from server.admin.deps import AdminSettings
from server.admin.guard import Guard
from server.admin.headers import SecurityHeaders
from server.admin.routers import (dashboard, events, health, lookup, namespaces, retention,
                                  stats, tiers)
from server.admin.service import AdminService, UnknownNamespace

TITLE = "kvstore admin API"


def error_response(exc: KVStoreError) -> JSONResponse:
    """The one mapping of kvstore's errors to HTTP: their ``http_status``, message and hint
    (and, for an unknown namespace label, the namespaces to pick from)."""
    body: dict[str, Any] = {"detail": exc.message, "hint": exc.hint}
    if isinstance(exc, UnknownNamespace):
        body["namespaces"] = [n.model_dump(mode="json") for n in exc.namespaces]
    return JSONResponse(body, status_code=exc.http_status)


class _AdminApp(FastAPI):
    def build_middleware_stack(self) -> ASGIApp:
        # around Starlette's ServerErrorMiddleware too: its 500s get the headers as well
        return SecurityHeaders(super().build_middleware_stack())


def build_app(service: AdminService, settings: AdminSettings, *, own_service: bool = False) -> FastAPI:
    """The app over ``service``. With ``own_service`` the app starts and closes it in its
    lifespan (a caller that shares the service with other apps starts it itself)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if own_service:
            service.start()
        try:
            yield
        finally:
            if own_service:
                service.close()

    app = _AdminApp(title=TITLE, version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                      openapi_url=None,
                      description="Stats, where-is lookups and operations of one kvstore store. "
                                  "Every route but /healthz and /readyz needs the admin token.")
    app.state.service = service
    app.state.settings = settings
    for r in (health, stats, lookup, namespaces, retention, tiers, events, dashboard):
        app.include_router(r.router)
    app.add_middleware(Guard, token=settings.token, open_paths=health.OPEN_PATHS,
                       max_body_bytes=settings.max_body_bytes)

    @app.exception_handler(KVStoreError)
    async def kvstore_error(request: Request, exc: KVStoreError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(ValueError)
    async def value_error(request: Request, exc: ValueError) -> JSONResponse:
        return error_response(InvalidArgument(str(exc)))

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=TITLE)

    return app
