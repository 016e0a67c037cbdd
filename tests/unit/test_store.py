"""TieredStore behaviour through its public API: write policies, promotion, leases, prefetch,
bad input."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from kvstore import (
    InvalidArgument,
    KVLayout,
    LeaseError,
    Metrics,
    Namespace,
    TieredStore,
    UnknownComponent,
)
from kvstore.leases import LeaseTable
from kvstore.tiers.host import HostTier
from tests.conftest import random_pages


def two_tier(layout: KVLayout, write_policy: str, *, top: int = 4, bottom: int = 64,
             policies=("lru", "lru"), **kw) -> TieredStore:
    m = Metrics()
    return TieredStore(
        layout,
        [HostTier.build("fast", layout, top, m), HostTier.build("slow", layout, bottom, m)],
        list(policies),
        write_policy=write_policy,
        **kw,
    )


def read_all(store: TieredStore, ns: Namespace, keys: list[bytes]) -> tuple[np.ndarray, tuple]:
    out = np.zeros((len(keys), store.layout.page_bytes), dtype=np.uint8)
    res = store.get(ns.id, keys, out)
    return out, res.tiers


def test_round_trip_and_lookup(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_back")
    chain = ns.chain(list(range(24)))
    pages = random_pages(layout, 6)
    assert store.put(chain.metas(0, 3), pages[:3]).stored == 3
    res = store.lookup(chain.keys)
    assert res.num_blocks == 3 and res.tiers == ("fast",) * 3
    out, tiers = read_all(store, ns, chain.keys[:3])
    assert np.array_equal(out, pages[:3]) and tiers == ("fast",) * 3
    store.check_integrity()


def test_put_existing_not_written_again(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_through")
    chain = ns.chain(list(range(8)))
    pages = random_pages(layout, 2)
    store.put(chain.metas(), pages)
    again = store.put(chain.metas(), random_pages(layout, 2, seed=9))
    assert (again.stored, again.existing) == (0, 2)
    out, _ = read_all(store, ns, chain.keys)
    assert np.array_equal(out, pages)  # the first bytes stand
    assert store.tier("slow").stats().writes == 2  # and nothing was written down twice


def test_write_through_reaches_lower_tier(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_through")
    chain = ns.chain(list(range(12)))
    store.put(chain.metas(), random_pages(layout, 3))
    assert store.tier("slow").contains(chain.keys) == [True] * 3
    assert store.tier("fast").contains(chain.keys) == [True] * 3


def test_write_back_only_on_eviction(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_back", top=4)
    chain = ns.chain(list(range(4 * 6)))
    pages = random_pages(layout, 6)
    store.put(chain.metas(0, 4), pages[:4])
    assert store.tier("slow").used_pages == 0  # nothing written down yet
    store.put(chain.metas(4, 6), pages[4:])  # two evictions (LRU: blocks 0 and 1)
    slow = store.tier("slow")
    assert slow.contains(chain.keys) == [True, True, False, False, False, False]
    assert store.tier("fast").contains(chain.keys) == [False, False, True, True, True, True]
    assert store.tier("fast").stats().evictions == 2
    # the evicted pages are served from below, byte for byte
    out, tiers = read_all(store, ns, chain.keys[:2])
    assert np.array_equal(out, pages[:2]) and tiers == ("slow", "slow")
    store.check_integrity()


def test_selective_after_n_hits(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "selective", selective_hits=3, top=4)
    chain = ns.chain(list(range(8)))
    store.put(chain.metas(), random_pages(layout, 2))
    slow = store.tier("slow")
    for expected in ([False, False], [False, False], [True, False]):
        read_all(store, ns, chain.keys[:1])
        store.drain()  # selective copies run on the mover thread, never inside the get
        assert slow.contains(chain.keys) == expected
    # eviction of a page with fewer hits drops it instead of writing it down
    store.evict(4, tier="fast")
    assert slow.contains(chain.keys) == [True, False]
    assert store.lookup(chain.keys).num_blocks == 1


def test_promotion_on_hit(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_back", top=2)
    chain = ns.chain(list(range(16)))
    pages = random_pages(layout, 4)
    store.put(chain.metas(), pages)  # blocks 0,1 end in slow, 2,3 in fast
    out, tiers = read_all(store, ns, chain.keys[:1])
    assert tiers == ("slow",) and np.array_equal(out[0], pages[0])
    store.drain()  # promotion runs on the mover thread, never inside the get
    assert store.lookup(chain.keys[:1]).tiers == ("fast",)


def test_no_promotion_when_disabled(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_back", top=2, promote_on_hit=False)
    chain = ns.chain(list(range(16)))
    store.put(chain.metas(), random_pages(layout, 4))
    read_all(store, ns, chain.keys[:1])
    assert store.lookup(chain.keys[:1]).tiers == ("slow",)


def test_lookup_picks_fastest_tier_and_stops_at_first_miss(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_through", top=8)
    chain = ns.chain(list(range(4 * 6)))
    store.put(chain.metas(0, 4), random_pages(layout, 4))
    store.tier("fast").delete([chain.keys[1]])  # only below now
    store.put([chain.meta(5)], random_pages(layout, 1), tier="fast")  # after a gap
    res = store.lookup(chain.keys)
    assert res.num_blocks == 4
    assert res.tiers == ("fast", "slow", "fast", "fast")


def test_lease_pins_until_release(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_back", top=4, bottom=4)
    chain = ns.chain(list(range(4 * 8)))
    store.put(chain.metas(0, 4), random_pages(layout, 4))
    res = store.lookup(chain.keys[:2], lease=True)
    assert res.lease is not None and store.is_pinned(chain.keys[0])
    store.put(chain.metas(4, 8), random_pages(layout, 4, seed=1))
    # the two leased pages survived; the unleased ones were evicted
    assert store.tier("fast").contains(chain.keys[:4]) == [True, True, False, False]
    out = np.zeros((2, layout.page_bytes), np.uint8)
    assert store.get(ns.id, chain.keys[:2], out, lease=res.lease).num_leading == 2
    assert not store.is_pinned(chain.keys[0])
    with pytest.raises(LeaseError):
        store.release(res.lease)
    store.check_integrity()


def test_release_unpins_only_what_no_other_lease_pins(layout: KVLayout, ns: Namespace) -> None:
    # overlapping leases, and a lookup that names a key twice: a release takes away only its
    # own pins (one per occurrence), whatever the other leases still hold stays pinned
    store = two_tier(layout, "write_back", top=4, bottom=4)
    chain = ns.chain(list(range(4 * 8)))
    store.put(chain.metas(0, 4), random_pages(layout, 4))
    k = chain.keys
    wide = store.lookup(k[:4], lease=True).lease
    narrow = store.lookup(k[:2], lease=True).lease
    assert wide is not None and narrow is not None
    store.release(wide)
    assert [store.is_pinned(x) for x in k[:4]] == [True, True, False, False]
    store.check_integrity()
    store.release(narrow)
    assert not any(store.is_pinned(x) for x in k[:4])
    twice = store.lookup(k[:2], lease=True).lease
    assert twice is not None
    # the table as the store drives it, given a lease that names a key twice
    table = LeaseTable(30.0, time.monotonic, Metrics())
    a, b = table.grant([k[0], k[1], k[0]]), table.grant([k[0]])
    assert table.pins == {k[0]: 3, k[1]: 1}
    table.release(a)
    assert table.pins == {k[0]: 1}
    table.check()
    table.release(b)
    assert not table.pins
    store.release(twice)
    store.check_integrity()


def test_lease_expiry(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_back", top=2, lease_ttl_s=0.05)
    chain = ns.chain(list(range(16)))
    store.put(chain.metas(0, 2), random_pages(layout, 2))
    res = store.lookup(chain.keys, lease=True)
    assert store.is_pinned(chain.keys[0])
    time.sleep(0.08)
    assert not store.is_pinned(chain.keys[0])
    store.put(chain.metas(2, 4), random_pages(layout, 2))
    assert store.tier("fast").contains(chain.keys[:2]) == [False, False]
    with pytest.raises(LeaseError, match="expired"):
        store.release(res.lease)
    assert store.stats().active_leases == 0


def test_all_pinned_means_refused_not_evicted(layout: KVLayout, ns: Namespace) -> None:
    m = Metrics()
    store = TieredStore(layout, [HostTier.build("only", layout, 2, m)], ["lru"])
    chain = ns.chain(list(range(16)))
    store.put(chain.metas(0, 2), random_pages(layout, 2))
    store.lookup(chain.keys, lease=True)
    res = store.put(chain.metas(2, 4), random_pages(layout, 2))
    assert (res.stored, res.refused) == (0, 2)
    assert store.lookup(chain.keys).num_blocks == 2


def test_prefetch_moves_pages_up(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_back", top=4, promote_on_hit=False)
    chain = ns.chain(list(range(4 * 6)))
    pages = random_pages(layout, 6)
    store.put(chain.metas(), pages, tier="slow")
    assert store.lookup(chain.keys).tiers == ("slow",) * 6
    fut = store.prefetch(ns.id, chain.keys[:3], to="fast")
    assert fut.result(timeout=10) == 3
    assert store.lookup(chain.keys).tiers[:3] == ("fast",) * 3
    out, tiers = read_all(store, ns, chain.keys[:3])
    assert np.array_equal(out, pages[:3]) and tiers == ("fast",) * 3


def test_other_namespace_never_served(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_through")
    chain = ns.chain(list(range(8)))
    store.put(chain.metas(), random_pages(layout, 2))
    other = Namespace("test-model", layout, "tenant-b")
    out = np.zeros((2, layout.page_bytes), np.uint8)
    assert store.get(other.id, chain.keys, out).num_found == 0
    # and the other tenant's own keys for the same tokens miss in lookup
    assert store.lookup(other.chain(list(range(8))).keys).num_blocks == 0


def test_torch_pages(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_back")
    chain = ns.chain(list(range(8)))
    pages = torch.randn(2, *layout.page_shape).to(torch.float16)
    store.put(chain.metas(), pages)
    out = torch.zeros_like(pages)
    assert store.get(ns.id, chain.keys, out).num_found == 2
    assert torch.equal(out, pages)


def test_delete_everywhere(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_through")
    chain = ns.chain(list(range(8)))
    store.put(chain.metas(), random_pages(layout, 2))
    assert store.delete(chain.keys) == 4
    assert store.lookup(chain.keys).num_blocks == 0
    store.check_integrity()


# --------------------------------------------------------------------- bad input


def _snapshot(store: TieredStore) -> tuple:
    return tuple(tuple(sorted(t.keys())) for t in store.tiers), tuple(len(p) for p in store.policies)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda s, c, L: s.put(c.metas(), np.zeros((2, L.page_bytes + 2), np.uint8)), "shape|dtype"),
        (lambda s, c, L: s.put(c.metas(), torch.zeros(2, *L.page_shape)), "dtype"),
        (lambda s, c, L: s.put(c.metas(), torch.zeros(2, 1, *L.page_shape[1:], dtype=torch.float16)), "shape"),
        (lambda s, c, L: s.put(c.metas(), np.zeros((3, L.page_bytes), np.uint8)), "batch of 3"),
        (lambda s, c, L: s.put(c.keys, np.zeros((2, L.page_bytes), np.uint8)), "BlockMeta"),
        (lambda s, c, L: s.put(c.metas(), np.zeros((2, L.page_bytes), np.uint8), tier="nvme"), "no tier named"),
        (lambda s, c, L: s.lookup([b"short"]), "16-byte"),
        (lambda s, c, L: s.lookup(c.keys[0]), "sequence"),
        (lambda s, c, L: s.get(b"x", c.keys, np.zeros((2, L.page_bytes), np.uint8)), "namespace"),
        (lambda s, c, L: s.get(c.namespace.id, c.keys, np.zeros((1, L.page_bytes), np.uint8)), "batch of 1"),
    ],
)
def test_bad_input_changes_nothing(layout: KVLayout, ns: Namespace, call, match: str) -> None:
    store = two_tier(layout, "write_through")
    seed = ns.chain(list(range(100, 108)))
    store.put(seed.metas(), random_pages(layout, 2))
    before = _snapshot(store)
    with pytest.raises(InvalidArgument, match=match):
        call(store, ns.chain(list(range(8))), layout)
    assert _snapshot(store) == before
    store.check_integrity()


def test_forged_identity_rejected(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_back")
    meta = ns.chain(list(range(8))).meta(1)
    forged = type(meta)(meta.namespace_id, meta.key, meta.parent, bytes(16))
    with pytest.raises(InvalidArgument, match="does not hash"):
        store.put([forged], random_pages(layout, 1))
    assert store.tier("fast").used_pages == 0


def test_bad_construction(layout: KVLayout) -> None:
    m = Metrics()
    with pytest.raises(UnknownComponent, match="known policies"):
        TieredStore(layout, [HostTier.build("a", layout, 2, m)], ["mru"])
    with pytest.raises(InvalidArgument, match="write policy"):
        TieredStore(layout, [HostTier.build("b", layout, 2, m)], write_policy="write_around")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unique"):
        TieredStore(layout, [HostTier.build("c", layout, 2, m), HostTier.build("c", layout, 2, Metrics())])
    with pytest.raises(InvalidArgument, match="another layout"):
        TieredStore(layout, [HostTier.build("d", KVLayout(1, 1, 1, 1, "float16"), 2, m)])
    with pytest.raises(InvalidArgument, match="at least one page"):
        HostTier.build("e", layout, 0, m)


def _blocking_write(monkeypatch: pytest.MonkeyPatch, tier: HostTier):  # type: ignore[no-untyped-def]
    """Make ``tier``'s writes wait for ``gate``; ``entered`` is set once one is waiting."""
    import threading

    entered, gate = threading.Event(), threading.Event()
    real = tier._write

    def write(metas, pages):  # type: ignore[no-untyped-def]
        entered.set()
        assert gate.wait(10)
        return real(metas, pages)

    monkeypatch.setattr(tier, "_write", write)
    return entered, gate


