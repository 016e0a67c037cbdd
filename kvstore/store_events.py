"""The store's event log as its callers read it: from a cursor, or as a snapshot of the
contents that the log goes on from (:mod:`kvstore.event_log` holds the log itself)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import cast

from kvstore.errors import InvalidArgument
from kvstore.event_log import EventBatch, EventLog, Snapshot, only_namespace, snapshot_events
from kvstore.store_state import StoreState


class StoreEvents:
    def __init__(self, state: StoreState) -> None:
        self._st = state

    def read(self, cursor: int | None, *, limit: int, timeout_s: float, epoch: bytes | None,
             namespace_id: bytes | None) -> EventBatch:
        """:meth:`kvstore.store.TieredStore.read_events` (its contract is there)."""
        self._st.check_open()
        log = self._log()
        if cursor is None:
            return EventBatch((), log.head, False, epoch=log.epoch)
        batch = log.read(cursor, limit=limit, timeout_s=timeout_s, epoch=epoch)
        if namespace_id is None or not batch.events:
            return batch
        return replace(batch, events=tuple(filter(None, (
            only_namespace(ev, namespace_id) for ev in batch.events))))

    def snapshot(self, namespace_id: bytes | None) -> Snapshot:
        """:meth:`kvstore.store.TieredStore.event_snapshot` (its contract is there)."""
        st = self._st
        st.check_open()
        log = self._log()
        with st.lock:
            contents: dict[str, list[tuple[bytes, bytes | None]]] = {}
            for ti, (tier, policy) in enumerate(zip(st.tiers, st.policies)):
                keys = [*cast("list[bytes]", list(policy)), *st.retiring[ti]]
                owners = st.namespaces_of(tier, keys)
                if not tier.shared:  # a page the accounting missed: the tier's index tells
                    owners = [ns if ns is not None else (
                        m.namespace_id if (m := tier.meta(k)) is not None else None)
                        for k, ns in zip(keys, owners)]
                contents[tier.name] = list(zip(keys, owners))
            snap = snapshot_events(contents, log.head, time.time(), log.epoch)
        if namespace_id is None:
            return snap
        return replace(snap, events=tuple(filter(None, (
            only_namespace(ev, namespace_id) for ev in snap.events))))

    def _log(self) -> EventLog:
        if self._st.events is None:
            raise InvalidArgument("the store's event log is off",
                                  hint="set store.event_log_events above 0")
        return self._st.events


__all__ = ["StoreEvents"]
