"""Eviction ahead of need (kvstore.cleaner): once a tier has had to evict, its cleaner keeps a
free reserve, so a writer -- a save, an engine's block allocation -- finds room and never waits
on the tier below. The tier below here is gated: its writes block until the test lets them go;
a writer that evicted (and wrote back) for itself would hang with it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kvstore import InvalidArgument, KVLayout, Metrics, Namespace, TieredStore
from kvstore.tiers.hbm import HBMTier
from tests.gated_tiers import GatedDisk, GatedHost

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=16, block_size=4, dtype="float16")
NS = Namespace("cleaner", LAYOUT)


def _pages(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, LAYOUT.page_bytes), np.uint8)


def _chain(start: int, n: int) -> Any:
    return NS.chain(list(range(start * 4, (start + n) * 4)))


def _returns_while_gated(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on another thread; it must return within 10 s (the gate stays shut)."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), name="engine", daemon=True)
    t.start()
    t.join(10)
    assert out, "the writer waited for the gated tier below"
    return out[0]


def _inline(m: Metrics, tier: str) -> float:
    return m.value("kvstore_inline_evictions_total", tier=tier)


def test_a_full_host_is_cleaned_ahead_and_saves_never_wait_on_the_disk(tmp_path: Path) -> None:
    m = Metrics()
    disk = GatedDisk.build("disk", LAYOUT, 400, m, path=tmp_path / "d", durability="none",
                     preallocate=False)
    from kvstore.tiers.host import HostTier
    s = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 40, m, pin_memory=False), disk],
                    free_reserve=0.25, metrics=m)  # low 10, high 20 pages free
    host = s.tier("host")
    try:
        written = {}
        first = _chain(0, 40)
        s.put(first.metas(), _pages(40, 1))
        written.update(zip(first.keys, _pages(40, 1)))
        assert host.used_pages == 40 and _inline(m, "host") == 0  # filling evicts nothing
        one = _chain(40, 1)
        s.put(one.metas(), _pages(1, 2))  # full: this writer evicts for itself, once
        written.update(zip(one.keys, _pages(1, 2)))
        assert _inline(m, "host") == 1
        assert s.drain(10)
        assert host.free_pages == 20  # the cleaner made the high water mark of room

        disk.gate.clear()  # the disk hangs from now on
        batch = _chain(100, 11)  # 20 -> 9 free: below the low mark, the cleaner starts
        res = _returns_while_gated(lambda: s.put(batch.metas(), _pages(11, 3)))
        written.update(zip(batch.keys, _pages(11, 3)))
        assert res.stored == 11
        assert disk.in_write.wait(10)  # the cleaner is the one waiting on the disk
        assert "engine" not in disk.writers
        assert _inline(m, "host") == 1
        found = s.lookup(list(batch.keys), lease=True, namespace_id=NS.id)  # not held up
        assert found.num_blocks == 11
        s.release(found.lease)

        disk.gate.set()
        assert s.drain(10)
        s.check_integrity()
        keys = list(written)
        out = np.zeros((len(keys), LAYOUT.page_bytes), np.uint8)
        assert all(s.get(NS.id, keys, out).found)  # every page, in host or on disk
        assert all(np.array_equal(out[i], written[k]) for i, k in enumerate(keys))
    finally:
        disk.gate.set()
        s.close()


def test_an_engine_allocation_never_writes_back_on_its_thread() -> None:
    """The engine's block pool over a host tier (write-back): after the first allocation that
    had to evict, the pool keeps free blocks, and allocations take them while the write-back
    into host hangs."""
    m = Metrics()
    pool = HBMTier.build("hbm", LAYOUT, 64, m, device="cpu")
    host = GatedHost.build("host", LAYOUT, 256, m, pin_memory=False)
    s = TieredStore(LAYOUT, [pool, host], free_reserve=0.25, metrics=m)  # low 16, high 32
    try:
        chain = _chain(0, 64)
        blocks = pool.allocate(64)
        assert blocks is not None
        pages = _pages(64, 4)
        for b, page in zip(blocks, pages):
            pool.pool_bytes[b] = torch.from_numpy(page)
        pool.commit(blocks, chain.metas())
        pool.release(blocks)  # 64 cached blocks, none free
        first = pool.allocate(1)  # evicts one block itself (writing it back), once
        assert first is not None and _inline(m, "hbm") == 1
        assert s.drain(10)
        assert pool.num_free == 32

        host.gate.clear()
        took = _returns_while_gated(lambda: [pool.allocate(1) for _ in range(17)])
        assert all(t is not None for t in took)  # 32 -> 15 free: the cleaner starts
        assert host.in_write.wait(10)
        assert "engine" not in host.writers and _inline(m, "hbm") == 1

        host.gate.set()
        assert s.drain(10)
        pool.release([b for t in took for b in t] + first)
        s.check_integrity()
        out = np.zeros((64, LAYOUT.page_bytes), np.uint8)
        assert all(s.get(NS.id, list(chain.keys), out).found)  # in hbm or written back
        assert np.array_equal(out, pages)
    finally:
        host.gate.set()
        s.close()


def test_no_reserve_means_writers_evict_as_before(tmp_path: Path) -> None:
    from kvstore.tiers.host import HostTier
    m = Metrics()
    s = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 40, m, pin_memory=False),
                             HostTier.build("below", LAYOUT, 100, m, pin_memory=False)],
                    free_reserve=0.0, metrics=m)
    try:
        s.put(_chain(0, 45).metas(), _pages(45, 5))
        assert s.drain(10)
        assert s.tier("host").used_pages == 40 and _inline(m, "host") == 5
    finally:
        s.close()


@pytest.mark.parametrize("bad", [-0.1, 0.6, float("nan")])
def test_a_reserve_out_of_range_is_refused(bad: float) -> None:
    from kvstore.tiers.host import HostTier
    with pytest.raises(InvalidArgument, match="free_reserve"):
        TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 40, Metrics(), pin_memory=False)],
                    free_reserve=bad)


def test_a_tier_whose_pages_are_all_pinned_is_not_rescanned_on_every_write() -> None:
    """Every page leased: a cleaning pass finds nothing to evict, and the cleaner rests instead
    of scanning the pinned policy again (under the store lock) for each of the writes that
    follow, all refused."""
    from kvstore.tiers.host import HostTier
    m = Metrics()
    s = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 40, m, pin_memory=False),
                             HostTier.build("below", LAYOUT, 400, m, pin_memory=False)],
                    free_reserve=0.25, metrics=m)
    cleaner = s._room.cleaner
    cleaner.rest_s = 30.0
    jobs: list[int] = []
    submit = cleaner._submit

    def counting(*a: Any, **k: Any) -> bool:
        jobs.append(1)
        return submit(*a, **k)

    cleaner._submit = counting
    try:
        full = _chain(0, 40)
        s.put(full.metas(), _pages(40, 6))
        leases = [s.lookup([k], lease=True).lease for k in full.keys]
        assert all(x is not None for x in leases) and not jobs  # filling evicts nothing
        for i in range(50):  # full of pinned pages: each write is refused, none evicts
            assert s.put(_chain(1000 + i, 1).metas(), _pages(1, i)).refused == 1
            assert s.drain(10)
        assert len(jobs) == 1  # one pass found nothing to evict; the cleaner rests since
        for x in leases:
            s.release(x)
    finally:
        s.close()
