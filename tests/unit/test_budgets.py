"""Per-namespace byte budgets per tier (kvstore.budgets) in the store: a namespace at its budget
makes room among its own pages -- demoted to the tier below where write-back applies, dropped
at the last tier -- and never evicts another namespace's; its pinned pages stay, and what it
cannot make room for is refused; the accounting the budgets judge by equals the tiers' real
contents; through puts and through the staging path alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvstore import InvalidArgument, KVLayout, Namespace, TieredStore, build_tier
from kvstore.budgets import Budgets

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=16, block_size=4, dtype="float16")
A = Namespace("budgets", LAYOUT, "tenant-a")
B = Namespace("budgets", LAYOUT, "tenant-b")
PAGE = LAYOUT.page_bytes


def _host_disk(tmp: Path, host_pages: int = 32, disk_pages: int = 64) -> TieredStore:
    host = build_tier({"kind": "host", "capacity": host_pages * PAGE}, LAYOUT)
    disk = build_tier({"kind": "disk", "capacity": disk_pages * PAGE, "path": str(tmp),
                       "durability": "none"}, LAYOUT)
    return TieredStore(LAYOUT, [host, disk], free_reserve=0.0)


def _put(store: TieredStore, ns: Namespace, first: int, n: int) -> tuple[list[bytes], int]:
    """Store ``n`` pages of ``ns`` (a chain from token ``4 * first``), 4 at a time; their keys
    and how many were refused. Page i holds the byte (first + i) % 251."""
    chain = ns.chain(list(range(4 * first, 4 * (first + n))))
    metas, refused = chain.metas(), 0
    for i in range(0, n, 4):
        part = metas[i:i + 4]
        pages = np.stack([np.full(PAGE, (first + i + j) % 251, np.uint8) for j in range(len(part))])
        refused += store.put(part, pages).refused
    store.drain()
    return chain.keys, refused


def _used(store: TieredStore, ns: Namespace, tier: str) -> int:
    return next(t.used_bytes for t in store.retention(ns.id).tiers if t.tier == tier) // PAGE


def test_a_namespace_at_its_budget_evicts_its_own_pages_never_another_s(tmp_path: Path) -> None:
    store = _host_disk(tmp_path)
    try:
        b_keys, _ = _put(store, B, 0, 8)
        store.set_budget(A.id, "host", 8 * PAGE)
        a_keys, refused = _put(store, A, 1000, 24)
        host, disk = store.tier("host"), store.tier("disk")
        assert refused == 0
        assert all(host.contains(b_keys)), "tenant A's budget evicted tenant B's pages"
        assert _used(store, A, "host") == 8 == sum(host.contains(a_keys))
        # A's older pages went down a tier (write-back), not away; the newest stayed in host
        assert all(disk.contains(a_keys[:16])) and all(host.contains(a_keys[16:]))
        out = np.zeros((len(a_keys), PAGE), np.uint8)
        assert all(store.get(A.id, a_keys, out).found)
        for i, page in enumerate(out):
            assert (page == (1000 + i) % 251).all()
        info = {t.tier: t for t in store.retention(A.id).tiers}
        assert info["host"].budget_bytes == 8 * PAGE and info["disk"].budget_bytes is None
        assert info["disk"].used_bytes >= 16 * PAGE
        assert _used(store, B, "host") == 8
        store.check_integrity()
    finally:
        store.close()


def test_at_the_last_tier_a_namespace_over_budget_drops_its_own_coldest(tmp_path: Path) -> None:
    store = _host_disk(tmp_path)
    try:
        b_keys, _ = _put(store, B, 0, 8)
        store.set_budget(A.id, "host", 4 * PAGE)
        store.set_budget(A.id, "disk", 12 * PAGE)
        a_keys, _ = _put(store, A, 1000, 40)
        disk = store.tier("disk")
        assert _used(store, A, "disk") <= 12 and _used(store, A, "host") <= 4
        assert all(store.tier("host").contains(b_keys))
        held = [k for k, here in zip(a_keys, disk.contains(a_keys)) if here]
        assert held and set(held) <= set(a_keys[-16:]), "the budget dropped a newer page first"
    finally:
        store.close()


def test_pinned_pages_stay_and_what_cannot_make_room_is_refused(tmp_path: Path) -> None:
    host = build_tier({"kind": "host", "capacity": 32 * PAGE}, LAYOUT)
    store = TieredStore(LAYOUT, [host], free_reserve=0.0)
    try:
        store.set_budget(A.id, "host", 4 * PAGE)
        a_keys, _ = _put(store, A, 0, 4)
        store.pin(A.id, a_keys, ttl_s=60)
        more, refused = _put(store, A, 1000, 8)
        assert all(host.contains(a_keys)), "a budget evicted a pinned page"
        assert refused == 8 and not any(host.contains(more))
        info = {t.tier: t for t in store.retention(A.id).tiers}
        assert info["host"].pinned_bytes == 4 * PAGE == info["host"].used_bytes
        assert len(store.retention(A.id).pins) == 1
        store.set_budget(A.id, "host", None)  # no budget: A fills free room again
        _, refused = _put(store, A, 2000, 8)
        assert refused == 0 and _used(store, A, "host") == 12
    finally:
        store.close()


def test_a_lowered_budget_takes_effect_on_the_namespace_s_next_write() -> None:
    host = build_tier({"kind": "host", "capacity": 32 * PAGE}, LAYOUT)
    store = TieredStore(LAYOUT, [host], free_reserve=0.0)
    try:
        _put(store, A, 0, 16)
        store.set_budget(A.id, "host", 6 * PAGE + PAGE // 2)  # whole pages: 6
        assert _used(store, A, "host") == 16  # nothing moves until A writes
        _put(store, A, 1000, 4)
        assert _used(store, A, "host") == 6
    finally:
        store.close()


def test_the_staging_path_keeps_to_the_budget_too() -> None:
    host = build_tier({"kind": "host", "capacity": 32 * PAGE}, LAYOUT)
    store = TieredStore(LAYOUT, [host], free_reserve=0.0)
    try:
        b_keys, _ = _put(store, B, 0, 8)
        store.set_budget(A.id, "host", 4 * PAGE)
        for first in (100, 200, 300):
            chain = A.chain(list(range(4 * first, 4 * first + 16)))
            handle = store.prepare_store(chain.metas())
            assert handle.refused == 0
            for slot in handle.slots:
                handle.slab[slot] = 7
            store.complete_store(handle)
        assert _used(store, A, "host") == 4
        assert all(host.contains(b_keys))
    finally:
        store.close()


def test_the_accounting_equals_the_tiers_contents_after_deletes_and_evictions(
        tmp_path: Path) -> None:
    store = _host_disk(tmp_path, host_pages=16, disk_pages=24)
    try:
        a_keys, _ = _put(store, A, 0, 30)
        b_keys, _ = _put(store, B, 500, 20)
        store.delete(a_keys[:5], namespace_id=A.id)
        store.evict(6, tier="host")
        for name in ("host", "disk"):
            tier = store.tier(name)
            for ns, keys in ((A, a_keys), (B, b_keys)):
                assert _used(store, ns, name) == sum(tier.contains(keys)), (name, ns.tenant_salt)
    finally:
        store.close()


def test_bad_budgets_are_refused_and_change_nothing() -> None:
    host = build_tier({"kind": "host", "capacity": 8 * PAGE}, LAYOUT)
    store = TieredStore(LAYOUT, [host], free_reserve=0.0)
    try:
        store.set_budget(A.id, "host", 4 * PAGE)
        for tier, nbytes, what in (("nvme", PAGE, "no tier named 'nvme'"),
                                   ("host", -1, "whole number"), ("host", 1.5, "whole number"),
                                   ("host", True, "whole number"), (None, PAGE, "names its tier")):
            with pytest.raises(InvalidArgument, match=what):
                store.set_budget(A.id, tier, nbytes)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            store.set_budget(b"short", "host", PAGE)
        assert store.retention(A.id).tiers[0].budget_bytes == 4 * PAGE
    finally:
        store.close()


def test_the_budget_table_counts_each_page_once() -> None:
    b = Budgets(["host"], PAGE)
    b.entered(0, [b"k" * 16, b"k" * 16, b"j" * 16], [A.id, A.id, None])
    assert b.pages(0, A.id) == 1 and b.owner(0, b"j" * 16) is None
    b.set(0, A.id, 3 * PAGE)
    assert b.over(0, A.id, 2) == 0 and b.over(0, A.id, 4) == 2
    assert b.left(0, [b"k" * 16, b"x" * 16]) == [A.id, None]
    assert b.pages(0, A.id) == 0


def test_writes_in_flight_count_against_the_budget() -> None:
    """Two saves of one namespace open at once cannot overshoot its budget together (nor make
    room for it out of another namespace's pages)."""
    host = build_tier({"kind": "host", "capacity": 32 * PAGE}, LAYOUT)
    store = TieredStore(LAYOUT, [host], free_reserve=0.0)
    try:
        b_keys, _ = _put(store, B, 0, 20)
        store.set_budget(A.id, "host", 8 * PAGE)
        first = store.prepare_store(A.chain(list(range(0, 32))).metas())
        second = store.prepare_store(A.chain(list(range(1000, 1032))).metas())
        assert first.num_blocks == 8 and second.num_blocks == 0 and second.refused == 8
        store.complete_store(first)
        store.complete_store(second)
        assert _used(store, A, "host") == 8 and all(host.contains(b_keys))
        third = store.prepare_store(A.chain(list(range(2000, 2016))).metas())
        assert third.num_blocks == 4  # its own 8 make the room
        store.abort(third)
        assert _used(store, A, "host") == 4  # given up: the room goes back to the tier
        store.check_integrity()
    finally:
        store.close()
