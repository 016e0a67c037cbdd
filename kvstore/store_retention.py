"""Retention as the store offers it: pins (kvstore.retention) and per-tier byte budgets
(kvstore.budgets) of a namespace, checked at the store's face and kept under its lock; with a
disk tier, also in its directory (kvstore.retention_file), so they outlive a restart."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from kvstore.checks import check_keys, check_namespace
from kvstore.errors import InvalidArgument
from kvstore.errors import KVStoreError
from kvstore.retention import Pin, RetentionInfo, TierRetention
from kvstore.retention_file import RetentionFile, SavedBudget, SavedPin
from kvstore.store_state import StoreState
from kvstore.tiers.hbm_owner import OwnedPool

log = logging.getLogger("kvstore.retention")


class StoreRetention:
    def __init__(self, state: StoreState, clock: Callable[[], float]) -> None:
        self._st = state
        self._clock = clock
        disk = next((t for t in state.tiers if t.kind == "disk"), None)
        self._file = RetentionFile(disk.path) if disk is not None else None  # type: ignore[attr-defined]
        if self._file is not None:
            self._restore(self._file)

    def _restore(self, file: RetentionFile) -> None:
        st, now = self._st, time.time()
        pins, budgets = file.load()
        with st.lock:
            for p in pins:
                if p.expires_unix <= now:
                    continue  # lapsed while the store was down
                try:
                    st.retention.restore(p.id, p.namespace_id, p.keys, p.expires_unix - now)
                except KVStoreError as exc:
                    log.error("pin %d of namespace %s not restored: %s", p.id,
                              p.namespace_id.hex(), exc)
            for b in budgets:
                if b.tier in st.by_name:
                    st.budgets.set(st.by_name[b.tier], b.namespace_id, b.nbytes)

    def _save(self) -> None:
        """Write the pins and budgets as they are now (outside the store lock)."""
        if self._file is None:
            return
        st = self._st
        with st.lock:
            version = st.retention.version + st.budgets.version
            mono, unix = self._clock(), time.time()
            pins = [SavedPin(p.id, p.namespace_id, p.keys, unix + p.expires_at - mono)
                    for p in st.retention.all_pins()]
            budgets = [SavedBudget(ns, st.tiers[ti].name, pages * st.layout.page_bytes)
                       for ti, ns, pages in st.budgets.all()]
        try:
            self._file.save(version, pins, budgets)
        except OSError as exc:  # a full or failing disk: the pin holds, in memory only
            log.error("retention: could not save pins and budgets to %s (%s); they hold until "
                      "this store stops", self._file.path, exc)

    def pin(self, namespace_id: bytes, keys: Sequence[bytes], ttl_s: float) -> Pin:
        st = self._st
        st.check_open()
        check_keys(keys)
        check_namespace(namespace_id)
        keys = list(keys)
        with st.lock:  # checked and pinned in one hold: no other namespace's write between
            self.refuse_foreign(keys, namespace_id, "pinned")
            held = st.retention.pin(namespace_id, keys, ttl_s)
        self._save()
        return held

    def unpin(self, pin: Pin | int, namespace_id: bytes | None) -> bool:
        self._st.check_open()
        pin_id = pin.id if isinstance(pin, Pin) else pin
        ns = namespace_id if namespace_id is not None else (
            pin.namespace_id if isinstance(pin, Pin) else None)
        if ns is None:
            raise InvalidArgument("unpin needs the pin's namespace", hint="pass namespace_id=")
        check_namespace(ns)
        if isinstance(pin_id, bool) or not isinstance(pin_id, int):
            raise InvalidArgument(f"a pin id is an integer, got {pin_id!r}")
        with self._st.lock:
            removed = self._st.retention.unpin(pin_id, ns)
        if removed:
            self._save()
        return removed

    def set_budget(self, namespace_id: bytes, tier: str, nbytes: int | None) -> None:
        st = self._st
        st.check_open()
        check_namespace(namespace_id)
        if not isinstance(tier, str):
            raise InvalidArgument(f"a budget names its tier, got {tier!r}",
                                  hint=f"tiers are {list(st.by_name)}")
        ti = st.tier_index(tier)
        if isinstance(st.tiers[ti], OwnedPool):
            raise InvalidArgument(
                f"tier {tier!r} is an engine's block pool: its blocks are allocated to running "
                "requests, not budgeted", hint="budget the tiers below it (host, disk, redis)")
        with st.lock:
            st.budgets.set(ti, namespace_id, nbytes)
        self._save()

    def info(self, namespace_id: bytes) -> RetentionInfo:
        st = self._st
        st.check_open()
        check_namespace(namespace_id)
        page = st.layout.page_bytes
        with st.lock:
            pins = tuple(st.retention.pins_of(namespace_id))
            pinned = {k for p in pins for k in p.keys}
            tiers = []
            for ti, tier in enumerate(st.tiers):
                held = sum(1 for k in pinned if st.budgets.owner(ti, k) == namespace_id)
                cap = st.budgets.limit(ti, namespace_id)
                tiers.append(TierRetention(tier.name, st.budgets.pages(ti, namespace_id) * page,
                                           held * page, None if cap is None else cap * page))
        return RetentionInfo(namespace_id, pins, tuple(tiers))

    def namespace_of(self, key: bytes) -> bytes | None:
        """The namespace a local tier holds ``key`` under, or None (shared tiers are not
        asked: that would be a network call)."""
        for t in self._st.tiers:
            if not t.shared:
                meta = t.meta(key)
                if meta is not None:
                    return meta.namespace_id
        return None

    def refuse_foreign(self, keys: list[bytes], namespace_id: bytes, what: str) -> None:
        """InvalidArgument when a tier holds one of ``keys`` under another namespace (lock
        held: the accounting answers for every tier, a shared one's too, with no I/O)."""
        owner, tiers = self._st.budgets.owner, range(len(self._st.tiers))
        for k in keys:
            for ti in tiers:
                holder = owner(ti, k)
                if holder is not None and holder != namespace_id:
                    raise InvalidArgument(f"key {k.hex()} is held under another namespace; "
                                          f"nothing was {what}")


__all__ = ["StoreRetention"]
