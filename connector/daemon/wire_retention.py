"""Budgets and retention on the daemon's wire, both ways (``SetBudget`` / ``Retention``): a
budget as a request, checked as the store checks it, and a namespace's
:class:`~kvstore.retention.RetentionInfo` as a reply and back. The server and the client share
these functions, so what one writes the other reads.

Clocks: a pin's ``expires_at`` is a reading of its store's clock, which is not the client's (a
TCP client is another machine). The reply carries each pin's seconds left; the client adds them
to its own monotonic clock, as ``Pin`` does with a new pin's TTL."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from connector.proto import kvstore_daemon_pb2 as pb
from kvstore.errors import InvalidArgument
from kvstore.retention import Pin, RetentionInfo, TierRetention

#: the largest size the wire carries (``uint64``)
MAX_WIRE_BYTES = (1 << 64) - 1


def budget_request(namespace_id: bytes, tier: object, nbytes: object,
                   tiers: Sequence[str]) -> Any:
    """A ``SetBudgetRequest``; InvalidArgument, before anything is sent, for a tier that is not
    one of ``tiers`` or a size that is not a whole number of bytes >= 0 (None: no budget)."""
    if not isinstance(tier, str):
        raise InvalidArgument(f"a budget names its tier, got {tier!r}",
                              hint=f"tiers are {list(tiers)}")
    if tier not in tiers:
        raise InvalidArgument(f"no tier named {tier!r}", hint=f"tiers are {list(tiers)}")
    if nbytes is None:
        return pb.SetBudgetRequest(namespace_id=namespace_id, tier=tier)
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise InvalidArgument(f"a budget is a whole number of bytes >= 0, got {nbytes!r}")
    if nbytes > MAX_WIRE_BYTES:
        raise InvalidArgument(f"a budget of {nbytes} bytes is past what the wire carries "
                              f"({MAX_WIRE_BYTES})", hint="pass None for no budget")
    return pb.SetBudgetRequest(namespace_id=namespace_id, tier=tier, nbytes=nbytes)


def budget_of(request: Any) -> int | None:
    """A ``SetBudgetRequest``'s size: None when unset (remove the budget)."""
    return int(request.nbytes) if request.HasField("nbytes") else None


def retention_to_wire(info: RetentionInfo, now: float) -> Any:
    """``info`` as a ``RetentionReply``; ``now``: the reading of the pins' store clock."""
    return pb.RetentionReply(
        pins=[pb.HeldPin(pin_id=p.id, keys=p.keys, expires_in_s=max(0.0, p.expires_at - now))
              for p in info.pins],
        tiers=[pb.TierRetention(tier=t.tier, used_bytes=t.used_bytes,
                                pinned_bytes=t.pinned_bytes, budget_bytes=t.budget_bytes)
               for t in info.tiers])


def retention_from_wire(reply: Any, namespace_id: bytes, now: float) -> RetentionInfo:
    """A ``RetentionReply`` of ``namespace_id`` as a RetentionInfo whose pins expire on the
    clock ``now`` was read from."""
    return RetentionInfo(
        namespace_id,
        tuple(Pin(int(p.pin_id), namespace_id, tuple(p.keys), now + p.expires_in_s)
              for p in reply.pins),
        tuple(TierRetention(t.tier, int(t.used_bytes), int(t.pinned_bytes),
                            int(t.budget_bytes) if t.HasField("budget_bytes") else None)
              for t in reply.tiers))


def read_retention(call: Callable[[str, Any], Any], namespace_id: bytes) -> RetentionInfo:
    """``namespace_id``'s retention by a ``Retention`` call (``call(method, request)``: the
    client's session), its pins' expiry on this process's monotonic clock."""
    reply = call("Retention", pb.RetentionRequest(namespace_id=namespace_id))
    return retention_from_wire(reply, namespace_id, time.monotonic())


__all__ = ["budget_of", "budget_request", "read_retention", "retention_from_wire",
           "retention_to_wire"]
