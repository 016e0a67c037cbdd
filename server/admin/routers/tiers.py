"""Switching a tier's eviction policy at run time."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from server.admin import schemas as s
from server.admin.deps import Service

router = APIRouter(tags=["tiers"],
                   responses={400: s.ERRORS[400], 401: s.ERRORS[401], 404: s.ERRORS[404],
                              413: s.ERRORS[413]})


@router.post("/v1/tiers/{name}/policy", response_model=s.PolicyOut,
             summary="Switch a tier's eviction policy (registered policies only)")
def set_policy(name: Annotated[str, Path(max_length=200)], body: s.PolicyIn,
               service: Service) -> s.PolicyOut:
    return service.set_policy(name, body.policy)
