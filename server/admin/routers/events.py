"""Server-sent events of pages stored in and removed from tiers, for routers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from server.admin import schemas as s
from server.admin.deps import Service

router = APIRouter(tags=["events"],
                   responses={400: s.ERRORS[400], 401: s.ERRORS[401]})
_KEEPALIVE_S = 15.0


@router.get(
    "/v1/events", response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                     "description": "'stored' and 'removed' events; data: {tier, keys, "
                                    "namespace_ids, dropped_before} (keys in hex)"}},
    summary="Server-sent events of stored and removed blocks")
async def events(request: Request, service: Service,
                 namespace_id: Annotated[str | None, Query(
                     pattern=r"^[0-9a-fA-F]{32}$",
                     description="only this namespace's pages (default: all)")] = None,
                 ) -> StreamingResponse:
    sub = service.events.subscribe(bytes.fromhex(namespace_id) if namespace_id else None)

    async def stream() -> AsyncIterator[str]:
        try:
            yield ": kvstore events\n\n"
            while True:
                try:
                    ev = await asyncio.wait_for(sub.queue.get(), _KEEPALIVE_S)
                except TimeoutError:
                    if await request.is_disconnected():
                        return
                    yield ": keepalive\n\n"
                    continue
                if ev is None:  # the API is stopping
                    return
                dropped, sub.dropped = sub.dropped, 0
                data = {"tier": ev.tier, "keys": [k.hex() for k in ev.keys],
                        "namespace_ids": [n.hex() if n else None for n in ev.namespace_ids],
                        "dropped_before": dropped}
                yield f"event: {ev.kind}\ndata: {json.dumps(data)}\n\n"
        finally:
            service.events.unsubscribe(sub)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})