def test_write_back_runs_outside_the_store_lock(layout: KVLayout, ns: Namespace,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A put that makes room writes its victims back to the slower tier without holding the
    store lock: another thread's leased lookup and get complete while that write is stuck."""
    import threading

    store = two_tier(layout, "write_back", top=4)
    chain = ns.chain(list(range(4 * 6)))
    pages = random_pages(layout, 6)
    store.put(chain.metas(0, 4), pages[:4])
    entered, gate = _blocking_write(monkeypatch, store.tier("slow"))  # type: ignore[arg-type]
    writer = threading.Thread(target=store.put, args=(chain.metas(4, 6), pages[4:]))
    writer.start()
    assert entered.wait(5)  # the write-back of blocks 0 and 1 is in progress
    got: list[object] = []

    def reader() -> None:
        res = store.lookup(chain.keys[2:4], lease=True)
        out = np.zeros((2, layout.page_bytes), np.uint8)
        got.append((res.num_blocks, store.get(ns.id, chain.keys[2:4], out, lease=res.lease), out))

    r = threading.Thread(target=reader)
    r.start()
    r.join(5)
    finished = not r.is_alive()
    gate.set()
    writer.join(10)
    r.join(10)
    assert finished, "a lookup waited for another thread's write-back"
    n, res, out = got[0]  # type: ignore[misc]
    assert n == 2 and all(res.found) and np.array_equal(out, pages[2:4])
    assert store.tier("slow").contains(chain.keys[:2]) == [True, True]
    store.check_integrity()


def test_victim_leased_during_write_back_is_kept(layout: KVLayout, ns: Namespace,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    store = two_tier(layout, "write_back", top=4)
    chain = ns.chain(list(range(4 * 5)))
    pages = random_pages(layout, 5)
    store.put(chain.metas(0, 4), pages[:4])
    entered, gate = _blocking_write(monkeypatch, store.tier("slow"))  # type: ignore[arg-type]
    writer = threading.Thread(target=store.put, args=(chain.metas(4, 5), pages[4:]))
    writer.start()
    assert entered.wait(5)  # block 0 (LRU) is being written back
    lease = store.lookup(chain.keys[:1], lease=True).lease  # an engine leases it meanwhile
    gate.set()
    writer.join(10)
    fast = store.tier("fast")
    assert fast.contains(chain.keys[:1]) == [True]  # spared: still where the lease found it
    out, tiers = read_all(store, ns, chain.keys[:1])
    assert np.array_equal(out, pages[:1]) and tiers == ("fast",)
    assert lease is not None
    store.release(lease)
    store.check_integrity()


def test_narrow_unpins_the_tail_of_a_lease(layout: KVLayout, ns: Namespace) -> None:
    store = two_tier(layout, "write_back", top=4)
    chain = ns.chain(list(range(4 * 4)))
    store.put(chain.metas(), random_pages(layout, 4))
    lease = store.lookup(chain.keys, lease=True).lease
    assert lease is not None and all(store.is_pinned(k) for k in chain.keys)
    narrowed = store.narrow(lease, 1)
    assert narrowed.id == lease.id and narrowed.keys == tuple(chain.keys[:1])
    assert [store.is_pinned(k) for k in chain.keys] == [True, False, False, False]
    assert store.evict(4, tier="fast") == 3  # the unpinned tail can go now
    with pytest.raises(InvalidArgument, match="n must be"):
        store.narrow(narrowed, 2)
    store.release(narrowed)
    assert not store.is_pinned(chain.keys[0])
    with pytest.raises(LeaseError):
        store.narrow(narrowed, 0)
    store.check_integrity()


class _RacingHost(HostTier):
    """A host tier whose next presence count removes one of the pages it just counted through
    the store (a delete, or an eviction of the policy's victim), as a concurrent caller would
    between a lookup's count and its lease."""

    store: TieredStore | None = None
    victim: bytes | None = None  # deleted; or, with evict, the page the policy evicts

    def _count_leading(self, keys):  # noqa: ANN001, ANN202
        n = super()._count_leading(keys)
        if self.store is not None and self.victim is not None:
            victim, self.victim = self.victim, None
            if self.evict:
                assert self.store.evict(1) == 1
            else:
                self.store.delete([victim])
        return n

    evict = False


@pytest.mark.parametrize("evict", [False, True], ids=["delete", "evict"])
def test_a_page_gone_between_count_and_lease_ends_the_leased_run(layout: KVLayout, ns: Namespace,
                                                                  evict: bool) -> None:
    tier = _RacingHost.build("host", layout, 16, Metrics())
    store = TieredStore(layout, [tier], ["lru"])
    chain = ns.chain(list(range(layout.block_size * 8)))
    store.put(chain.metas(), random_pages(layout, 8))
    gone = 5 if not evict else 0  # an eviction takes the least recently stored page: keys[0]
    tier.store, tier.victim, tier.evict = store, chain.keys[gone], evict
    res = store.lookup(chain.keys, lease=True)
    assert res.num_blocks == gone and len(res.tiers) == gone
    if gone:
        assert res.lease is not None and len(res.lease.keys) == gone
        store.release(res.lease)
    assert not any(store.is_pinned(k) for k in chain.keys)
    assert not tier.contains([chain.keys[gone]])[0]
    store.check_integrity()


def test_a_completed_staging_load_makes_its_pages_the_most_recently_used(
        layout: KVLayout, ns: Namespace) -> None:
    """The policy counts a staging load's pages as read when the load completes (not before its
    copies: prepare_load stands between a hit and its first copy); LRU then evicts the pages
    nobody loaded first."""
    store = two_tier(layout, "write_back", top=4)
    chain = ns.chain(list(range(16 * 5)))
    store.put(chain.metas(0, 4), random_pages(layout, 4), tier="fast")
    handle = store.prepare_load(ns.id, chain.keys[:2], tier="fast")  # the two oldest
    assert handle.num_blocks == 2
    assert store.complete_load(handle) == 2
    store.put(chain.metas(4, 5), random_pages(layout, 1), tier="fast")  # one must go
    held = store.tier("fast").contains(chain.keys[:5])
    assert held == [True, True, False, True, True]
    store.close()
