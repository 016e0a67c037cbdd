"""The store's event log tells the whole truth: an Indexer fed only by a real store's events (and
by snapshots when it falls behind the log's window) holds exactly what each tier holds, after
every step of random puts, reads (promotions), evictions (demotions), deletes and corruptions
found on read -- over a real host tier and a real disk tier."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvstore import InvalidArgument, KVLayout, Namespace, TieredStore, build_tier
from kvstore.indexer import Indexer
from kvstore.tiers import disk_io

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=16, block_size=4, dtype="float16")
NS = Namespace("events", LAYOUT)
CHAIN = NS.chain(list(range(4 * 40)))  # 40 pages a test draws from
HOST_PAGES, DISK_PAGES = 6, 12


def _page(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, LAYOUT.page_bytes, np.uint8)


def _store(path: Path, log_events: int = 64) -> TieredStore:
    host = build_tier({"kind": "host", "capacity": HOST_PAGES * LAYOUT.page_bytes}, LAYOUT)
    disk = build_tier({"kind": "disk", "capacity": DISK_PAGES * LAYOUT.page_bytes,
                       "path": str(path), "durability": "none"}, LAYOUT)
    return TieredStore(LAYOUT, [host, disk], write_policy="write_back", free_reserve=0.0,
                       event_log_events=log_events)


class StoreEvents(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="kvstore-events-"))
        self.store = _store(self.dir / "disk", log_events=6)  # small: consumers fall behind
        self.index = Indexer()
        self.cursor = self.store.read_events().next_cursor
        self.snapshots = 0

    def teardown(self) -> None:
        try:
            self.caught_up_the_index_is_the_store()  # every run ends with a check
        finally:
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------- what changes the store

    @rule(start=st.integers(0, 39), n=st.integers(1, 8))
    def put(self, start: int, n: int) -> None:
        idx = list(range(start, min(40, start + n)))
        metas = [CHAIN.metas()[i] for i in idx]
        self.store.put(metas, np.stack([_page(i) for i in idx]))
        self.store.drain()

    @rule(start=st.integers(0, 39), n=st.integers(1, 6))
    def get(self, start: int, n: int) -> None:
        idx = list(range(start, min(40, start + n)))
        out = np.zeros((len(idx), LAYOUT.page_bytes), np.uint8)
        res = self.store.get(NS.id, [CHAIN.keys[i] for i in idx], out)
        for i, found, page in zip(idx, res.found, out):
            assert not found or np.array_equal(page, _page(i))  # never wrong KV
        self.store.drain()  # promotions into host

    @rule(tier=st.sampled_from(["host", "disk"]), n=st.integers(1, 4))
    def evict(self, tier: str, n: int) -> None:
        self.store.evict(n, tier=tier)
        self.store.drain()

    @rule(start=st.integers(0, 39), n=st.integers(1, 4))
    def delete(self, start: int, n: int) -> None:
        self.store.delete([CHAIN.keys[i] for i in range(start, min(40, start + n))])

    @rule(pick=st.integers(0, 39))
    def corrupt_one_on_disk(self, pick: int) -> None:
        """Flip a payload byte of a page only the disk holds; a read finds it and misses."""
        host, disk = self.store.tier("host"), self.store.tier("disk")
        only_disk = [i for i in range(40) if disk.contains([CHAIN.keys[i]])[0]
                     and not host.contains([CHAIN.keys[i]])[0]]
        if not only_disk:
            return
        i = only_disk[pick % len(only_disk)]
        slot = disk.slot_of(CHAIN.keys[i])  # type: ignore[attr-defined]
        payload = disk.slot_bytes - disk_io.round_up(LAYOUT.page_bytes)  # type: ignore[attr-defined]
        offset = slot * disk.slot_bytes + payload  # type: ignore[attr-defined]
        fd = os.open(self.dir / "disk" / "slots.dat", os.O_RDWR)
        try:
            os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ 0xFF]), offset)
        finally:
            os.close(fd)
        out = np.zeros((1, LAYOUT.page_bytes), np.uint8)
        assert not self.store.get(NS.id, [CHAIN.keys[i]], out).found[0]
        self.store.drain()

    # ------------------------------------------------------------- the consumer

    @rule(limit=st.integers(1, 8))
    def read_some(self, limit: int) -> None:
        self._read(limit)

    def _read(self, limit: int) -> bool:
        batch = self.store.read_events(self.cursor, limit=limit)
        if batch.gap:
            snap = self.store.event_snapshot()
            self.index.apply_snapshot("node", snap)
            self.cursor = snap.cursor
            self.snapshots += 1
            return True
        for ev in batch.events:
            self.index.apply("node", ev)
        self.cursor = batch.next_cursor
        return bool(batch.events)

    @rule()
    def caught_up_the_index_is_the_store(self) -> None:
        while self._read(8):
            pass
        real = {t.name: {k for k in CHAIN.keys if t.contains([k])[0]} for t in self.store.tiers}
        known = self.index.contents("node")
        assert {t: known.get(t, set()) for t in real} == real


TestStoreEvents = StoreEvents.TestCase
TestStoreEvents.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


# ------------------------------------------------------------------ single behaviours


def test_a_demotion_is_a_move_and_a_delete_names_its_reason(tmp_path: Path) -> None:
    store = _store(tmp_path / "d")
    try:
        start = store.read_events().next_cursor
        metas = CHAIN.metas()[:HOST_PAGES + 2]  # two more than host holds: two demotions
        store.put(metas, np.stack([_page(i) for i in range(len(metas))]))
        store.drain()
        events = store.read_events(start, limit=100).events
        moved = [e for e in events if e.kind == "moved"]
        assert moved and all(e.reason == "demoted" and e.tier == "host" and e.to_tier == "disk"
                             for e in moved)
        assert sum(len(e.keys) for e in moved) == 2
        assert all(n == NS.id for e in events for n in e.namespace_ids)
        assert [e.seq for e in events] == list(range(start, start + len(events)))
        cursor = store.read_events().next_cursor
        store.delete([metas[-1].key])
        (gone,) = store.read_events(cursor, limit=10).events
        assert (gone.kind, gone.reason, gone.tier, gone.keys) == (
            "removed", "deleted", "host", (metas[-1].key,))
    finally:
        store.close()


def test_the_log_off_is_an_error_that_names_the_setting(tmp_path: Path) -> None:
    store = _store(tmp_path / "d", log_events=0)
    try:
        with pytest.raises(InvalidArgument, match="event_log_events"):
            store.read_events()
        with pytest.raises(InvalidArgument, match="event_log_events"):
            store.event_snapshot()
        store.put(CHAIN.metas()[:2], np.stack([_page(0), _page(1)]))  # nothing to log: no error
    finally:
        store.close()


def test_a_reader_waiting_on_the_log_is_woken_by_close(tmp_path: Path) -> None:
    import threading

    store = _store(tmp_path / "d")
    cursor = store.read_events().next_cursor
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(
        store._st.events.read(cursor, timeout_s=30)))  # type: ignore[union-attr]
    t.start()
    store.close()
    t.join(5)
    assert not t.is_alive() and got
