"""The store's event log on the daemon's wire, both ways: one namespace's events and snapshot
as protobuf messages (``ReadEvents`` / ``EventSnapshot``) and back to
:mod:`kvstore.event_log`'s types. The server and the client share these two functions, so what
one writes the other reads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from connector.proto import kvstore_daemon_pb2 as pb
from kvstore.event_log import CacheEvent, EventKind


def events_to_wire(events: Iterable[CacheEvent]) -> list[Any]:
    """``events`` (already narrowed to one namespace) as ``LogEvent`` messages."""
    return [pb.LogEvent(seq=e.seq, at=e.at, kind=e.kind, tier=e.tier, keys=e.keys,
                        reason=e.reason or "", to_tier=e.to_tier or "",
                        all_namespaces=e.kind == "cleared" and e.namespace_id is None,
                        token_ids=e.token_ids)
            for e in events]


def events_from_wire(messages: Iterable[Any], namespace_id: bytes) -> tuple[CacheEvent, ...]:
    """``LogEvent`` messages of ``namespace_id``'s part of the log as events."""
    out = []
    for m in messages:
        keys = tuple(m.keys)
        cleared_ns = None if m.all_namespaces else namespace_id
        out.append(CacheEvent(
            m.seq, m.at, cast(EventKind, m.kind), m.tier, keys, (namespace_id,) * len(keys),
            m.reason or None, m.to_tier or None, cleared_ns if m.kind == "cleared" else None,
            tuple(m.token_ids) if len(m.token_ids) == len(keys) else ()))
    return tuple(out)


__all__ = ["events_from_wire", "events_to_wire"]
