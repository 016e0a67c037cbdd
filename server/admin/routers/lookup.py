"""Where does this prefix live: per block, the tier that holds it or why it is absent."""

from __future__ import annotations

from fastapi import APIRouter

from server.admin import schemas as s
from server.admin.deps import Service

router = APIRouter(tags=["lookup"],
                   responses={400: s.ERRORS[400], 401: s.ERRORS[401], 413: s.ERRORS[413],
                              404: {"model": s.ErrorOut,
                                    "description": "no namespace has that namespace_label: "
                                                   "the body lists the namespaces there are"}})


@router.post("/v1/lookup", response_model=s.LookupOut,
             summary="Per block of a prompt (token ids) or of block keys: its tier, or why absent")
def lookup(body: s.LookupIn, service: Service) -> s.LookupOut:
    return service.lookup(body)
