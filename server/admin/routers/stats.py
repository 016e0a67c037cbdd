"""Stats: a snapshot per tier and per namespace, its history, and Prometheus's text format."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.admin import schemas as s
from server.admin.deps import Service
from server.admin.sampler import RETAIN_S, WINDOW_15M_S

router = APIRouter(tags=["stats"], responses={401: s.ERRORS[401]})


@router.get("/v1/stats", response_model=s.StatsOut,
            summary="Per tier and per namespace: occupancy, hit rates, misses by reason, bytes, "
                    "evictions, errors, latency")
def stats(service: Service) -> s.StatsOut:
    return service.stats()


@router.get("/v1/stats/history", response_model=s.HistoryOut,
            summary="Rates per sample interval over the last window_s seconds, and the window's "
                    "hit rates (the dashboard's charts)")
def history(service: Service,
            window_s: Annotated[float, Query(gt=0, le=RETAIN_S, description=(
                "how far back, in seconds (the sampler keeps an hour)"))] = WINDOW_15M_S,
            ) -> s.HistoryOut:
    return service.history(window_s)


@router.get("/metrics", response_class=Response, summary="Prometheus text format",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                             "description": "the store's metrics, labelled per tier"}})
def metrics(service: Service) -> Response:
    return Response(generate_latest(service.store.metrics.registry), media_type=CONTENT_TYPE_LATEST)
