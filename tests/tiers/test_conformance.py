"""The contract of kvstore.tiers.base.Tier, checked for every tier kind."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kvstore import InvalidArgument, KVLayout, Namespace
from kvstore.errors import StoreClosed
from kvstore.record import stored_meta
from tests.conftest import random_pages


def test_round_trip(make_tier, layout: KVLayout, ns: Namespace) -> None:
    tier = make_tier(layout, 8)
    chain = ns.chain(list(range(4 * 5)))
    pages = random_pages(layout, 5)
    assert tier.write(chain.metas(), list(pages)) == [True] * 5
    out = np.zeros_like(pages)
    assert tier.read(ns.id, chain.keys, list(out)) == [True] * 5
    assert np.array_equal(out, pages)
    assert tier.contains(chain.keys) == [True] * 5
    assert tier.count_leading(chain.keys) == 5
    assert tier.used_pages == 5 and tier.free_pages == 3
    assert {m.key for m in map(tier.meta, chain.keys)} == set(chain.keys)
    # as kept: a tier that writes records stores no token ids unless configured to
    assert tier.meta(chain.keys[2]) == stored_meta(chain.meta(2), not tier.writes_records)
    # a shared tier adopts nothing on its own: other nodes' pages are not this node's to evict
    assert set(tier.keys()) == (set() if tier.shared else set(chain.keys))
    s = tier.stats()
    assert (s.hits, s.writes, s.bytes_read) == (5, 5, 5 * layout.page_bytes)


def test_misses_and_partial(make_tier, layout: KVLayout, ns: Namespace) -> None:
    tier = make_tier(layout, 8)
    chain = ns.chain(list(range(4 * 4)))
    tier.write([chain.meta(0), chain.meta(2)], list(random_pages(layout, 2)))
    assert tier.contains(chain.keys) == [True, False, True, False]
    assert tier.count_leading(chain.keys) == 1
    out = np.zeros((4, layout.page_bytes), np.uint8)
    assert tier.read(ns.id, chain.keys, list(out)) == [True, False, True, False]
    assert tier.stats().misses == 2


def test_full_tier_refuses_and_resumes(make_tier, layout: KVLayout, ns: Namespace) -> None:
    tier = make_tier(layout, 3)
    chain = ns.chain(list(range(4 * 5)))
    pages = random_pages(layout, 5)
    if tier.shared:  # capacity is this node's budget, kept by the store's policy, not a wall
        assert tier.write(chain.metas(), list(pages)) == [True] * 5
        assert tier.used_pages == 5 and tier.free_pages == 0
        tier.delete(chain.keys[:2])
        assert tier.used_pages == 3
        return
    assert tier.write(chain.metas(), list(pages)) == [True, True, True, False, False]
    assert tier.stats().writes_refused == 2
    assert tier.delete(chain.keys[:2]) == 2
    assert tier.write(chain.metas(3, 5), list(pages[3:])) == [True, True]
    out = np.zeros((3, layout.page_bytes), np.uint8)
    assert tier.read(ns.id, chain.keys[2:], list(out)) == [True] * 3
    assert np.array_equal(out, pages[2:])


def test_overwrite_replaces(make_tier, layout: KVLayout, ns: Namespace) -> None:
    tier = make_tier(layout, 4)
    meta = ns.chain(list(range(4))).meta(0)
    a, b = random_pages(layout, 2)
    tier.write([meta], [a])
    tier.write([meta], [b])
    out = np.zeros((1, layout.page_bytes), np.uint8)
    assert tier.read(ns.id, [meta.key], list(out)) == [True]
    assert np.array_equal(out[0], b) and tier.used_pages == 1


def test_namespace_checked_on_read(make_tier, layout: KVLayout, ns: Namespace) -> None:
    tier = make_tier(layout, 4)
    chain = ns.chain(list(range(4)))
    tier.write(chain.metas(), list(random_pages(layout, 1)))
    other = Namespace("test-model", layout, "tenant-b")
    out = np.zeros((1, layout.page_bytes), np.uint8)
    assert tier.read(other.id, chain.keys, list(out)) == [False]


def test_delete_absent_is_ignored(make_tier, layout: KVLayout, ns: Namespace) -> None:
    tier = make_tier(layout, 4)
    assert tier.delete(ns.chain(list(range(8))).keys) == 0
    assert tier.contains([]) == [] and tier.read(ns.id, [], []) == []


@pytest.mark.parametrize(
    "bad",
    [
        lambda L: [np.zeros(L.page_bytes - 1, np.uint8)],
        lambda L: [np.zeros(L.page_bytes // 2, np.uint16)],
        lambda L: [np.zeros((1, L.page_bytes), np.uint8)],
        lambda L: [np.zeros(L.page_bytes * 2, np.uint8)[::2]],
        lambda L: [bytearray(L.page_bytes)],
        lambda L: [],
    ],
)
def test_bad_buffers(make_tier, layout: KVLayout, ns: Namespace, bad) -> None:
    tier = make_tier(layout, 4)
    meta = ns.chain(list(range(4))).meta(0)
    with pytest.raises(InvalidArgument):
        tier.write([meta], bad(layout))
    with pytest.raises(InvalidArgument):
        tier.read(ns.id, [meta.key], bad(layout))
    assert tier.used_pages == 0
    with pytest.raises(InvalidArgument):
        tier.contains([b"too short"])


def test_concurrent_readers_and_writers(make_tier, layout: KVLayout, ns: Namespace) -> None:
    """Writers overwrite and delete while readers read: a read is a miss or the right bytes."""
    tier = make_tier(layout, 24)
    chains = [ns.chain([t] + list(range(1, 4 * 6))) for t in range(4)]

    def page_for(key: bytes) -> np.ndarray:
        return np.frombuffer(key * (layout.page_bytes // 16), dtype=np.uint8)

    errors: list[str] = []
    stop = threading.Event()

    def writer(chain) -> None:
        for _ in range(60):
            tier.write(chain.metas(), [page_for(k) for k in chain.keys])
            tier.delete(chain.keys[::2])

    def reader() -> None:
        out = np.zeros((6, layout.page_bytes), np.uint8)
        while not stop.is_set():
            for chain in chains:
                found = tier.read(ns.id, chain.keys, list(out))
                for k, f, buf in zip(chain.keys, found, out):
                    if f and not np.array_equal(buf, page_for(k)):
                        errors.append(k.hex())

    readers = [threading.Thread(target=reader) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(c,)) for c in chains]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    assert tier.used_pages <= 24


def test_a_closed_tier_refuses_every_call(make_tier, layout: KVLayout, ns: Namespace) -> None:
    tier = make_tier(layout, 8)
    chain = ns.chain(list(range(4 * 4)))
    pages = random_pages(layout, 4)
    assert tier.write(chain.metas(), list(pages)) == [True] * 4
    tier.close()
    calls = {
        "contains": lambda: tier.contains(chain.keys),
        "count_leading": lambda: tier.count_leading(chain.keys),
        "read": lambda: tier.read(ns.id, chain.keys, list(np.zeros_like(pages))),
        "write": lambda: tier.write(chain.metas(), list(pages)),
        "delete": lambda: tier.delete(chain.keys),
        "meta": lambda: tier.meta(chain.keys[0]),
        "keys": lambda: list(tier.keys()),
        "stats": lambda: tier.stats(),
    }
    for name, call in calls.items():
        with pytest.raises(StoreClosed) as err:
            call()
        assert err.value.message == f"tier {tier.name!r} is closed", name
    tier.close()  # idempotent
