"""A namespace's retention: pins that keep pages cached for a time (a system prompt, by its block
keys or its tokens), byte budgets per tier, and what it holds, pins and may hold in each tier.

Pins: ``PUT`` creates a new pin each call (201; two calls, two pins: remove each by its id).
``DELETE`` of a pin answers 200 ``{"removed": false}`` for a pin that lapsed, was removed
already or never was, so it is safe to repeat; another namespace's pin answers false too and
stays (no tenant learns another's pin ids).
Budgets: ``PUT`` sets, ``DELETE`` removes (200 either way, with the tier's row after); an
unknown tier is a 404, like ``/v1/tiers/{name}/policy``'s. Bad input changes nothing."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from server.admin import schemas as s
from server.admin.deps import Service
from server.admin.routers.namespaces import NamespaceId

router = APIRouter(tags=["retention"], responses={400: s.ERRORS[400], 401: s.ERRORS[401]})
PinId = Annotated[int, Path(ge=1, le=2**62, description="a pin's id, as PUT .../pins gave it")]
TierName = Annotated[str, Path(min_length=1, max_length=256, description="a tier's name")]
_NO_TIER: dict[int | str, dict[str, Any]] = {404: {"model": s.ErrorOut, "description": "no tier of that name: the message "
                                                      "lists the tiers"}}


@router.put("/v1/namespaces/{namespace_id}/pins", response_model=s.PinOut, status_code=201,
            responses={413: s.ERRORS[413],
                       404: {"model": s.ErrorOut, "description": "no namespace has that "
                                                                 "namespace_label"}},
            summary="Keep a namespace's pages (block keys, or a prompt's tokens) cached for "
                    "ttl_s seconds in every tier")
def pin(namespace_id: NamespaceId, body: s.PinIn, service: Service) -> s.PinOut:
    return service.pin(bytes.fromhex(namespace_id), body)


@router.delete("/v1/namespaces/{namespace_id}/pins/{pin_id}", response_model=s.UnpinOut,
               summary="Remove a pin (removed: false when it lapsed or was removed already)")
def unpin(namespace_id: NamespaceId, pin_id: PinId, service: Service) -> s.UnpinOut:
    return service.unpin(bytes.fromhex(namespace_id), pin_id)


@router.put("/v1/namespaces/{namespace_id}/budgets/{tier}", response_model=s.TierRetentionOut,
            responses={**_NO_TIER, 413: s.ERRORS[413]},
            summary="Hold a namespace to at most this many bytes of a tier (whole pages)")
def set_budget(namespace_id: NamespaceId, tier: TierName, body: s.BudgetIn,
               service: Service) -> s.TierRetentionOut:
    return service.set_budget(bytes.fromhex(namespace_id), tier, body.bytes)


@router.delete("/v1/namespaces/{namespace_id}/budgets/{tier}", response_model=s.TierRetentionOut,
               responses=_NO_TIER, summary="Remove a namespace's budget in a tier")
def clear_budget(namespace_id: NamespaceId, tier: TierName, service: Service) -> s.TierRetentionOut:
    return service.set_budget(bytes.fromhex(namespace_id), tier, None)


@router.get("/v1/namespaces/{namespace_id}/retention", response_model=s.RetentionOut,
            summary="A namespace's live pins and, per tier, its bytes held, pinned and budgeted")
def retention(namespace_id: NamespaceId, service: Service) -> s.RetentionOut:
    return service.retention(bytes.fromhex(namespace_id))
