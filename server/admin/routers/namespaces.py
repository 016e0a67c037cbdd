"""Flushing a namespace (a tenant or a model) from every tier, as a job with progress."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from server.admin import schemas as s
from server.admin.deps import Service

router = APIRouter(tags=["namespaces"],
                   responses={400: s.ERRORS[400], 401: s.ERRORS[401]})
NamespaceId = Annotated[str, Path(pattern=r"^[0-9a-fA-F]{32}$",
                                  description="the namespace id, 32 hex digits")]


@router.delete("/v1/namespaces/{namespace_id}", response_model=s.FlushOut,
               responses={202: {"model": s.FlushOut, "description": "started (wait=false)"}},
               summary="Delete every page of a namespace from every tier, Redis and disk included")
def flush(namespace_id: NamespaceId, service: Service,
          wait: Annotated[bool, Query(description="answer when done (else 202 and a job to "
                                                  "poll at /v1/flushes/{id})")] = True,
          ) -> JSONResponse:
    job = service.start_flush(bytes.fromhex(namespace_id))
    if wait:
        return JSONResponse(service.wait_flush(job.id).model_dump(mode="json"))
    return JSONResponse(job.model_dump(mode="json"), status_code=202)


@router.get("/v1/flushes/{job_id}", response_model=s.FlushOut,
            responses={404: {"model": s.ErrorOut, "description": "unknown job, or one long done"}},
            summary="Progress of a namespace flush")
def flush_status(job_id: Annotated[int, Path(ge=1, le=2**62)], service: Service) -> s.FlushOut:
    return service.flush_status(job_id)
