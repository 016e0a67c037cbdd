"""Retention pins (kvstore.retention) in the store: a pin lapses at its TTL on the store's clock
and its pages become evictable; pins are bounded; a pin of keys not stored yet keeps them once
they arrive; a pin holds in every tier (host and disk here)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from kvstore import InvalidArgument, KVLayout, Namespace, TieredStore, build_tier
from kvstore.retention import Retention

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=16, block_size=4, dtype="float16")
NS = Namespace("retention", LAYOUT)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _store(tmp: Path, clock: Clock) -> TieredStore:
    host = build_tier({"kind": "host", "capacity": 8 * LAYOUT.page_bytes}, LAYOUT)
    disk = build_tier({"kind": "disk", "capacity": 16 * LAYOUT.page_bytes, "path": str(tmp),
                       "durability": "none"}, LAYOUT)
    # write-through: every page in both tiers, so the pin must hold in each
    return TieredStore(LAYOUT, [host, disk], clock=clock, free_reserve=0.0,
                       write_policy="write_through")


def _flood(store: TieredStore, first: int, n: int) -> None:
    chain = NS.chain(list(range(4 * first, 4 * (first + n))))
    for i in range(0, n, 4):
        store.put(chain.metas()[i:i + 4], np.zeros((min(4, n - i), LAYOUT.page_bytes), np.uint8))
    store.drain()


def test_a_pin_lapses_at_its_ttl_and_holds_in_every_tier_until_then(tmp_path: Path) -> None:
    clock = Clock()
    store = _store(tmp_path, clock)
    try:
        keys = NS.chain(list(range(4 * 3))).keys
        store.pin(NS.id, keys, ttl_s=60)  # before they exist: kept once they arrive
        _flood(store, 0, 3)
        _flood(store, 1000, 10 * 16)  # ten times the disk's pages
        host, disk = store.tier("host"), store.tier("disk")
        assert all(host.contains(keys)) and all(disk.contains(keys))
        store.evict(8, tier="host")  # an explicit eviction of host takes no pinned page
        assert all(host.contains(keys))
        clock.now += 61  # lapsed
        _flood(store, 5000, 10 * 16)
        assert not any(host.contains(keys)) and not any(disk.contains(keys))
    finally:
        store.close()


def test_pins_are_bounded_and_a_refused_pin_changes_nothing() -> None:
    r = Retention(4, Clock())
    r.pin(NS.id, [b"a" * 16, b"b" * 16], ttl_s=10)
    with pytest.raises(InvalidArgument, match="more than the 4 pins may hold"):
        r.pin(NS.id, [b"c" * 16, b"d" * 16, b"e" * 16], ttl_s=10)
    assert sorted(r.pinned_keys()) == [b"a" * 16, b"b" * 16]
    r.pin(NS.id, [b"a" * 16, b"c" * 16, b"d" * 16], ttl_s=10)  # a counts once
    assert len(r.pinned_keys()) == 4


def test_an_unpinned_key_stays_held_while_another_pin_names_it() -> None:
    r = Retention(8, Clock())
    first = r.pin(NS.id, [b"a" * 16], ttl_s=10)
    r.pin(NS.id, [b"a" * 16, b"b" * 16], ttl_s=10)
    assert r.unpin(first.id, NS.id) and r.holds(b"a" * 16)
    assert not r.unpin(first.id + 1, b"x" * 16)  # another namespace's: not told, not removed
    assert r.holds(b"b" * 16)


def test_pins_and_budgets_outlive_a_restart_with_a_disk_tier(tmp_path: Path) -> None:
    clock = Clock()
    store = _store(tmp_path, clock)
    keys = NS.chain(list(range(4 * 3))).keys
    other = Namespace("retention", LAYOUT, "other")
    try:
        _flood(store, 0, 3)
        kept = store.pin(NS.id, keys, ttl_s=3600)
        short = store.pin(NS.id, keys[:1], ttl_s=0.2)
        store.set_budget(other.id, "disk", 5 * LAYOUT.page_bytes)
    finally:
        store.close()
    time.sleep(0.3)  # the short pin lapses while the store is down (wall-clock time)
    store = _store(tmp_path, Clock())
    try:
        info = store.retention(NS.id)
        assert [p.id for p in info.pins] == [kept.id] and info.pins[0].keys == tuple(keys)
        assert short.id not in [p.id for p in info.pins]
        budget = {t.tier: t.budget_bytes for t in store.retention(other.id).tiers}
        assert budget == {"host": None, "disk": 5 * LAYOUT.page_bytes}
        _flood(store, 1000, 10 * 16)  # ten times the disk: the restored pin holds
        assert all(store.tier("disk").contains(keys))
        fresh = store.pin(NS.id, keys[:1], ttl_s=10)
        assert fresh.id > kept.id  # ids stay unique across the restart
        assert store.unpin(kept.id, namespace_id=NS.id)
    finally:
        store.close()
    store = _store(tmp_path, Clock())
    try:  # the unpin was saved too
        assert [p.id for p in store.retention(NS.id).pins] == [fresh.id]
    finally:
        store.close()


def test_a_retention_file_someone_else_wrote_is_set_aside_not_trusted(tmp_path: Path) -> None:
    (tmp_path / "retention.json").write_text('{"version": 1, "pins": [{"id": "x"}]}')
    store = _store(tmp_path, Clock())
    try:
        assert store.retention(NS.id).pins == ()
        assert (tmp_path / "retention.json.bad").exists()
    finally:
        store.close()


def test_a_full_disk_keeps_the_pin_in_memory_and_the_last_good_file(tmp_path: Path) -> None:
    """The disk tier's filesystem fills up (a real 8 MiB tmpfs, filled by a file): a pin is
    still made and holds in memory, the last good retention file stays as it was, no temporary
    file is left behind; once there is room again the next change is saved."""
    from tests.tiers.test_disk_faults import fill, small_filesystem

    with small_filesystem(tmp_path, "tmpfs", 8) as mnt:
        store = _store(mnt / "disk", Clock())
        try:
            keys = NS.chain(list(range(4 * 2))).keys
            first = store.pin(NS.id, keys[:1], ttl_s=600)
            saved = (mnt / "disk" / "retention.json").read_text()
            filler = fill(mnt)
            second = store.pin(NS.id, keys, ttl_s=600)
            assert {p.id for p in store.retention(NS.id).pins} == {first.id, second.id}
            assert (mnt / "disk" / "retention.json").read_text() == saved
            assert not (mnt / "disk" / "retention.json.tmp").exists()
            filler.unlink()
            store.unpin(first)
        finally:
            store.close()
        store = _store(mnt / "disk", Clock())
        try:
            assert [p.id for p in store.retention(NS.id).pins] == [second.id]
        finally:
            store.close()
