"""What a caller can rely on at the store's boundary: leases are bound to the store that granted
them, a closed store refuses every call, bad arguments are refused by name and change nothing,
and the staging path's handles follow their contract."""

from __future__ import annotations

import numpy as np
import pytest

from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.errors import InvalidArgument, LeaseError, StoreClosed
from kvstore.policy import make_policy
from kvstore.tiers.host import HostTier

LAYOUT = KVLayout(1, 1, 8, 4, "float16")  # 64-byte pages
NS = Namespace("contract", LAYOUT)
CHAIN = NS.chain(list(range(4 * 4)))
PAGES = np.random.default_rng(1).integers(0, 256, (4, LAYOUT.page_bytes), dtype=np.uint8)


def store(pages: int = 8, **kw: object) -> TieredStore:
    return TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, pages, Metrics())], **kw)  # type: ignore[arg-type]


def out(n: int) -> np.ndarray:
    return np.zeros((n, LAYOUT.page_bytes), np.uint8)


def test_a_lease_of_another_store_is_refused_and_changes_nothing() -> None:
    a, b = store(), store()
    for s in (a, b):
        s.put(CHAIN.metas(), PAGES)
    la = a.lookup(CHAIN.keys, lease=True).lease
    lb = b.lookup(CHAIN.keys, lease=True).lease
    assert la is not None and lb is not None and la.id != lb.id  # unique in the process
    with pytest.raises(InvalidArgument, match="another store"):
        b.get(NS.id, CHAIN.keys, out(4), lease=la)
    with pytest.raises(InvalidArgument, match="another store"):
        b.release(la)
    assert b.stats().active_leases == 1 and a.stats().active_leases == 1
    assert all(b.is_pinned(k) for k in CHAIN.keys) and all(a.is_pinned(k) for k in CHAIN.keys)
    a.release(la)  # A's own release still works
    b.release(lb)
    with pytest.raises(LeaseError):
        a.release(la)


@pytest.mark.parametrize("call", [
    lambda s, h: s.lookup(CHAIN.keys),
    lambda s, h: s.lookup_async(CHAIN.keys),
    lambda s, h: s.put(CHAIN.metas(), PAGES),
    lambda s, h: s.get(NS.id, CHAIN.keys, out(4)),
    lambda s, h: s.prefetch(NS.id, CHAIN.keys),
    lambda s, h: s.delete(CHAIN.keys),
    lambda s, h: s.evict(1),
    lambda s, h: s.stats(),
    lambda s, h: s.check_integrity(),
    lambda s, h: s.release(h["lease"]),
    lambda s, h: s.narrow(h["lease"], 1),
    lambda s, h: s.is_pinned(CHAIN.keys[0]),
    lambda s, h: s.count_declined(NS.id, 1),
    lambda s, h: s.read_bandwidth("host"),
    lambda s, h: s.set_policy("host", "lru"),
    lambda s, h: s.prepare_load(NS.id, CHAIN.keys),
    lambda s, h: s.complete_load(h["load"]),
    lambda s, h: s.prepare_store(CHAIN.metas()),
    lambda s, h: s.complete_store(h["store"]),
    lambda s, h: s.abort(h["store"]),
    lambda s, h: s.staging_tier(),
], ids=["lookup", "lookup_async", "put", "get", "prefetch", "delete", "evict", "stats",
        "check_integrity", "release", "narrow", "is_pinned", "count_declined", "read_bandwidth",
        "set_policy", "prepare_load", "complete_load", "prepare_store",
        "complete_store", "abort", "staging_tier"])
def test_a_closed_store_refuses_work(call) -> None:  # type: ignore[no-untyped-def]
    """Every call but teardown and introspection (drain, tier, closed), with
    the handles and leases it held when it closed too."""
    s = store(16)
    s.put(CHAIN.metas(0, 2), PAGES[:2])
    held = {"lease": s.lookup(CHAIN.keys, lease=True).lease,
            "load": s.prepare_load(NS.id, CHAIN.keys[:2]),
            "store": s.prepare_store(CHAIN.metas(2, 4))}
    s.close()
    with pytest.raises(StoreClosed) as err:
        call(s, held)
    assert (err.value.message, err.value.hint) == (
        "the store is closed", "build a new store; a closed one serves nothing")
    s.close()  # idempotent


@pytest.mark.parametrize("call, names", [
    (lambda s: s.lookup(None), "list or tuple"),
    (lambda s: s.lookup(k for k in CHAIN.keys), "generator"),
    (lambda s: s.get(NS.id, None, out(0)), "list or tuple"),
    (lambda s: s.delete(iter(CHAIN.keys)), "list or tuple"),
    (lambda s: s.evict("a"), "n must be an int"),
    (lambda s: s.evict(-1), "n must be an int"),
    (lambda s: s.prefetch(NS.id[:15], CHAIN.keys), "namespace id must be 16 bytes"),
    (lambda s: s.get(NS.id[:15], CHAIN.keys, out(4)), "namespace id must be 16 bytes"),
    (lambda s: s.put(None, PAGES), "list or tuple of BlockMeta"),
    (lambda s: s.prepare_load(NS.id, CHAIN.keys, lease=3), "another store's lease"),
    (lambda s: s.put(CHAIN.metas(), PAGES, tier=3), "no tier named 3"),
])
def test_bad_arguments_are_refused_by_name_and_change_nothing(call, names) -> None:  # type: ignore[no-untyped-def]
    s = store()
    s.put(CHAIN.metas(0, 2), PAGES[:2])
    before = s.stats()
    with pytest.raises(InvalidArgument, match=names):
        call(s)
    assert s.stats() == before
    s.check_integrity()


