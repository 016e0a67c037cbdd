"""Server-sent events of the store's event log (:mod:`kvstore.event_log`), for routers: every
page stored, removed, moved, with its sequence number. Each event's SSE ``id`` is its log's
epoch and the cursor after it, so a client that reconnects with ``Last-Event-ID`` (browsers do
by themselves) resumes where it stopped -- or, past the log's window or across a restart, gets
a ``gap`` event, the store's contents as ``stored`` events and a ``snapshot_end`` to resume
from: never silent loss."""

from __future__ import annotations

import asyncio
import json
import struct
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from kvstore.event_log import CacheEvent
from server.admin import schemas as s
from server.admin.deps import Service

router = APIRouter(tags=["events"],
                   responses={400: s.ERRORS[400], 401: s.ERRORS[401]})
_KEEPALIVE_S = 15.0
#: how long one read of the log waits on a worker thread before the stream checks its client
_WAIT_S = 1.0
_RESUME = re.compile(r"^([0-9a-f]{16})-([1-9][0-9]{0,18})$")


@router.get(
    "/v1/events", response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                     "description": "events 'stored', 'removed', 'moved', 'cleared' (data: "
                                    "{seq, tier, keys, namespace_ids, reason, to_tier}, keys in "
                                    "hex); 'gap', then the contents as 'stored', then "
                                    "'snapshot_end' when events were lost"}},
    summary="Server-sent events of the store's event log")
async def events(request: Request, service: Service,
                 namespace_id: Annotated[str | None, Query(
                     pattern=r"^[0-9a-fA-F]{32}$",
                     description="only this namespace's pages (default: all)")] = None,
                 last_event_id: Annotated[str | None, Header(
                     alias="Last-Event-ID",
                     description="resume after this event (its id)")] = None,
                 ) -> StreamingResponse:
    store = service.store
    ns = bytes.fromhex(namespace_id) if namespace_id else None
    resume = _RESUME.match(last_event_id or "")
    start = store.read_events(namespace_id=ns)  # raises (400) when the log is off
    cursor, epoch = start.next_cursor, start.epoch
    if resume:  # another epoch's or a cursor past the log's window: a gap, then a snapshot
        epoch, cursor = bytes.fromhex(resume[1]), min(int(resume[2]), start.next_cursor)

    async def stream() -> AsyncIterator[str]:
        nonlocal cursor, epoch
        yield ": kvstore events\n\n"
        quiet_since = time.monotonic()
        while not await request.is_disconnected():
            batch = await asyncio.to_thread(store.read_events, cursor, timeout_s=_WAIT_S,
                                            epoch=epoch, namespace_id=ns)
            if batch.gap:
                snap = await asyncio.to_thread(store.event_snapshot, namespace_id=ns)
                yield "event: gap\ndata: {}\n\n"
                for ev in snap.events:
                    yield _sse(ev, None)
                cursor, epoch = snap.cursor, snap.epoch
                yield (f"id: {epoch.hex()}-{cursor}\nevent: snapshot_end\n"
                       f"data: {json.dumps({'cursor': cursor})}\n\n")
                continue
            for ev in batch.events:
                yield _sse(ev, f"{batch.epoch.hex()}-{ev.seq + 1}")
            cursor = batch.next_cursor
            if batch.events:
                quiet_since = time.monotonic()
            elif batch.closed:
                return  # the store is closing
            elif time.monotonic() - quiet_since >= _KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield ": keepalive\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


def _sse(ev: CacheEvent, event_id: str | None) -> str:
    data = {"seq": ev.seq, "tier": ev.tier, "keys": [k.hex() for k in ev.keys],
            "namespace_ids": [n.hex() if n else None for n in ev.namespace_ids],
            "reason": ev.reason, "to_tier": ev.to_tier}
    if ev.token_ids:  # a namespace the operator opted in (store.event_token_ids)
        data["token_ids"] = [list(struct.unpack(f"<{len(t) // 4}i", t)) for t in ev.token_ids]
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {ev.kind}\ndata: {json.dumps(data)}\n\n"
