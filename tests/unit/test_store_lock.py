"""The store lock guards bookkeeping only: a tier's slow I/O -- a disk delete waiting on an
fsync, a write -- runs outside it, so leased lookups (which take the lock) never wait for it.
The disk tier here blocks inside ``delete`` and ``write`` until the test lets it go; a lookup
that needed the lock meanwhile would hang."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvstore import KVLayout, Namespace, TieredStore
from kvstore.metrics import Metrics
from kvstore.tiers.host import HostTier
from tests.gated_tiers import GatedDisk

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=16, block_size=4, dtype="float16")
NS = Namespace("lock", LAYOUT)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[TieredStore, GatedDisk]]:
    m = Metrics()
    disk = GatedDisk.build("disk", LAYOUT, 64, m, path=tmp_path / "d", durability="none",
                     preallocate=False)
    s = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 8, m, pin_memory=False), disk],
                    write_policy="write_through")
    yield s, disk
    disk.gate.set()
    disk.after_delete.set()
    s.check_integrity()
    s.close()


def _pages(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, LAYOUT.page_bytes), np.uint8)


def _in_thread(fn: Any) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def _leased_lookup_finishes(s: TieredStore, keys: tuple[bytes, ...]) -> int:
    """A leased lookup on another thread; it must finish while the tier is blocked."""
    out: list[int] = []

    def look() -> None:
        found = s.lookup(keys, lease=True, namespace_id=NS.id)
        out.append(found.num_blocks)
        if found.lease is not None:
            s.release(found.lease)

    _in_thread(look).join(5)
    assert out, "a leased lookup waited for a tier's I/O under the store lock"
    return out[0]


def test_a_lookup_does_not_wait_for_a_disk_delete(store: tuple[TieredStore, GatedDisk]) -> None:
    s, disk = store
    gone = NS.chain(list(range(4 * 4)))
    kept = NS.chain(list(range(100, 100 + 4 * 4)))
    s.put(gone.metas(), _pages(4, 1))
    s.put(kept.metas(), _pages(4, 2))
    disk.gate.clear()
    deleter = _in_thread(lambda: s.delete(list(gone.keys), namespace_id=NS.id))
    assert disk.in_delete.wait(5)
    assert _leased_lookup_finishes(s, tuple(kept.keys)) == 4
    # a page being deleted is not leased: the lease would pin a page that is going
    assert _leased_lookup_finishes(s, tuple(gone.keys)) == 0
    disk.gate.set()
    deleter.join(5)
    assert s.lookup(list(gone.keys)).num_blocks == 0
    assert s.lookup(list(kept.keys)).num_blocks == 4


def test_a_lookup_does_not_wait_for_an_eviction_from_disk(
        store: tuple[TieredStore, GatedDisk]) -> None:
    s, disk = store
    kept = NS.chain(list(range(4 * 4)))
    s.put(kept.metas(), _pages(4, 3))
    disk.gate.clear()
    # more pages than the host holds: the put evicts host pages and writes them through to a
    # disk whose writes wait
    many = NS.chain(list(range(1000, 1000 + 4 * 12)))
    writer = _in_thread(lambda: s.put(many.metas(), _pages(12, 4)))
    assert disk.in_write.wait(5)
    assert _leased_lookup_finishes(s, tuple(kept.keys)) in (0, 4)  # host may have evicted them
    disk.gate.set()
    writer.join(10)
    assert s.lookup(list(many.keys)).num_blocks == 12


def test_a_write_landing_while_its_key_is_deleted_is_tracked(
        store: tuple[TieredStore, GatedDisk]) -> None:
    """A write that checked its key before a delete marked it, and landed after the delete
    ran, leaves a page the tier holds: the delete's end tracks it (check_integrity: the policy
    tracks exactly the tier's pages)."""
    s, disk = store
    chain = NS.chain(list(range(500, 500 + 4)))
    gate_write, writing = threading.Event(), threading.Event()
    original_write = disk.write

    def held_write(metas: Any, pages: Any) -> Any:
        writing.set()
        assert gate_write.wait(30)
        return original_write(metas, pages)

    disk.write = held_write  # type: ignore[method-assign]
    writer = _in_thread(lambda: s.put(chain.metas(), _pages(1, 9)))
    assert writing.wait(5)  # the writer checked its key and waits inside the disk's write
    disk.after_delete.clear()
    deleter = _in_thread(lambda: s.delete(list(chain.keys)))
    assert disk.deleted.wait(5)  # deleted (nothing there yet) and held before its end
    gate_write.set()
    writer.join(5)  # the page lands; its admission skips a key being deleted
    disk.after_delete.set()
    deleter.join(5)
    s.check_integrity()
    assert s.lookup(list(chain.keys)).num_blocks == 1