@pytest.mark.parametrize("kw, names", [
    ({"prefetch_workers": 0}, "prefetch_workers must be an int >= 1"),
    ({"prefetch_workers": 1.5}, "prefetch_workers"),
    ({"selective_hits": 0}, "selective_hits"),
    ({"lease_ttl_s": 0}, "lease_ttl_s"),
    ({"lease_ttl_s": "30"}, "lease_ttl_s"),
])
def test_bad_store_settings_are_refused_by_name(kw, names) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match=names):
        store(**kw)


@pytest.mark.parametrize("kind", ["host", "disk"])
@pytest.mark.parametrize("capacity", [1.5, "4", True, None])
def test_a_capacity_that_is_not_an_int_is_refused_by_name(kind: str, capacity: object,
                                                          tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kvstore.tiers.disk import DiskTier

    with pytest.raises(InvalidArgument, match="tier 't': capacity_pages must be an int"):
        if kind == "host":
            HostTier.build("t", LAYOUT, capacity, Metrics())  # type: ignore[arg-type]
        else:
            DiskTier.build("t", LAYOUT, capacity, Metrics(), path=tmp_path / "d")  # type: ignore[arg-type]
    assert not (tmp_path / "d").exists()  # nothing created
    with pytest.raises(ValueError, match="policy capacity must be an int"):
        make_policy("lru", capacity)  # type: ignore[arg-type]


def test_an_impossible_host_capacity_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match="host tier 'big' asks for .* of memory"):
        HostTier.build("big", LAYOUT, 10**13, Metrics())


# ----------------------------------------------------------------- staging handles


def test_staging_round_trip_counts_and_pins() -> None:
    s = store(4)
    host = s.tier("host")
    h = s.prepare_store(CHAIN.metas())
    assert h.num_blocks == 4 and (h.existing, h.refused) == (0, 0)
    assert host.contains(CHAIN.keys) == [False] * 4  # invisible until published
    for slot, page in zip(h.slots, PAGES):
        h.slab[slot] = page
    assert s.complete_store(h).stored == 4
    assert host.stats().writes == 4
    again = s.prepare_store(CHAIN.metas())
    assert (again.num_blocks, again.existing) == (0, 4)
    s.complete_store(again)
    lease = s.lookup(CHAIN.keys, lease=True).lease
    load = s.prepare_load(NS.id, CHAIN.keys, lease=lease)
    assert load.num_blocks == 4 and host.stats().hits == 4
    s.delete(CHAIN.keys[:1])  # unlinked, but the pinned slot keeps its bytes
    assert np.array_equal(load.slab[load.slots[0]], PAGES[0])
    assert host.free_pages == 0
    assert s.complete_load(load) == 4
    assert host.free_pages == 1 and s.stats().active_leases == 0
    with pytest.raises(LeaseError, match="already completed"):
        s.complete_load(load)
    s.check_integrity()


def test_an_aborted_store_publishes_nothing_and_frees_its_slots() -> None:
    s = store(4)
    h = s.prepare_store(CHAIN.metas(0, 3))
    assert s.tier("host").free_pages == 1
    s.abort(h)
    assert s.tier("host").free_pages == 4 and s.lookup(CHAIN.keys).num_blocks == 0
    with pytest.raises(LeaseError):
        s.complete_store(h)
    s.check_integrity()


def test_prepare_store_evicts_by_policy_and_refuses_what_is_pinned() -> None:
    s = store(2)
    s.put(CHAIN.metas(0, 2), PAGES[:2])
    pin = s.lookup(CHAIN.keys[:1], lease=True).lease
    h = s.prepare_store(CHAIN.metas(2, 4))  # room for one: block 1 goes, block 0 is pinned
    assert h.num_blocks == 1 and h.refused == 1
    assert s.tier("host").contains(CHAIN.keys[:2]) == [True, False]
    s.abort(h)
    s.release(pin)  # type: ignore[arg-type]
    s.check_integrity()


def test_a_handle_of_another_store_is_refused() -> None:
    a, b = store(), store()
    h = a.prepare_store(CHAIN.metas(0, 1))
    with pytest.raises(InvalidArgument, match="another store"):
        b.complete_store(h)
    a.abort(h)


def test_the_event_log_sees_every_page_stored_and_removed() -> None:
    s = store(3)
    cursor = s.read_events().next_cursor
    s.put(CHAIN.metas(0, 2), PAGES[:2])
    h = s.prepare_store(CHAIN.metas(2, 4))  # room for one more: block 0 (LRU) goes
    for m, slot in zip(h.metas, h.slots):
        h.slab[slot] = PAGES[CHAIN.keys.index(m.key)]
    s.complete_store(h)
    s.delete([CHAIN.keys[3]])
    seen = s.read_events(cursor).events
    got = [(e.kind, e.keys, e.namespace_ids, e.reason) for e in seen]
    assert got == [
        ("stored", tuple(CHAIN.keys[:2]), (NS.id, NS.id), None),
        ("removed", (CHAIN.keys[0],), (NS.id,), "evicted"),
        ("stored", tuple(CHAIN.keys[2:4]), (NS.id, NS.id), None),
        ("removed", (CHAIN.keys[3],), (NS.id,), "deleted"),
    ]
    assert all(e.tier == "host" for e in seen)
    s.check_integrity()
