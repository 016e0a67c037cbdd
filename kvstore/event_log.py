"""The store's one event log: every change of where a page lives, with a store-wide sequence number.

Guarantees:

- **Ordering.** ``seq`` starts at 1 and grows by exactly 1 per appended event, across every tier:
  events are totally ordered, and a consumer that holds cursor ``c`` has seen exactly the events
  with ``seq < c``.
- **Retention.** The log is a ring of ``capacity`` events: appending to a full log drops the
  oldest one (``dropped`` counts them). Readers never remove events; each keeps its own cursor.
- **Gaps.** A reader whose cursor fell out of the window gets ``gap=True`` and must resynchronize
  from a :class:`Snapshot` (taken by the store, under its lock, with ``cursor = log.head``).
- **Concurrency.** One lock guards the ring; ``append`` is O(1) and touches the condition variable
  only when a reader waits. Reads find their start slot in O(1) from the cursor.

What the kinds mean, for a consumer that mirrors the store::

    stored   keys now live in `tier` (with namespace_ids)
    removed  keys no longer live in `tier`; reason in RemoveReason
    moved    keys now live in `to_tier` and no longer in `tier`; reason in MoveReason
             (demoted: written back on eviction; promoted: copied up then removed below).
             A promotion that copies up and KEEPS the lower copy is a "stored" event in the
             upper tier, not "moved".
    cleared  every key of `namespace_id` (None: every key) is gone from `tier` ("": every tier);
             carries no keys
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, cast, get_args

from kvstore.errors import InvalidArgument, StoreClosed

EventKind = Literal["stored", "removed", "moved", "cleared"]
RemoveReason = Literal["evicted", "deleted", "expired", "corrupt"]
MoveReason = Literal["demoted", "promoted"]

#: The reasons each kind accepts (None: the kind takes no reason).
_REASONS: dict[str, frozenset[str | None]] = {
    "stored": frozenset({None}),
    "removed": frozenset(get_args(RemoveReason)),
    "moved": frozenset(get_args(MoveReason)),
    "cleared": frozenset({None}),
}

#: events the store's log keeps by default (``store.event_log_events``)
DEFAULT_EVENT_LOG_EVENTS = 65536

#: Snapshot events hold at most this many keys each, so no single event is unbounded.
SNAPSHOT_CHUNK_KEYS = 4096


@dataclass(frozen=True, slots=True)
class CacheEvent:
    #: store-wide, strictly increasing by 1 from 1; 0 in a snapshot's events
    seq: int
    #: time.time() when appended
    at: float
    kind: EventKind
    #: stored/removed: the tier; moved: the tier it left; cleared: the tier, or "" for all
    tier: str
    keys: tuple[bytes, ...]
    #: one per key (None: not known)
    namespace_ids: tuple[bytes | None, ...]
    #: removed: a RemoveReason; moved: a MoveReason; else None
    reason: str | None = None
    #: moved only: the tier the keys arrived in
    to_tier: str | None = None
    #: cleared only: the namespace cleared (None: every namespace)
    namespace_id: bytes | None = None
    #: stored only, and only for namespaces the operator opted in (``store.event_token_ids``):
    #: per key, its block's token ids (int32 little-endian; b"" where not told); () for none
    token_ids: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class EventBatch:
    """What one ``read`` returns.

    ``gap=False``: ``events`` are the events with ``cursor <= seq < next_cursor``, in order.
    ``gap=True``: events the reader had not read were dropped; ``events`` is empty and
    ``next_cursor`` is the log's oldest retained seq. Continuing from it would skip the lost
    events: take a snapshot instead and continue from ``snapshot.cursor``.
    ``closed=True``: the log is closed; once a batch is empty and closed, nothing more will come.
    """

    events: tuple[CacheEvent, ...]
    next_cursor: int
    gap: bool
    closed: bool = False
    #: the log's epoch: its cursors mean nothing to another log (a restarted store's)
    epoch: bytes = b""


@dataclass(frozen=True, slots=True)
class Snapshot:
    #: continue read() from here: every event with seq >= cursor happened after the snapshot
    cursor: int
    #: the contents as "stored" events (seq 0, one or more per (tier, namespace) group)
    events: tuple[CacheEvent, ...]
    #: the epoch of the log ``cursor`` belongs to
    epoch: bytes = b""


class EventLog:
    """A bounded, multi-reader log of :class:`CacheEvent`. Thread-safe.

    The ring is a fixed list indexed by ``(seq - 1) % capacity`` rather than a deque: a deque
    reaches its middle in O(n), and a reader must start at ``cursor`` in O(1).
    """

    def __init__(self, capacity: int = 65536) -> None:
        if capacity < 1:
            raise InvalidArgument(f"event log capacity must be >= 1, got {capacity}",
                                  hint="give the number of events to retain")
        self._capacity = capacity
        # plain tuples, CacheEvent's fields in order: an append right after a page copy runs
        # with cold caches, and a frozen dataclass's __init__ (a setattr per field) costs there
        self._ring: list[tuple[Any, ...] | None] = [None] * capacity
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._head = 1      # seq of the next event
        self._size = 0      # events retained; oldest = head - size
        self._waiters = 0   # readers blocked in read(); append notifies only when > 0
        self._dropped = 0
        self._closed = False
        #: random per log: a cursor read against another log (a restarted store's, whose
        #: sequence numbers start again at 1) is a gap, never a silent misreading
        self.epoch = os.urandom(8)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def head(self) -> int:
        """The cursor of the next event to be appended (1 + last seq): "from now on"."""
        with self._lock:
            return self._head

    @property
    def oldest(self) -> int:
        """The seq of the oldest retained event (== head when the log holds none)."""
        with self._lock:
            return self._head - self._size

    @property
    def dropped(self) -> int:
        """Events pushed out of the ring so far."""
        with self._lock:
            return self._dropped

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def append(self, kind: EventKind, tier: str, keys: Sequence[bytes],
               namespace_ids: Sequence[bytes | None], *, reason: str | None = None,
               to_tier: str | None = None, namespace_id: bytes | None = None,
               token_ids: Sequence[bytes] = ()) -> int:
        """Append one event and return its seq. O(1) apart from copying ``keys``.

        Raises InvalidArgument for a combination the kind does not allow (see the module
        docstring), StoreClosed after ``close()``.
        """
        keys = tuple(keys)
        namespace_ids = tuple(namespace_ids)
        token_ids = tuple(token_ids)
        _validate(kind, tier, keys, namespace_ids, reason, to_tier, namespace_id)
        if token_ids and (kind != "stored" or len(token_ids) != len(keys)):
            raise InvalidArgument(f"token ids go on a 'stored' event, one per key: {kind!r} "
                                  f"with {len(keys)} keys, {len(token_ids)} token ids")
        with self._lock:
            if self._closed:
                raise StoreClosed("the event log")
            seq = self._head
            self._ring[(seq - 1) % self._capacity] = (
                seq, time.time(), kind, tier, keys, namespace_ids, reason, to_tier, namespace_id,
                token_ids)
            self._head = seq + 1
            if self._size == self._capacity:
                self._dropped += 1
            else:
                self._size += 1
            if self._waiters:
                self._cond.notify_all()
        return seq

    def read(self, cursor: int, *, limit: int = 1024, timeout_s: float = 0.0,
             epoch: bytes | None = None) -> EventBatch:
        """The events with ``seq >= cursor``, at most ``limit``, in order (see EventBatch).
        ``epoch``: the epoch the cursor came with; another log's is a gap at once.

        With none yet and ``timeout_s > 0``, waits up to ``timeout_s`` for one (``close()`` ends
        the wait). A gap is reported at once, never waited for. Raises InvalidArgument for
        ``cursor < 1``, ``cursor > head``, ``limit < 1`` or ``timeout_s < 0``.
        """
        if limit < 1:
            raise InvalidArgument(f"read limit must be >= 1, got {limit}")
        if timeout_s < 0:
            raise InvalidArgument(f"read timeout_s must be >= 0, got {timeout_s}")
        with self._lock:
            if epoch is not None and epoch != self.epoch:
                return EventBatch((), self._head - self._size, True, self._closed, self.epoch)
            if cursor < 1 or cursor > self._head:
                raise InvalidArgument(
                    f"cursor {cursor} is outside [1, head={self._head}]",
                    hint="start from log.head (from now on) or a snapshot's cursor")
            if cursor == self._head and timeout_s > 0 and not self._closed:
                deadline = time.monotonic() + timeout_s
                self._waiters += 1
                try:
                    while cursor == self._head and not self._closed:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                finally:
                    self._waiters -= 1
            oldest = self._head - self._size
            if cursor < oldest:  # seqs 1..oldest-1 all existed: [cursor, oldest) were dropped
                return EventBatch((), oldest, True, self._closed, self.epoch)
            n = min(limit, self._head - cursor)
            # slot of seq s is (s - 1) % capacity; the n slots from `start` may wrap once
            start = (cursor - 1) % self._capacity
            end = start + n
            if end <= self._capacity:
                chunk = self._ring[start:end]
            else:
                chunk = self._ring[start:] + self._ring[:end - self._capacity]
            closed = self._closed
        # every slot in [oldest, head) holds its event: None only before the first lap; the
        # events are made outside the lock (appends do not wait for a long read)
        events = tuple(CacheEvent(*cast("tuple[Any, ...]", t)) for t in chunk)
        return EventBatch(events, cursor + n, False, closed, self.epoch)

    def close(self) -> None:
        """Wake every waiting reader; later appends raise StoreClosed, reads return what is
        retained without waiting. Idempotent. The store closes its log last."""
        with self._lock:
            self._closed = True
            self._cond.notify_all()


def _validate(kind: str, tier: str, keys: tuple[bytes, ...],
              namespace_ids: tuple[bytes | None, ...], reason: str | None,
              to_tier: str | None, namespace_id: bytes | None) -> None:
    allowed = _REASONS.get(kind)
    if allowed is None:
        raise InvalidArgument(f"unknown event kind {kind!r}; known: {sorted(_REASONS)}")
    if reason not in allowed:
        wants = "no reason" if allowed == {None} else f"a reason in {sorted(map(str, allowed))}"
        raise InvalidArgument(f"a {kind!r} event takes {wants}, got reason={reason!r}")
    if len(namespace_ids) != len(keys):
        raise InvalidArgument(
            f"a {kind!r} event needs one namespace id per key: "
            f"{len(keys)} keys, {len(namespace_ids)} namespace ids")
    if kind == "cleared":
        if keys:
            raise InvalidArgument(
                f"a 'cleared' event carries no keys (its scope is tier and namespace_id), "
                f"got {len(keys)}", hint="report known keys as a 'removed' event")
        if to_tier is not None:
            raise InvalidArgument(f"only a 'moved' event has a to_tier, got to_tier={to_tier!r}")
        return
    if not keys:
        raise InvalidArgument(f"a {kind!r} event needs at least one key; only 'cleared' has none")
    if not tier:
        raise InvalidArgument(f"a {kind!r} event needs a tier; only 'cleared' takes '' (all)")
    if namespace_id is not None:
        raise InvalidArgument(
            f"only a 'cleared' event has a namespace_id, got one on a {kind!r} event",
            hint="give per-key namespace ids in namespace_ids")
    if kind == "moved":
        if not to_tier or to_tier == tier:
            raise InvalidArgument(
                f"a 'moved' event needs a to_tier other than its tier {tier!r}, "
                f"got to_tier={to_tier!r}")
    elif to_tier is not None:
        raise InvalidArgument(f"only a 'moved' event has a to_tier, got to_tier={to_tier!r} "
                              f"on a {kind!r} event")


def only_namespace(ev: CacheEvent, namespace_id: bytes) -> CacheEvent | None:
    """``ev`` narrowed to the keys of ``namespace_id`` (None when it has none of them): what a
    tenant may see. A ``cleared`` event of every namespace, or of this one, stays whole."""
    if ev.kind == "cleared":
        return ev if ev.namespace_id in (None, namespace_id) else None
    idx = [i for i, n in enumerate(ev.namespace_ids) if n == namespace_id]
    if len(idx) == len(ev.keys):
        return ev
    if not idx:
        return None
    return replace(ev, keys=tuple(ev.keys[i] for i in idx),
                   namespace_ids=tuple(ev.namespace_ids[i] for i in idx),
                   token_ids=tuple(ev.token_ids[i] for i in idx) if ev.token_ids else ())


def snapshot_events(contents: Mapping[str, Iterable[tuple[bytes, bytes | None]]], cursor: int,
                    at: float, epoch: bytes = b"") -> Snapshot:
    """Describe ``contents`` (tier -> (key, namespace_id) pairs) as "stored" events with seq 0:
    one per (tier, namespace) group, split into chunks of at most SNAPSHOT_CHUNK_KEYS keys, in
    the order tiers and namespaces first appear. The caller takes ``contents`` and
    ``cursor = log.head`` under the same lock, so that no event falls between them.
    """
    if cursor < 1:
        raise InvalidArgument(f"a snapshot cursor is >= 1 (a log's head), got {cursor}")
    events: list[CacheEvent] = []
    for tier, pairs in contents.items():
        groups: dict[bytes | None, list[bytes]] = {}
        for key, ns in pairs:
            groups.setdefault(ns, []).append(key)
        for ns, keys in groups.items():
            for i in range(0, len(keys), SNAPSHOT_CHUNK_KEYS):
                chunk = tuple(keys[i:i + SNAPSHOT_CHUNK_KEYS])
                events.append(CacheEvent(0, at, "stored", tier, chunk, (ns,) * len(chunk)))
    return Snapshot(cursor, tuple(events), epoch)


__all__ = ["DEFAULT_EVENT_LOG_EVENTS", "SNAPSHOT_CHUNK_KEYS", "CacheEvent", "EventBatch", "EventKind", "EventLog",
           "MoveReason", "RemoveReason", "Snapshot", "only_namespace", "snapshot_events"]
