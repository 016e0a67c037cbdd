"""Liveness and readiness, both open (no token: an orchestrator's probe has none). Without the
token they tell only up / ready; with it, readiness names each tier's state and the Redis
breaker per server (server addresses and tier names are for the operator, not for anyone who
can reach the port)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from server.admin import schemas as s
from server.admin.deps import Authenticated, Service

#: the paths :mod:`server.admin.guard` lets through without the token
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=s.Health, summary="Liveness: the process answers")
def healthz() -> s.Health:
    return s.Health()


@router.get("/readyz", response_model=s.Readiness,
            responses={503: {"model": s.Readiness, "description": "a tier is not reachable"}},
            summary="Readiness: every tier reachable; with the token, each tier's state and "
                    "the Redis breaker per server")
def readyz(service: Service, authenticated: Authenticated) -> JSONResponse:
    r = service.readiness()
    body = r.model_dump(mode="json") if authenticated else {"ready": r.ready}
    return JSONResponse(body, status_code=200 if r.ready else 503)
