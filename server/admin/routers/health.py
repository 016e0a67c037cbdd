"""Liveness (open: no token) and readiness (every tier reachable, Redis breakers closed)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from server.admin import schemas as s
from server.admin.deps import Service, require_token

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=s.Health, summary="Liveness: the process answers")
def healthz() -> s.Health:
    return s.Health()


@router.get("/readyz", response_model=s.Readiness, dependencies=[Depends(require_token)],
            responses={503: {"model": s.Readiness, "description": "a tier is not reachable"},
                       401: s.ERRORS[401]},
            summary="Readiness: every tier reachable; the Redis breaker state per server")
def readyz(service: Service) -> JSONResponse:
    r = service.readiness()
    return JSONResponse(r.model_dump(mode="json"), status_code=200 if r.ready else 503)
