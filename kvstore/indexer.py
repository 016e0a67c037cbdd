"""A reference indexer: what a KV-aware router needs to know about where prefixes live.

It mirrors each node's tiers from that node's event stream (``kvstore.event_log``) and answers
which node holds the longest prefix of a prompt's block keys, and in which tier. Keys are opaque
bytes (a hash chain's block keys, the prompt's pages in order). No I/O: ``follow`` takes the
node's ``read`` and ``snapshot`` as callables, so the source may be in-process or remote.

Concurrency: one lock guards every node's map; ``apply``/``follow`` on one thread and queries on
others see each event applied whole (a batch read by ``follow`` is applied under one hold).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvstore.errors import KVStoreError, StoreClosed
from kvstore.event_log import CacheEvent, EventBatch, Snapshot

log = logging.getLogger("kvstore.events")

#: key -> {tier: namespace_id (None: not known)}
_NodeMap = dict[bytes, dict[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class Match:
    node: str
    #: how many leading keys of the query the node holds (in any tier)
    length: int
    #: the tier of each matched key (the fastest, when a key is in several); len == length
    tiers: tuple[str, ...]


class Indexer:
    """Follows one or more nodes' event streams and answers which node holds the longest prefix
    of a prompt, in which tier."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, _NodeMap] = {}

    def apply(self, node: str, event: CacheEvent) -> None:
        """Apply one event to ``node``'s map as given (the caller orders events and drops those
        a snapshot already holds; ``follow`` does both). Unknown keys are ignored on removal."""
        with self._lock:
            _apply(self._nodes.setdefault(node, {}), event)

    def apply_snapshot(self, node: str, snap: Snapshot) -> None:
        """Replace everything known about ``node`` with the snapshot's contents."""
        fresh: _NodeMap = {}
        for event in snap.events:
            _apply(fresh, event)
        with self._lock:
            self._nodes[node] = fresh

    def forget(self, node: str) -> None:
        with self._lock:
            self._nodes.pop(node, None)

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def tiers_of(self, node: str, key: bytes) -> frozenset[str]:
        with self._lock:
            return frozenset(self._nodes.get(node, {}).get(key, ()))

    def contents(self, node: str) -> dict[str, set[bytes]]:
        """tier -> keys known in it (tiers holding none are absent)."""
        out: dict[str, set[bytes]] = {}
        with self._lock:
            for key, tiers in self._nodes.get(node, {}).items():
                for tier in tiers:
                    out.setdefault(tier, set()).add(key)
        return out

    def longest_prefix(self, keys: Sequence[bytes], *,
                       tier_order: Sequence[str] | None = None) -> list[Match]:
        """For each node, how many leading ``keys`` it holds in any tier: a run stops at the first
        key the node holds nowhere, whatever follows. Sorted by length descending, then node name;
        nodes matching nothing are omitted. A key in several tiers reports the first of them in
        ``tier_order`` (fastest first); tiers it does not name come after, by name (all by name
        when it is None)."""
        rank = {t: i for i, t in enumerate(tier_order or ())}

        def fastest(tiers: Iterable[str]) -> str:
            return min(tiers, key=lambda t: (rank.get(t, len(rank)), t))

        matches: list[Match] = []
        with self._lock:
            for node, entries in self._nodes.items():
                found: list[str] = []
                for key in keys:
                    tiers = entries.get(key)
                    if not tiers:
                        break
                    found.append(fastest(tiers))
                if found:
                    matches.append(Match(node, len(found), tuple(found)))
        matches.sort(key=lambda m: (-m.length, m.node))
        return matches

    def follow(self, node: str, source: EventSource, *, stop: threading.Event,
               timeout_s: float = 0.5, namespace_id: bytes | None = None) -> None:
        """Mirror ``node`` -- a store, in process or a daemon's client (any
        :class:`EventSource`) -- until ``stop`` is set or its log closes (run it on a thread).

        Starts from ``source.event_snapshot()``, then applies ``read_events`` batches in order
        from its cursor and epoch; on a gap (the log's window passed, or the node restarted
        with a new log), takes a fresh snapshot and goes on from there. Events with seq below
        the current snapshot's cursor are never applied (the snapshot holds them). A node that
        does not answer (a daemon restarting) is asked again every ``timeout_s``, what is known
        about it kept meanwhile; ``stop`` is seen within about ``timeout_s``."""
        snap: Snapshot | None = None
        cursor, epoch = 0, b""
        while not stop.is_set():
            try:
                if snap is None:
                    snap = source.event_snapshot(namespace_id=namespace_id)
                    self.apply_snapshot(node, snap)
                    cursor, epoch = snap.cursor, snap.epoch
                batch = source.read_events(cursor, timeout_s=timeout_s, epoch=epoch or None,
                                           namespace_id=namespace_id)
            except StoreClosed:
                return
            except KVStoreError:  # unreachable for now: ask again, from a snapshot
                log.debug("indexer: node %s did not answer", node, exc_info=True)
                snap = None
                stop.wait(timeout_s)
                continue
            if batch.gap:
                snap = None
                continue
            if batch.events:
                with self._lock:
                    entries = self._nodes.setdefault(node, {})
                    for event in batch.events:
                        if event.seq >= cursor:
                            _apply(entries, event)
            elif batch.closed:
                return
            # past events of other namespaces too (a filtered batch can be empty and still
            # move the cursor): asking again from the old cursor would answer at once, forever
            cursor = max(cursor, batch.next_cursor)


class EventSource(Protocol):
    """What :meth:`Indexer.follow` reads: the event half of :class:`kvstore.StoreAPI`."""

    def read_events(self, cursor: int | None = None, *, limit: int = 1024,
                    timeout_s: float = 0.0, epoch: bytes | None = None,
                    namespace_id: bytes | None = None) -> EventBatch: ...

    def event_snapshot(self, *, namespace_id: bytes | None = None) -> Snapshot: ...


def _apply(entries: _NodeMap, event: CacheEvent) -> None:
    """The one place that knows what each kind means (kvstore.event_log's module docstring)."""
    kind, tier = event.kind, event.tier
    if kind == "stored":
        for key, ns in zip(event.keys, event.namespace_ids):
            entries.setdefault(key, {})[tier] = ns
    elif kind == "removed":
        for key in event.keys:
            _drop(entries, key, tier)
    elif kind == "moved":
        assert event.to_tier is not None  # EventLog.append guarantees it
        for key, ns in zip(event.keys, event.namespace_ids):
            known = _drop(entries, key, tier)
            entries.setdefault(key, {})[event.to_tier] = ns if ns is not None else known
    elif kind == "cleared":
        # a key whose namespace is not known (None) survives a namespace's clear: we cannot tell
        for key in list(entries):
            tiers = entries[key]
            for t in [t for t, ns in tiers.items()
                      if (not tier or t == tier)
                      and (event.namespace_id is None or ns == event.namespace_id)]:
                del tiers[t]
            if not tiers:
                del entries[key]
    else:
        raise AssertionError(f"unknown event kind {kind!r}")


def _drop(entries: _NodeMap, key: bytes, tier: str) -> bytes | None:
    """Forget ``key`` in ``tier``; return the namespace it was known under (None: unknown)."""
    tiers = entries.get(key)
    if tiers is None:
        return None
    ns = tiers.pop(tier, None)
    if not tiers:
        del entries[key]
    return ns


__all__ = ["EventSource", "Indexer", "Match"]
