"""Builds the admin app: includes one router per resource, owns the lifespan (the stats
sampler), maps kvstore's errors to HTTP once, and serves the OpenAPI schema and docs behind
the token like every route but ``/healthz``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from kvstore.errors import InvalidArgument, KVStoreError
from server.admin.deps import AdminSettings, require_token
from server.admin.routers import dashboard, events, health, lookup, namespaces, stats, tiers
from server.admin.service import AdminService

TITLE = "kvstore admin API"


def error_response(exc: KVStoreError) -> JSONResponse:
    """The one mapping of kvstore's errors to HTTP: their ``http_status``, message and hint."""
    return JSONResponse({"detail": exc.message, "hint": exc.hint}, status_code=exc.http_status)


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

    app = FastAPI(title=TITLE, version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None,
                  description="Stats, where-is lookups and operations of one kvstore store. "
                              "Every route but /healthz needs the admin token.")
    app.state.service = service
    app.state.settings = settings
    for r in (health, stats, lookup, namespaces, tiers, events, dashboard):
        app.include_router(r.router)

    @app.exception_handler(KVStoreError)
    async def kvstore_error(request: Request, exc: KVStoreError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(ValueError)
    async def value_error(request: Request, exc: ValueError) -> JSONResponse:
        return error_response(InvalidArgument(str(exc)))

    auth = [Depends(require_token)]

    @app.get("/openapi.json", include_in_schema=False, dependencies=auth)
    def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.get("/docs", include_in_schema=False, dependencies=auth)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=TITLE)

    return app
